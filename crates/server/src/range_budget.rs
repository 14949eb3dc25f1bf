//! A bound on the memory that Range responses in flight take (`--max-range-bytes-in-flight`).
//!
//! etcd builds every Range response whole and has no bound: four clients reading 100,000 keys
//! each at once hold four copies, and more clients hold more, until the process is killed. Here
//! a large range is planned before its values are read (`Engine::range_plan` says how many bytes
//! the answer takes), and it is read only once those bytes are admitted against the budget. The
//! bytes stay charged until the response has been handed to the connection: the charge rides
//! with the encoded answer (large_response.rs) into the response body, which the connection
//! drops when it has sent the last byte (or the client went away).
//!
//! Ranges wait for budget in order of arrival (a FIFO semaphore), so a large one is not starved
//! by small ones; a range larger than the whole budget fails at once, and one that waits past
//! [`MAX_WAIT`] fails too, both with `ResourceExhausted` and a message that names the flag.
//! Small ranges (read whole while planned: at most 1,000 keys and 1 MiB) are not charged: they
//! are bounded by the streams a connection may open, and a read of one key never waits behind
//! a large range.
//!
//! The budget counts keys, values and protobuf framing (what the client receives). The memory a
//! response takes while it is built and encoded is about three times that at its peak (the
//! read values, their protobuf copies, the encoded message); the budget bounds it all the same.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

/// The longest a range waits for budget before it fails.
pub const MAX_WAIT: Duration = Duration::from_secs(10);

/// The budget is kept in units of this many bytes (a semaphore counts permits in u32s).
pub(crate) const UNIT: u64 = 1024;

/// The default budget: an eighth of the memory this process may use (the cgroup's limit, if
/// lower than the machine's memory), between 64 MiB and 4 GiB.
pub fn default_bytes() -> u64 {
    let total = memory_limit().unwrap_or(8 << 30);
    (total / 8).clamp(64 << 20, 4 << 30)
}

/// The machine's memory, or the cgroup v2 limit if it is lower.
fn memory_limit() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let machine = kib * 1024;
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    Some(cgroup.map_or(machine, |c| c.min(machine)))
}

/// The bytes that large Range responses in flight may take in all.
#[derive(Clone, Debug)]
pub struct RangeBudget {
    units: Arc<Semaphore>,
    bytes: u64,
}

/// Bytes charged to the budget, returned when dropped.
#[derive(Clone, Debug)]
pub struct Charge(#[allow(dead_code)] Arc<OwnedSemaphorePermit>);

impl RangeBudget {
    /// A budget of `bytes` (at least one unit).
    pub fn new(bytes: u64) -> RangeBudget {
        let units = (bytes / UNIT).clamp(1, u64::from(u32::MAX));
        RangeBudget { units: Arc::new(Semaphore::new(units as usize)), bytes: units * UNIT }
    }

    /// Bytes not charged now.
    #[cfg(test)]
    pub fn available(&self) -> u64 {
        self.units.available_permits() as u64 * UNIT
    }

    /// Charges `bytes`, waiting up to `wait` for earlier charges to be returned.
    pub async fn charge(&self, bytes: u64, wait: Duration) -> Result<Charge, Status> {
        let units = bytes.div_ceil(UNIT).max(1);
        if units * UNIT > self.bytes {
            return Err(Status::resource_exhausted(format!(
                "cairn: the range response would take {bytes} bytes, more than \
                 --max-range-bytes-in-flight ({}): read it in pages (limit) or raise the flag",
                self.bytes
            )));
        }
        let acquire = self.units.clone().acquire_many_owned(units as u32);
        match tokio::time::timeout(wait, acquire).await {
            Ok(Ok(permit)) => Ok(Charge(Arc::new(permit))),
            Ok(Err(_closed)) => Err(Status::unavailable("cairn: the server is stopping")),
            Err(_elapsed) => Err(Status::resource_exhausted(format!(
                "cairn: range responses in flight held --max-range-bytes-in-flight ({} bytes) \
                 for {}s; try again",
                self.bytes,
                wait.as_secs()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_charge_larger_than_the_budget_fails_at_once_and_others_wait_their_turn() {
        let budget = RangeBudget::new(10 * UNIT);
        let too_big = budget.charge(11 * UNIT, MAX_WAIT).await.expect_err("larger than all");
        assert_eq!(too_big.code(), tonic::Code::ResourceExhausted);
        assert!(too_big.message().contains("--max-range-bytes-in-flight"), "{too_big:?}");

        let first = budget.charge(6 * UNIT, MAX_WAIT).await.expect("fits");
        assert_eq!(budget.available(), 4 * UNIT);
        let waited =
            budget.charge(6 * UNIT, Duration::from_millis(50)).await.expect_err("must wait");
        assert_eq!(waited.code(), tonic::Code::ResourceExhausted);
        assert!(waited.message().contains("try again"), "{waited:?}");
        drop(first);
        assert_eq!(budget.available(), 10 * UNIT, "a dropped charge is returned");
        let _second = budget.charge(6 * UNIT, MAX_WAIT).await.expect("fits once returned");
    }
}
