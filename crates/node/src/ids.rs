//! Request ids: how a member recognises its own requests among the entries every member applies.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Identifies one request across every member of a cluster and every lifetime of a member.
/// A replicated entry carries the id of the request that proposed it, so the member that waits
/// for it can answer its caller when the entry is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Bits of the id that count requests; the bits above hold the member's.
const COUNTER_BITS: u32 = 48;
const COUNTER_MASK: u64 = (1 << COUNTER_BITS) - 1;

/// Hands out request ids as etcd's `idutil` does: the low 16 bits of the member id on top, so
/// members of one cluster draw from different ranges; below them a counter that starts at the
/// time the generator was made (in microseconds), so a restarted member does not reuse the ids
/// of its previous life, whose entries may still commit after it comes back. A restart reuses
/// an id only if the previous life issued more than a million requests per second on average.
///
/// Two members whose ids agree in their low 16 bits could still collide; the replica therefore
/// also compares the entry with the proposal it remembers before answering (see
/// `Replica::handle_propose`).
#[derive(Debug)]
pub struct RequestIds {
    prefix: u64,
    next: AtomicU64,
}

impl RequestIds {
    /// The ids of one member's life, starting from the clock so a restart does not reuse them.
    pub fn new(member: u64, now_micros: u64) -> RequestIds {
        RequestIds { prefix: (member & 0xffff) << COUNTER_BITS, next: AtomicU64::new(now_micros) }
    }

    /// A fresh id.
    pub fn next_id(&self) -> RequestId {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        RequestId(self.prefix | (n & COUNTER_MASK))
    }
}

impl RequestId {
    /// The id as the opaque context of a read request.
    pub(crate) fn to_ctx(self) -> cairn_raft::ReadCtx {
        cairn_raft::ReadCtx(bytes::Bytes::copy_from_slice(&self.0.to_be_bytes()))
    }

    /// The id back from a read context; `None` for a context this member did not make.
    pub(crate) fn from_ctx(ctx: &cairn_raft::ReadCtx) -> Option<RequestId> {
        let raw: [u8; 8] = ctx.0.as_ref().try_into().ok()?;
        Some(RequestId(u64::from_be_bytes(raw)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_draw_from_different_ranges_and_restarts_move_on() {
        let a = RequestIds::new(0x1234_0001, 1_000_000);
        let b = RequestIds::new(0x5678_0002, 1_000_000);
        let (x, y) = (a.next_id(), b.next_id());
        assert_ne!(x, y);
        assert_eq!(x.0 >> COUNTER_BITS, 0x0001);
        assert_eq!(y.0 >> COUNTER_BITS, 0x0002);
        assert_eq!(a.next_id().0, x.0 + 1);
        // The same member a second later: a fresh range.
        let again = RequestIds::new(0x1234_0001, 2_000_000);
        assert!(again.next_id().0 >= x.0 + 1_000_000);
    }

    #[test]
    fn read_contexts_round_trip() {
        let id = RequestId(0xdead_beef_0000_0001);
        assert_eq!(RequestId::from_ctx(&id.to_ctx()), Some(id));
        assert_eq!(
            RequestId::from_ctx(&cairn_raft::ReadCtx(bytes::Bytes::from_static(b"x"))),
            None
        );
    }
}
