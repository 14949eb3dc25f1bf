//! Compaction of the log: when, and how much of it to keep.
//!
//! The log is compacted only up to what the committer made durable in the store (the core's
//! snapshot is a compaction point whose state the store holds), once
//! [`ReplicaConfig::snapshot_entries`] entries were applied past the last compaction. Two
//! things keep entries behind that point, so that a follower catches up from the log rather
//! than by another snapshot:
//!
//! - **The margin** ([`ReplicaConfig::snapshot_catchup_entries`], etcd's
//!   `SnapshotCatchUpEntries`): every member compacts to its applied index less the margin, so
//!   the log holds between the margin and the margin plus `snapshot_entries` entries.
//! - **The hold**, on a leader only: it does not compact past what a follower that is catching
//!   up still needs (the index of the snapshot it is being sent, or its match or probe index),
//!   as long as that follower answers, or was handed a snapshot it may still be installing. A
//!   learner added to a loaded cluster otherwise needed snapshot after snapshot: while it
//!   installed one image, the leader applied more than `snapshot_entries` entries and compacted
//!   past the image's index (bench/results/2026-11-28-snapshot-join.md). etcd skips compaction
//!   altogether while any snapshot is in flight and for 30 s after; this holds only what the
//!   follower needs, for as long as it needs it, and never more than
//!   [`ReplicaConfig::snapshot_catchup_max`] entries beyond the margin, and nothing once the log
//!   holds [`ReplicaConfig::snapshot_catchup_max_bytes`] (the core counts its entries' bytes),
//!   so one slow follower cannot make the leader's memory and log grow without bound: past
//!   that, it gets another snapshot. A follower that is down or cut off holds nothing.
//!
//! [`ReplicaConfig::snapshot_entries`]: crate::ReplicaConfig::snapshot_entries
//! [`ReplicaConfig::snapshot_catchup_entries`]: crate::ReplicaConfig::snapshot_catchup_entries
//! [`ReplicaConfig::snapshot_catchup_max`]: crate::ReplicaConfig::snapshot_catchup_max
//! [`ReplicaConfig::snapshot_catchup_max_bytes`]: crate::ReplicaConfig::snapshot_catchup_max_bytes

use bytes::Bytes;
use cairn_kv::backend::Backend;
use cairn_raft::{LogIndex, NodeId, Progress, ProgressState, Role};
use cairn_storage::fs::Dir;

use super::{Observed, Replica};
use crate::error::StorageError;

/// How long after a snapshot reached a follower it counts as catching up although it says
/// nothing: the install replaces the whole store on the follower's only thread, so a large
/// image keeps it silent for seconds. etcd's `releaseDelayAfterSnapshot`, 30 s; the entry
/// bound caps what this can cost.
const INSTALL_GRACE_MICROS: u64 = 30_000_000;

impl<D: Dir, B: Backend, T> Replica<D, B, T> {
    /// Compacts the log where [`Replica::compaction_point`] says, with the store durable as the
    /// committer reported. The store's commit and fsync ran on the committer; only the log's
    /// small marker is written here.
    pub(super) fn maybe_compact_log(&mut self) -> Result<(), StorageError> {
        let Some(target) = self.compaction_point(self.store_durable) else { return Ok(()) };
        let Some(meta) = self.raft.compact_to(target, Bytes::new()) else { return Ok(()) };
        self.wal.save_compaction(&meta)?;
        self.sync_wal()?;
        self.wal.compact(meta.index)?;
        if let Some(m) = &self.cfg.metrics {
            crate::metrics::EngineMetrics::add(&m.log_compactions, 1);
        }
        if self.cfg.observe {
            self.work.observed.push(Observed::Compacted(meta));
        }
        Ok(())
    }

    /// Asks the committer to make the store durable when a compaction would follow once it is:
    /// the same decision as [`Replica::maybe_compact_log`]'s with the store durable up to the
    /// applied index. A hold that keeps the log from being compacted asks for no syncs.
    pub(super) fn maybe_ask_store_sync(&mut self) {
        if self.store_sync_pending {
            return;
        }
        // The committer has batches up to where the log's commit index is durable, no further
        // (`store_batches.rs`).
        let handed = self.raft.applied_index().min(self.syncs.commit_synced);
        let Some(target) = self.compaction_point(handed) else { return };
        if self.store_durable >= target {
            return;
        }
        self.store_sync_pending = true;
        self.work.store_sync = Some(handed);
    }

