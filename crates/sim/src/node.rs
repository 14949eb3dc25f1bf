//! A simulated node: a real `Raft` core, a disk that keeps only what was persisted, a state
//! machine (a hash chain over applied entries), and a clock that may run fast or slow.

use bytes::{BufMut, Bytes, BytesMut};
use cairn_raft::testkit::MemStorage;
use cairn_raft::{Config, Entry, EntryPayload, LogIndex, NodeId, Raft, ReadCtx, Ready, Snapshot};

use crate::rng::{hash_bytes, mix};

/// The application state: how far it applied and a hash of everything applied, in order. Two
/// nodes that applied different entries at one index end up with different hashes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SmState {
    pub applied: LogIndex,
    pub hash: u64,
}

impl SmState {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(16);
        b.put_u64(self.applied.0);
        b.put_u64(self.hash);
        b.freeze()
    }

    pub fn decode(raw: &[u8]) -> SmState {
        if raw.len() != 16 {
            // Only the bootstrap snapshot (index 0) has no data.
            return SmState::default();
        }
        let applied = u64::from_be_bytes(raw[..8].try_into().unwrap_or_default());
        let hash = u64::from_be_bytes(raw[8..].try_into().unwrap_or_default());
        SmState { applied: LogIndex(applied), hash }
    }

    pub fn apply(&mut self, e: &Entry) {
        self.hash = mix(self.hash ^ payload_hash(e) ^ e.index.0.rotate_left(17));
        self.applied = e.index;
    }
}

/// A hash of what an entry carries, so different payloads are told apart.
pub fn payload_hash(e: &Entry) -> u64 {
    match &e.payload {
        EntryPayload::Normal(d) => hash_bytes(1, d),
        EntryPayload::ConfChange(cc) => hash_bytes(2, format!("{cc:?}").as_bytes()),
    }
}

/// Where a crash may strike while a node handles a `Ready`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// After sending the early messages, before anything was persisted: a leader loses entries it
    /// already sent to followers.
    BeforePersist,
    /// After persisting, before the messages that depend on it left.
    AfterPersist,
}

#[derive(Debug)]
pub struct SimNode {
    pub id: NodeId,
    pub cfg: Config,
    /// `None` while crashed.
    pub raft: Option<Raft>,
    pub disk: MemStorage,
    pub sm: SmState,
    /// Sim time units per tick of this node's clock (clock drift).
    pub tick_period: u64,
    pub next_tick_at: u64,
    pub restart_at: Option<u64>,
    /// Reads answered by the core, waiting until the state machine reaches their index.
    pub pending_reads: Vec<(LogIndex, ReadCtx)>,
    /// Highest commit and applied index seen in this lifetime, for the monotonicity checks.
    pub seen_commit: LogIndex,
    pub seen_applied: LogIndex,
    /// What `--trace` last printed for this node.
    pub last_traced:
        Option<(cairn_raft::Role, cairn_raft::Term, Option<NodeId>, LogIndex, LogIndex)>,
}

/// What handling a `Ready` produced, for the world to route and check.
#[derive(Debug, Default)]
pub struct Handled {
    pub messages: Vec<cairn_raft::Message>,
    pub entries: Vec<Entry>,
    pub applied: Vec<Entry>,
    pub snapshot: Option<Snapshot>,
    pub crashed: bool,
}

impl SimNode {
    pub fn new(cfg: Config, disk: MemStorage, tick_period: u64) -> SimNode {
        let mut node = SimNode {
            id: cfg.id,
            cfg,
            raft: None,
            disk,
            sm: SmState::default(),
            tick_period,
            next_tick_at: tick_period,
            restart_at: None,
            pending_reads: Vec::new(),
            seen_commit: LogIndex::ZERO,
            seen_applied: LogIndex::ZERO,
            last_traced: None,
        };
        node.start();
        node
    }

    /// Boots from the disk: the core from persisted state, the state machine from the snapshot.
    pub fn start(&mut self) {
        let raft = Raft::new(self.cfg.clone(), self.disk.to_persisted()).expect("valid config");
        self.sm = SmState::decode(&self.disk.snapshot.data);
        self.sm.applied = self.disk.snapshot.meta.index;
        self.seen_commit = raft.commit_index();
        self.seen_applied = self.sm.applied;
        self.pending_reads.clear();
        self.raft = Some(raft);
        self.restart_at = None;
    }

    pub fn crash(&mut self, restart_at: u64) {
        self.raft = None;
        self.pending_reads.clear();
        self.restart_at = Some(restart_at);
    }

    pub fn is_up(&self) -> bool {
        self.raft.is_some()
    }

    /// Handles one `Ready`, crashing at `crash` if given.
    pub fn handle_ready(&mut self, crash: Option<CrashPoint>) -> Option<Handled> {
        let raft = self.raft.as_mut()?;
        if !raft.has_ready() {
            return None;
        }
        let rd: Ready = raft.ready();
        let mut out = Handled { messages: rd.messages_now, ..Handled::default() };
        if crash == Some(CrashPoint::BeforePersist) {
            out.crashed = true;
            return Some(out);
        }
        let persisted = Ready {
            messages_now: Vec::new(),
            snapshot: rd.snapshot.clone(),
            entries: rd.entries.clone(),
            hard_state: rd.hard_state,
            messages_after_persist: Vec::new(),
            committed_entries: Vec::new(),
            read_states: Vec::new(),
            soft_state: None,
        };
        self.disk.persist(&persisted);
        out.entries = rd.entries;
        if crash == Some(CrashPoint::AfterPersist) {
            out.crashed = true;
            return Some(out);
        }
        out.messages.extend(rd.messages_after_persist);
        if let Some(snap) = &rd.snapshot {
            self.sm = SmState::decode(&snap.data);
            self.sm.applied = snap.meta.index;
            out.snapshot = Some(snap.clone());
        }
        for e in &rd.committed_entries {
            self.sm.apply(e);
        }
        out.applied = rd.committed_entries;
        for rs in rd.read_states {
            self.pending_reads.push((rs.index, rs.ctx));
        }
        raft.advance();
        Some(out)
    }

    /// Reads whose index the state machine has reached: served now.
    pub fn take_servable_reads(&mut self) -> Vec<(LogIndex, ReadCtx)> {
        let applied = self.sm.applied;
        let (ready, waiting) = self.pending_reads.drain(..).partition(|(i, _)| *i <= applied);
        self.pending_reads = waiting;
        ready
    }

    /// Compacts the log at the applied index.
    pub fn compact(&mut self) {
        let Some(raft) = self.raft.as_mut() else { return };
        let data = self.sm.encode();
        if let Some(meta) = raft.compact(data.clone()) {
            self.disk.compact(Snapshot { meta, data });
        }
    }
}
