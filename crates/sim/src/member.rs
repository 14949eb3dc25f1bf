//! A simulated member: the node crate's real [`Replica`] over a simulated disk for its log
//! ([`FaultyDir`]: unsynced writes lost or torn on a crash) and for its store ([`SimBackend`]:
//! LMDB's crash outcomes), with a clock that may run fast or slow and a committer that runs
//! when the simulation says so. A crash drops everything in memory; a restart opens the same
//! disks again, exactly as a process restart does.

use std::sync::Arc;

use cairn_kv::{MemberAttributes, Store};
use cairn_node::committer::Committer;
use cairn_node::{Bootstrap, Replica, ReplicaConfig, RequestIds};
use cairn_raft::{ConfState, LogIndex, NodeId};
use cairn_storage::faulty::FaultyDir;
use cairn_storage::WalOptions;

use crate::backend::SimBackend;
use crate::rng::Rng;

/// What a caller is known by in the simulator: the client operation's id.
pub type Token = u64;

pub type SimReplica = Replica<FaultyDir, SimBackend, Token>;

/// Small segments, so a run rotates and removes them many times.
const SEGMENT_BYTES: u64 = 16 << 10;

#[derive(Debug)]
pub struct SimMember {
    pub id: NodeId,
    cfg: ReplicaConfig,
    /// The founding configuration, for a founding member's first start.
    founding: Option<ConfState>,
    /// Whether the member publishes its attributes ([`SimMember::attributes`]).
    publish: bool,
    pub disk: FaultyDir,
    pub backend: SimBackend,
    /// `None` while crashed.
    pub replica: Option<SimReplica>,
    pub committer: Option<Committer<SimBackend>>,
    /// Request ids of this life of the member.
    pub ids: Option<RequestIds>,
    /// Sim time units per tick of this member's clock (clock drift).
    pub tick_period: u64,
    pub next_tick_at: u64,
    pub restart_at: Option<u64>,
    /// Starts so far: a member's client URLs change every other start.
    pub lives: u64,
    /// Highest commit index seen in this life, for the monotonicity check.
    pub seen_commit: LogIndex,
    /// Highest executed index seen in this life, for the monotonicity check.
    pub seen_executed: u64,
    /// What `--trace` last printed for this member.
    pub last_traced: Option<String>,
    /// A log sync asked for and not yet done: the write it covers, and a handle to the file.
    pub log_sync: Option<(u64, cairn_storage::SyncHandle<cairn_storage::faulty::FaultyFile>)>,
}

impl SimMember {
    pub fn new(
        cfg: ReplicaConfig,
        founding: Option<ConfState>,
        publish: bool,
        tick_period: u64,
    ) -> SimMember {
        SimMember {
            id: cfg.raft.id,
            cfg,
            founding,
            publish,
            disk: FaultyDir::default(),
            backend: SimBackend::default(),
            replica: None,
            committer: None,
            ids: None,
            tick_period,
            next_tick_at: tick_period,
            restart_at: None,
            lives: 0,
            seen_commit: LogIndex::ZERO,
            seen_executed: 0,
            last_traced: None,
            log_sync: None,
        }
    }

    /// Opens the member on its disks, as a process start does. Fails only if what is on disk
    /// cannot be opened: a bug the simulator reports.
    pub fn start(&mut self, now: u64) -> Result<(), String> {
        let store = Store::open(self.backend.clone()).map_err(|e| format!("store: {e}"))?;
        let store = Arc::new(store);
        let bootstrap = match &self.founding {
            Some(conf) => Bootstrap::Founding(conf.clone()),
            None => Bootstrap::Joining,
        };
        // Time in the simulator is in units; a unit counts as a millisecond for request ids.
        let micros = now * 1000;
        self.lives += 1;
        let mut cfg = self.cfg.clone();
        if self.publish {
            cfg.publish = Some(self.attributes());
        }
        let replica = Replica::open_with(
            cfg,
            self.disk.clone(),
            WalOptions { segment_bytes: SEGMENT_BYTES },
            store.clone(),
            bootstrap,
            micros,
        )
        .map_err(|e| format!("replica: {e}"))?;
        self.seen_commit = replica.raft().commit_index();
        self.seen_executed = store.executed_index();
        self.replica = Some(replica);
        self.committer = Some(Committer::new(store));
        self.ids = Some(RequestIds::new(self.id.0, micros));
        self.restart_at = None;
        self.next_tick_at = now + self.tick_period;
        Ok(())
    }

    /// Power loss: everything in memory is gone, the disks keep what a real disk would.
    pub fn crash(&mut self, rng: &mut Rng, restart_at: u64) {
        self.replica = None;
        self.committer = None;
        self.ids = None;
        self.log_sync = None;
        self.disk.crash(rng.next_u64());
        self.backend.crash(rng);
        self.restart_at = Some(restart_at);
    }

    /// The attributes this life of the member publishes: the same URLs for two lives in a row,
    /// so some restarts republish and some must not.
    pub fn attributes(&self) -> MemberAttributes {
        let id = self.id.0;
        let url = format!("http://m{id}-v{}:2379", self.lives.div_ceil(2));
        MemberAttributes { name: format!("m{id}"), client_urls: vec![url], ..Default::default() }
    }

    pub fn is_up(&self) -> bool {
        self.replica.is_some()
    }

    pub fn replica(&mut self) -> Option<&mut SimReplica> {
        self.replica.as_mut()
    }
}
