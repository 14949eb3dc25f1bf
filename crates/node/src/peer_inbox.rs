//! The bound on peer messages waiting for the driver.
//!
//! The transport hands the messages it receives on TLS connections to the driver's input queue
//! (plain connections the driver reads itself, `cairn_transport::poll`, and what it has not read
//! waits in the socket), and the driver takes them a turn at a time. A driver that falls behind
//! (a slow disk under a leader's appends, a stalled member) would let that queue grow without
//! limit. Past [`MAX_MESSAGES`] messages or
//! [`MAX_BYTES`] bytes of entries waiting, a new message is dropped instead, as etcd drops a
//! peer's message when its receive buffer is full: Raft recovers from lost messages (the leader
//! probes and resends), so dropping costs a retry, never correctness. Local reports (a snapshot
//! sent, a peer unreachable) are few and always kept.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cairn_raft::{Message, MessageBody};

/// Messages waiting at most (etcd's receive buffer holds 4,096).
pub(crate) const MAX_MESSAGES: usize = 4096;
/// Bytes of entries waiting at most.
pub(crate) const MAX_BYTES: u64 = 128 << 20;
/// What a message costs beyond its entries.
const MESSAGE_OVERHEAD: u64 = 64;
/// How often dropping is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// A message's cost against [`MAX_BYTES`]: its entries, as the core counts them, plus a little.
pub(crate) fn cost(msg: &Message) -> u64 {
    let entries = match &msg.body {
        MessageBody::Append { entries, .. } => entries.iter().map(|e| e.size_bytes()).sum(),
        _ => 0,
    };
    entries + MESSAGE_OVERHEAD
}

/// Counts what waits; the transport's side admits, the driver's side takes.
#[derive(Debug, Default)]
pub(crate) struct PeerInbox {
    messages: AtomicUsize,
    bytes: AtomicU64,
    dropped: AtomicU64,
    logged: Mutex<Option<Instant>>,
}

impl PeerInbox {
    /// Whether a message of `cost` bytes may be queued; if so it is counted as waiting.
    pub(crate) fn admit(&self, cost: u64) -> bool {
        let room = self
            .messages
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_MESSAGES).then_some(n + 1)
            })
            .is_ok();
        if room {
            let before = self.bytes.fetch_add(cost, Ordering::AcqRel);
            // One message alone may exceed the byte bound (a large append): admitted when
            // nothing else waits, so it is never refused forever.
            if before == 0 || before + cost <= MAX_BYTES {
                return true;
            }
            self.taken(cost);
        }
        self.dropped(cost);
        false
    }

    /// The driver took a message of `cost` bytes off the queue.
    pub(crate) fn taken(&self, cost: u64) {
        self.messages.fetch_sub(1, Ordering::AcqRel);
        self.bytes.fetch_sub(cost, Ordering::AcqRel);
    }

    fn dropped(&self, cost: u64) {
        let total = self.dropped.fetch_add(1, Ordering::AcqRel) + 1;
        let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        if logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
            *logged = Some(Instant::now());
            tracing::warn!(
                total,
                "dropped a peer's Raft message of {cost} bytes: {} messages or {} bytes already wait for the Raft thread (it is behind; the sender will retry)",
                MAX_MESSAGES,
                MAX_BYTES
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_raft::{Entry, EntryPayload, LogIndex, NodeId, Term};

    #[test]
    fn messages_past_the_bound_are_dropped_until_the_driver_takes_some() {
        let inbox = PeerInbox::default();
        for _ in 0..MAX_MESSAGES {
            assert!(inbox.admit(100));
        }
        assert!(!inbox.admit(100), "one past the message bound");
        assert_eq!(inbox.dropped.load(Ordering::Acquire), 1);
        inbox.taken(100);
        assert!(inbox.admit(100), "room again once the driver took one");
    }

    #[test]
    fn bytes_past_the_bound_are_dropped_but_one_large_message_alone_passes() {
        let inbox = PeerInbox::default();
        assert!(inbox.admit(MAX_BYTES * 2), "alone, a message larger than the bound");
        assert!(!inbox.admit(10), "nothing more while it waits");
        inbox.taken(MAX_BYTES * 2);
        assert!(inbox.admit(MAX_BYTES / 2));
        assert!(inbox.admit(MAX_BYTES / 2));
        assert!(!inbox.admit(MAX_BYTES / 2), "past the byte bound");
        assert_eq!(inbox.dropped.load(Ordering::Acquire), 2);
        // A refused message leaves the counts as they were.
        inbox.taken(MAX_BYTES / 2);
        inbox.taken(MAX_BYTES / 2);
        assert!(inbox.admit(MAX_BYTES));
    }

    #[test]
    fn an_append_costs_its_entries() {
        let entry = Entry {
            index: LogIndex(1),
            term: Term(1),
            payload: EntryPayload::Normal(vec![0; 1000].into()),
        };
        let append = Message {
            from: NodeId(1),
            to: NodeId(2),
            term: Term(1),
            body: MessageBody::Append {
                prev_index: LogIndex(0),
                prev_term: Term(0),
                entries: vec![entry.clone(), entry.clone()],
                commit: LogIndex(0),
            },
        };
        assert_eq!(cost(&append), 2 * entry.size_bytes() + MESSAGE_OVERHEAD);
    }
}
