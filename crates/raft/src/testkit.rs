//! An in-memory driver and network for tests, benchmarks and the simulator.
//!
//! [`MemNode`] is the smallest correct driver of a [`Raft`]: it keeps "durable" state in memory
//! exactly as a real driver keeps it on disk, and applies committed entries to a log-shaped state
//! machine. [`Cluster`] wires several of them through an in-process network that tests can cut,
//! so that protocol scenarios read like scripts.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::{BufMut, Bytes, BytesMut};

use crate::{
    ConfState, Config, Entry, EntryPayload, HardState, LogIndex, Message, NodeId, Persisted, Raft,
    ReadState, Ready, Snapshot,
};

/// What a node has on its "disk": updated only when a `Ready` is persisted.
#[derive(Clone, Debug, Default)]
pub struct MemStorage {
    pub hard_state: HardState,
    pub snapshot: Snapshot,
    pub entries: Vec<Entry>,
}

impl MemStorage {
    /// Writes what a `Ready` asks to persist, in the documented order.
    pub fn persist(&mut self, rd: &Ready) {
        if let Some(snap) = &rd.snapshot {
            // A snapshot replaces the whole log: entries after it on disk may be from a
            // conflicting term, and the core cleared them too.
            self.snapshot = snap.clone();
            self.entries.clear();
        }
        if let Some(first) = rd.entries.first() {
            self.entries.retain(|e| e.index < first.index);
            self.entries.extend(rd.entries.iter().cloned());
        }
        if let Some(hs) = rd.hard_state {
            self.hard_state = hs;
        }
    }

    /// Records a compaction the core performed.
    pub fn compact(&mut self, snapshot: Snapshot) {
        self.entries.retain(|e| e.index > snapshot.meta.index);
        self.snapshot = snapshot;
    }

    pub fn to_persisted(&self) -> Persisted {
        Persisted {
            hard_state: self.hard_state,
            snapshot: self.snapshot.clone(),
            entries: self.entries.clone(),
        }
    }
}

impl From<Persisted> for MemStorage {
    fn from(p: Persisted) -> MemStorage {
        MemStorage { hard_state: p.hard_state, snapshot: p.snapshot, entries: p.entries }
    }
}

/// The application state: every non-empty normal entry applied, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppliedLog {
    /// Invariant: the index of the last applied entry (or installed snapshot).
    pub applied: LogIndex,
    pub data: Vec<Bytes>,
}

impl AppliedLog {
    /// Encodes the state as snapshot data.
    pub fn encode(&self) -> Bytes {
        let mut buf = BytesMut::new();
        buf.put_u64(self.applied.0);
        for d in &self.data {
            buf.put_u32(d.len() as u32);
            buf.put_slice(d);
        }
        buf.freeze()
    }

    /// Decodes snapshot data written by [`AppliedLog::encode`]; `None` if it is malformed.
    pub fn decode(mut raw: &[u8]) -> Option<AppliedLog> {
        let take = |raw: &mut &[u8], n: usize| -> Option<Vec<u8>> {
            if raw.len() < n {
                return None;
            }
            let (head, tail) = raw.split_at(n);
            *raw = tail;
            Some(head.to_vec())
        };
        let applied = u64::from_be_bytes(take(&mut raw, 8)?.try_into().ok()?);
        let mut data = Vec::new();
        while !raw.is_empty() {
            let len = u32::from_be_bytes(take(&mut raw, 4)?.try_into().ok()?) as usize;
            data.push(Bytes::from(take(&mut raw, len)?));
        }
        Some(AppliedLog { applied: LogIndex(applied), data })
    }

    /// Applies a snapshot, then committed entries, as a `Ready` asks.
    pub fn apply(&mut self, rd: &Ready) {
        if let Some(snap) = &rd.snapshot {
            if snap.meta.index > LogIndex::ZERO {
                *self = AppliedLog::decode(&snap.data).unwrap_or_default();
            }
            self.applied = snap.meta.index;
        }
        for e in &rd.committed_entries {
            assert_eq!(e.index, self.applied.next(), "applying out of order");
            self.applied = e.index;
            if let EntryPayload::Normal(d) = &e.payload {
                if !d.is_empty() {
                    self.data.push(d.clone());
                }
            }
        }
    }
}

/// A node with an in-memory disk and state machine.
#[derive(Debug)]
pub struct MemNode {
    pub raft: Raft,
    pub storage: MemStorage,
    pub state: AppliedLog,
    pub read_states: Vec<ReadState>,
    cfg: Config,
}

impl MemNode {
    pub fn new(cfg: Config, storage: MemStorage) -> MemNode {
        let raft = Raft::new(cfg.clone(), storage.to_persisted()).expect("valid test config");
        let mut state = AppliedLog::default();
        if storage.snapshot.meta.index > LogIndex::ZERO {
            state = AppliedLog::decode(&storage.snapshot.data).unwrap_or_default();
        }
        MemNode { raft, storage, state, read_states: Vec::new(), cfg }
    }

    /// A founding member of a cluster of `voters`.
    pub fn bootstrap(cfg: Config, voters: &[NodeId]) -> MemNode {
        let conf = ConfState::with_voters(voters.iter().copied());
        MemNode::new(cfg, MemStorage::from(Persisted::bootstrap(conf)))
    }

