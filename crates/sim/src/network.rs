//! A simulated network: delays (and so reordering), loss, duplication, and partitions that can be
//! symmetric or one-way. Delivery order is a pure function of the seed.
//!
//! A snapshot travels as the real transport sends it: a stream of chunks, each of which takes
//! its own delay and may be lost (a broken connection), so a transfer can be cut at any chunk.
//! The receiver keeps what arrived of an image, and a later transfer of the same image resumes
//! from there, as the transport's resumable streams do (a newer image starts over). The sender
//! hears how the transfer ended when it ends: early for a cut one, after the last chunk for a
//! delivered one.

use std::collections::{BTreeMap, BTreeSet};

use cairn_raft::{Message, MessageBody, NodeId, SnapshotStatus};

use crate::rng::Rng;

/// Something the network hands to a node at a given time.
#[derive(Debug)]
pub enum NetEvent {
    Deliver(Message),
    /// The sender's transport learns how a snapshot transfer ended, as a real stream would.
    SnapshotReport {
        leader: NodeId,
        to: NodeId,
        status: SnapshotStatus,
    },
}

#[derive(Debug, Clone, Copy)]
pub struct Faults {
    pub drop: f64,
    pub duplicate: f64,
    pub max_delay: u64,
}

/// Bytes per snapshot chunk. Far below the transport's 1 MiB, so that the small images of a
/// simulated store still travel as many chunks and a cut can fall at any of them.
pub const SNAPSHOT_CHUNK: usize = 512;

/// Which image a partial transfer holds: sender, receiver, and the snapshot's index and term.
type ImageKey = (NodeId, NodeId, u64, u64);

#[derive(Debug)]
pub struct Network {
    /// (deliver_at, sequence) orders events; the sequence breaks ties deterministically.
    queue: BTreeMap<(u64, u64), NetEvent>,
    seq: u64,
    /// Directed links that drop everything: (from, to).
    cut: BTreeSet<(NodeId, NodeId)>,
    pub faults: Faults,
    pub sent: u64,
    pub dropped: u64,
    /// Chunks of each image that reached its receiver, for a transfer that was cut.
    partial: BTreeMap<ImageKey, usize>,
    /// Snapshot transfers cut partway, and transfers that resumed from a cut one's chunks.
    pub snapshots_cut: u64,
    pub snapshots_resumed: u64,
}

impl Network {
    pub fn new(faults: Faults) -> Network {
        Network {
            queue: BTreeMap::new(),
            seq: 0,
            cut: BTreeSet::new(),
            faults,
            sent: 0,
            dropped: 0,
            partial: BTreeMap::new(),
            snapshots_cut: 0,
            snapshots_resumed: 0,
        }
    }

    fn push(&mut self, at: u64, ev: NetEvent) {
        self.seq += 1;
        self.queue.insert((at, self.seq), ev);
    }

    pub fn send(&mut self, msg: Message, now: u64, rng: &mut Rng) {
        self.sent += 1;
        if let MessageBody::Snapshot { snapshot } = &msg.body {
            let len = snapshot.data.len();
            let key = (msg.from, msg.to, snapshot.meta.index.0, snapshot.meta.term.0);
            return self.stream_snapshot(msg, key, len, now, rng);
        }
        let delay = rng.between(1, self.faults.max_delay);
        let lost = self.cut.contains(&(msg.from, msg.to)) || rng.chance(self.faults.drop);
        if lost {
            self.dropped += 1;
            return;
        }
        // A forwarded proposal delivered twice would be appended and applied twice: Raft does
        // not deduplicate proposals (nor does etcd), so a transport must never resend one. Real
        // ones do not (TCP streams deliver at most once); every other message may come twice.
        let proposal = matches!(msg.body, MessageBody::Propose { .. });
        if !proposal && rng.chance(self.faults.duplicate) {
            let again = rng.between(1, self.faults.max_delay);
            self.push(now + again, NetEvent::Deliver(msg.clone()));
        }
        self.push(now + delay, NetEvent::Deliver(msg));
    }

    /// Sends a snapshot as a stream of chunks from what the receiver already holds of the same
    /// image. Each chunk is cut with the loss rate (and all of them by a partition in place at
    /// the start); a cut leaves the chunks before it with the receiver and tells the sender the
    /// transfer failed. The last chunk delivers the message (possibly twice, as any message).
    fn stream_snapshot(
        &mut self,
        msg: Message,
        key: ImageKey,
        len: usize,
        now: u64,
        rng: &mut Rng,
    ) {
        let chunks = len.div_ceil(SNAPSHOT_CHUNK).max(1);
        let held = self.partial.remove(&key).unwrap_or(0).min(chunks - 1);
        if held > 0 {
            self.snapshots_resumed += 1;
        }
        let partitioned = self.cut.contains(&(msg.from, msg.to));
        // Chunks are pipelined on one connection: the first crosses the network's delay, each
        // later one follows a unit or two behind it.
        let mut at = now + rng.between(1, self.faults.max_delay);
        for chunk in held..chunks {
            if chunk > held {
                at += rng.between(1, 2);
            }
            if partitioned || rng.chance(self.faults.drop) {
                self.dropped += 1;
                self.snapshots_cut += 1;
                if chunk > 0 {
                    self.partial.insert(key, chunk);
                }
                let status = SnapshotStatus::Failed;
                self.push(at, NetEvent::SnapshotReport { leader: msg.from, to: msg.to, status });
                return;
            }
        }
        let status = SnapshotStatus::Finished;
        self.push(at, NetEvent::SnapshotReport { leader: msg.from, to: msg.to, status });
        if rng.chance(self.faults.duplicate) {
            let again = rng.between(1, self.faults.max_delay);
            self.push(at + again, NetEvent::Deliver(msg.clone()));
        }
        self.push(at, NetEvent::Deliver(msg));
    }

    /// Removes and returns the next event due at or before `now`.
    pub fn pop_due(&mut self, now: u64) -> Option<NetEvent> {
        let (&key, _) = self.queue.first_key_value()?;
        if key.0 > now {
            return None;
        }
        self.queue.remove(&key)
    }

    pub fn cut_link(&mut self, from: NodeId, to: NodeId) {
        self.cut.insert((from, to));
    }

    pub fn isolate(&mut self, id: NodeId, all: &[NodeId]) {
        for &other in all {
            if other != id {
                self.cut.insert((id, other));
                self.cut.insert((other, id));
            }
        }
    }

    pub fn heal(&mut self) {
        self.cut.clear();
    }

    pub fn is_partitioned(&self) -> bool {
        !self.cut.is_empty()
    }
}