    /// Where to compact the log to with the store durable up to `durable`, or `None` if no
    /// compaction is due: the applied index less the margin (never past `durable`), lowered to
    /// what a catching-up follower needs but by at most the hold's bound, and only once that is
    /// `snapshot_entries` past the current compaction point (so a compaction, with its fsync,
    /// comes once per that many entries, as without a hold).
    fn compaction_point(&self, durable: LogIndex) -> Option<LogIndex> {
        let applied = self.raft.applied_index().0;
        let margin = LogIndex(applied.saturating_sub(self.cfg.snapshot_catchup_entries));
        let point = margin.min(durable);
        let point = match self.catchup_hold() {
            Some(hold) if hold < point => {
                let floor = LogIndex(point.0.saturating_sub(self.cfg.snapshot_catchup_max));
                if hold < floor {
                    tracing::debug!(
                        hold = hold.0,
                        floor = floor.0,
                        "a follower catching up needs more of the log than the bound keeps"
                    );
                }
                hold.max(floor)
            }
            _ => point,
        };
        (point.0 >= self.compacted_index().0 + self.cfg.snapshot_entries).then_some(point)
    }

    /// On a leader, the lowest index that a follower catching up still needs the log to hold
    /// (the entry before the first it will be sent), among followers that count as catching up
    /// ([`Replica::catching_up`]) and whose need the log still meets: one that needs what was
    /// already compacted gets a snapshot whatever the log keeps now.
    fn catchup_hold(&self) -> Option<LogIndex> {
        if self.raft.role() != Role::Leader || self.cfg.snapshot_catchup_max == 0 {
            return None;
        }
        if self.raft.log_bytes() > self.cfg.snapshot_catchup_max_bytes {
            tracing::debug!(bytes = self.raft.log_bytes(), "the log is too large to hold more");
            return None;
        }
        let compacted = self.compacted_index();
        let me = self.raft.id();
        let members = self.raft.conf_state().members();
        let peers = members.into_iter().filter(|id| *id != me && self.catching_up(*id));
        let needs = peers.filter_map(|id| self.raft.progress(id).map(needed_from));
        needs.filter(|need| *need >= compacted).min()
    }

    /// Whether the leader should keep entries for `id`: it was heard from within an election
    /// timeout, or a snapshot reached it within the install grace and it has not acknowledged
    /// it yet (it is installing it; once it has, silence means it is down). The core's
    /// `recent_active` would not do: it is cleared every election timeout, and a follower
    /// installing a large image answers nothing for longer than that, exactly while it most
    /// needs the entries.
    fn catching_up(&self, id: NodeId) -> bool {
        let window = u64::from(self.cfg.raft.election_timeout_ticks);
        let heard = self.heard.get(&id).is_some_and(|t| self.ticks <= t + window);
        let installing = self.snapshot_delivered.get(&id).is_some_and(|(at, index)| {
            self.ticks <= at + self.install_grace_ticks()
                && self.raft.progress(id).is_some_and(|p| p.matched() < *index)
        });
        heard || installing
    }

    /// [`INSTALL_GRACE_MICROS`] in ticks, at least an election timeout.
    fn install_grace_ticks(&self) -> u64 {
        let window = u64::from(self.cfg.raft.election_timeout_ticks);
        (INSTALL_GRACE_MICROS / self.cfg.tick_micros.max(1)).max(window)
    }

    /// Records that the transport delivered the snapshot the leader is sending `id`, which now
    /// installs it. Call before the core hears of it (it then forgets the snapshot's index).
    pub(super) fn note_snapshot_delivered(&mut self, id: NodeId) {
        let Some(ProgressState::Snapshot { pending }) = self.raft.progress(id).map(Progress::state)
        else {
            return;
        };
        let (now, grace, pending) = (self.ticks, self.install_grace_ticks(), *pending);
        // Forgets old deliveries, so members that come and go leave nothing behind.
        self.snapshot_delivered.retain(|_, (at, _)| now <= *at + grace);
        self.snapshot_delivered.insert(id, (now, pending));
    }

    /// The index up to which the log was compacted (or a snapshot installed): the core's own
    /// compaction point, which the WAL records too.
    pub fn compacted_index(&self) -> LogIndex {
        self.raft.snapshot_meta().index
    }
}

/// The entry before the first one the leader will send this follower next, which the log must
/// still hold: the snapshot's index while one is pending (after it, the leader probes from
/// there), the probe's previous index, or the match index of a follower being streamed to.
fn needed_from(pr: &Progress) -> LogIndex {
    match pr.state() {
        ProgressState::Snapshot { pending } => (*pending).max(pr.matched()),
        ProgressState::Probe => pr.next().prev().max(pr.matched()),
        ProgressState::Replicate => pr.matched(),
    }
}