    /// Handles one `Ready` if there is one: persist, apply, advance. Returns its messages.
    pub fn handle_ready(&mut self) -> Option<Vec<Message>> {
        if !self.raft.has_ready() {
            return None;
        }
        let rd = self.raft.ready();
        self.storage.persist(&rd);
        self.state.apply(&rd);
        self.read_states.extend(rd.read_states.iter().cloned());
        let msgs = rd.messages_now.into_iter().chain(rd.messages_after_persist).collect();
        self.raft.advance();
        Some(msgs)
    }

    /// Compacts the log at the applied index, snapshotting the state machine.
    pub fn compact(&mut self) {
        let data = self.state.encode();
        if let Some(meta) = self.raft.compact(data.clone()) {
            self.storage.compact(Snapshot { meta, data });
        }
    }

    /// Loses everything not persisted and starts again from the storage.
    pub fn restart(&mut self) {
        *self = MemNode::new(self.cfg.clone(), self.storage.clone());
    }
}

/// Several nodes joined by a lossless in-process network that tests can cut.
#[derive(Debug)]
pub struct Cluster {
    pub nodes: BTreeMap<NodeId, MemNode>,
    /// Messages sent and not yet delivered, in send order.
    pub in_flight: VecDeque<Message>,
    /// Directed links that drop everything: (from, to).
    cut: BTreeSet<(NodeId, NodeId)>,
}

impl Cluster {
    /// A new cluster whose founding voters are `voters`, each configured by `cfg`.
    pub fn new(voters: &[u64], cfg: impl Fn(NodeId) -> Config) -> Cluster {
        let ids: Vec<NodeId> = voters.iter().map(|&v| NodeId(v)).collect();
        let nodes = ids.iter().map(|&id| (id, MemNode::bootstrap(cfg(id), &ids))).collect();
        let mut c = Cluster { nodes, in_flight: VecDeque::new(), cut: BTreeSet::new() };
        // Apply the founding configuration entry, so nodes know they are voters.
        c.stabilize();
        c
    }

    /// A node that joins later: empty disk, no configuration until the leader sends one.
    pub fn add_empty_node(&mut self, cfg: Config) {
        let id = cfg.id;
        self.nodes.insert(id, MemNode::new(cfg, MemStorage::default()));
    }

    pub fn node(&self, id: u64) -> &MemNode {
        &self.nodes[&NodeId(id)]
    }

    pub fn raft(&mut self, id: u64) -> &mut Raft {
        &mut self.node_mut(id).raft
    }

    pub fn node_mut(&mut self, id: u64) -> &mut MemNode {
        self.nodes.get_mut(&NodeId(id)).expect("no such node")
    }

    /// Cuts every link to and from `id`.
    pub fn isolate(&mut self, id: u64) {
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        for other in ids {
            self.cut.insert((NodeId(id), other));
            self.cut.insert((other, NodeId(id)));
        }
    }

    /// Cuts the link from `from` to `to` only.
    pub fn cut_one_way(&mut self, from: u64, to: u64) {
        self.cut.insert((NodeId(from), NodeId(to)));
    }

    pub fn heal(&mut self) {
        self.cut.clear();
    }

    /// Handles the Ready of one node, queueing its messages.
    pub fn process_ready(&mut self, id: NodeId) -> bool {
        let Some(node) = self.nodes.get_mut(&id) else {
            return false;
        };
        match node.handle_ready() {
            Some(msgs) => {
                self.in_flight.extend(msgs);
                true
            }
            None => false,
        }
    }

    /// Delivers every message now in flight (not those they cause). Returns how many arrived.
    pub fn deliver_all(&mut self) -> usize {
        let batch: Vec<Message> = self.in_flight.drain(..).collect();
        let mut delivered = 0;
        for m in batch {
            if self.cut.contains(&(m.from, m.to)) {
                continue;
            }
            if let Some(node) = self.nodes.get_mut(&m.to) {
                node.raft.step(m);
                delivered += 1;
            }
        }
        delivered
    }

    /// Runs Ready handling and delivery until nothing moves. Bounded: a livelock is a test
    /// failure, not a hang.
    pub fn stabilize(&mut self) {
        for _ in 0..10_000 {
            let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
            let mut moved = false;
            for id in ids {
                moved |= self.process_ready(id);
            }
            moved |= self.deliver_all() > 0;
            if !moved {
                return;
            }
        }
        panic!("cluster did not stabilize");
    }

    /// Ticks every node once.
    pub fn tick_all(&mut self) {
        for node in self.nodes.values_mut() {
            node.raft.tick();
        }
    }

    /// Lets `ticks` ticks pass on every node, running the cluster until quiet after each.
    pub fn run_ticks(&mut self, ticks: usize) {
        for _ in 0..ticks {
            self.tick_all();
            self.stabilize();
        }
    }

    /// Makes `id` campaign and runs the cluster until quiet.
    pub fn elect(&mut self, id: u64) {
        self.raft(id).campaign();
        self.stabilize();
    }

    /// The unique leader, if exactly one node believes it leads at the highest term.
    pub fn leader(&self) -> Option<NodeId> {
        let top = self.nodes.values().map(|n| n.raft.term()).max()?;
        let leaders: Vec<NodeId> = self
            .nodes
            .values()
            .filter(|n| n.raft.term() == top && n.raft.role() == crate::Role::Leader)
            .map(|n| n.raft.id())
            .collect();
        (leaders.len() == 1).then(|| leaders[0])
    }
}
