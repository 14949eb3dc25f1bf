//! File descriptors: clients must never be able to stop the log.
//!
//! Every client connection holds a descriptor, and so do the WAL's segments, the database, the
//! peer connections and snapshot transfers. With the soft limit at a common default of 1,024 and
//! no cap on clients, a thousand idle connections left the WAL unable to open its next segment,
//! and the member stopped (fail-stop). So at start the soft limit is raised to the hard limit
//! (Go's runtime, and so etcd, does the same), and client connections are capped below what is
//! left after [`RESERVE`] descriptors kept for everything else; a connection past the cap is
//! closed as soon as it is accepted.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::process::{getrlimit, setrlimit, Resource};

/// Descriptors kept from clients: for WAL segments and the directory syncs around them, the
/// database, peer connections (outbound, a few per peer; inbound, at most
/// `cairn_transport::MAX_INBOUND_CONNS`, which the transport enforces) and snapshot transfers.
pub(crate) const RESERVE: usize = 128;
/// Fewer client connections than this and the member is not worth starting: the limit is
/// too low, and saying so at start beats refusing clients later.
const MIN_CLIENTS: usize = 16;
/// How often a refused connection is logged at most.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Raises the soft limit on open files to the hard limit; returns the soft limit in force
/// afterwards (`None`: unlimited).
pub(crate) fn raise_nofile() -> Option<u64> {
    let limit = getrlimit(Resource::Nofile);
    if let (Some(soft), Some(hard)) = (limit.current, limit.maximum) {
        if soft < hard {
            let raised = rustix::process::Rlimit { current: Some(hard), maximum: Some(hard) };
            match setrlimit(Resource::Nofile, raised) {
                Ok(()) => return Some(hard),
                Err(e) => tracing::warn!("raising the open-file limit from {soft} to {hard}: {e}"),
            }
        }
    }
    limit.current
}

/// Descriptors this process has open, where the OS says (Linux: `/proc/self/fd`).
pub(crate) fn open_fds() -> Option<usize> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count())
}

/// How many client connections may be open at once: `flag` (0: no cap of its own), but never
/// more than the descriptors left under `soft` once `open` are in use and [`RESERVE`] are kept.
pub(crate) fn client_budget(flag: usize, soft: Option<u64>, open: usize) -> Result<usize, String> {
    let flag = if flag == 0 { usize::MAX } else { flag };
    let Some(soft) = soft else { return Ok(flag) };
    let soft = usize::try_from(soft).unwrap_or(usize::MAX);
    let left = soft.saturating_sub(open).saturating_sub(RESERVE);
    if left < MIN_CLIENTS.min(flag) {
        return Err(format!(
            "the open-file limit ({soft}) leaves {left} client connections once {open} descriptors are open and {RESERVE} kept for the WAL, database and peers; raise it (ulimit -n, or LimitNOFILE= under systemd)"
        ));
    }
    Ok(flag.min(left))
}

/// The cap on open client connections, shared by every client listener.
#[derive(Debug)]
pub(crate) struct ConnLimit {
    open: AtomicUsize,
    max: usize,
    warned: Mutex<Option<Instant>>,
}

/// One admitted connection; dropping it frees its place.
#[derive(Debug)]
pub(crate) struct Admitted(Arc<ConnLimit>);

impl ConnLimit {
    pub(crate) fn new(max: usize) -> Arc<ConnLimit> {
        Arc::new(ConnLimit { open: AtomicUsize::new(0), max, warned: Mutex::new(None) })
    }

    /// The cap for `flag` (see [`client_budget`]), counting the descriptors open now as the
    /// ones everything but the clients needs.
    pub(crate) fn for_clients(flag: usize, soft: Option<u64>) -> Result<Arc<ConnLimit>, String> {
        let open = open_fds().unwrap_or(RESERVE);
        let max = client_budget(flag, soft, open)?;
        // The flag's default is often more than the limit allows: said, not warned about.
        let soft = soft.map_or("unlimited".to_string(), |s| s.to_string());
        tracing::info!(
            "serving at most {max} client connections (--max-client-conns {flag}, open-file limit {soft}, {open} descriptors open, {RESERVE} kept for the WAL, database and peers)"
        );
        Ok(ConnLimit::new(max))
    }

    /// Takes a place for a new connection, or logs (now and then) that there is none.
    pub(crate) fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let taken = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max).then_some(n + 1));
        if taken.is_ok() {
            return Some(Admitted(self.clone()));
        }
        let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
        if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            *warned = Some(Instant::now());
            tracing::warn!(
                "refusing client connections: {} are open, the most allowed (--max-client-conns, and the open-file limit less {RESERVE} kept for the WAL, database and peers)",
                self.max
            );
        }
        None
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_keeps_the_reserve_and_honours_the_flag() {
        assert_eq!(client_budget(0, Some(1024), 24), Ok(1024 - 24 - RESERVE));
        assert_eq!(client_budget(100, Some(1024), 24), Ok(100));
        assert_eq!(client_budget(5000, Some(1024), 24), Ok(1024 - 24 - RESERVE));
        assert_eq!(client_budget(0, None, 24), Ok(usize::MAX));
        let e = client_budget(0, Some(150), 24).expect_err("too low to serve");
        assert!(e.contains("ulimit -n"), "{e}");
        // A deliberately small cap is the operator's choice, not a reason to refuse to start.
        assert_eq!(client_budget(4, Some(160), 24), Ok(4));
    }

    #[test]
    fn a_connection_past_the_cap_is_refused_until_one_closes() {
        let limit = ConnLimit::new(2);
        let a = limit.admit().expect("first");
        let _b = limit.admit().expect("second");
        assert!(limit.admit().is_none());
        drop(a);
        assert!(limit.admit().is_some());
    }
}
