//! Executed batches wait here until the log holds, durably, a commit index that covers them.
//!
//! The log's commit index is written lazily (`apply.rs`'s `persist`): a hard state that moves
//! only the commit index rides with the next write. Were the store to make a batch durable
//! before the log's durable commit index covered it, a restart would find the store ahead of
//! what the log says is committed. The core then starts with its applied index below the
//! store's, and until it learns a commit index past the store's, the member cannot make a
//! snapshot of its store at the core's applied index (`snapshot.rs`). A restarted leader whose
//! followers needed snapshots to make a quorum so never committed again: the simulator found it
//! (seed 6115, chaos 20, one-byte messages). Raising the core's commit index at open to the
//! store's is no way out: after a crash between a snapshot's install in the store and its
//! record in the log, the log below the snapshot can hold entries that were never committed
//! (`sim/tests/it/seeds.rs`).
//!
//! So the committer gets a batch only once the log's durable commit index covers it: the
//! store's durable index never passes the log's, and after a restart the core's replay reaches
//! the store and goes past it. Under load every write carries the commit index of the writes
//! before it, so a batch waits for one write at most. When the log goes quiet with batches
//! held, the commit index is written and synced alone, a tick after the first of them was held
//! (at once for a physical compaction's caller): one small fsync per quiet tick, and none
//! under load.

use std::collections::VecDeque;

use cairn_kv::backend::Backend;
use cairn_kv::Prepared;
use cairn_storage::fs::Dir;

use super::Replica;
use crate::error::StorageError;

/// Executed batches the log's durable commit index does not yet cover, in order.
#[derive(Debug, Default)]
pub(super) struct HeldBatches {
    batches: VecDeque<Prepared>,
    /// The tick at which the oldest batch still held was held.
    since: u64,
}

impl<D: Dir, B: Backend, T> Replica<D, B, T> {
    /// Keeps an executed batch until the log's durable commit index covers it.
    pub(super) fn hold_batch(&mut self, batch: Prepared) {
        if self.held_batches.batches.is_empty() {
            self.held_batches.since = self.ticks;
        }
        self.held_batches.batches.push_back(batch);
    }

    /// Hands the committer every batch the log's durable commit index covers; first writes
    /// and syncs the commit index alone if a batch has waited a tick with no write carrying it.
    pub(super) fn release_batches(&mut self) -> Result<(), StorageError> {
        self.hand_over();
        let Some(oldest) = self.held_batches.batches.front() else { return Ok(()) };
        // A physical compaction's caller waits for the committer to remove history, which
        // follows the batch that compacts: it does not wait for a tick.
        let waited = self.ticks > self.held_batches.since || !self.physical.is_empty();
        if waited && oldest.applied_index() > self.syncs.commit_written.0 {
            self.write_commit(self.syncs.sync_later)?;
            self.hand_over();
        }
        Ok(())
    }

    /// Before a graceful stop: makes the commit index durable, on this thread, and hands the
    /// committer every batch, so that the store is as current as the log when the member stops.
    pub fn release_all_batches(&mut self) -> Result<(), StorageError> {
        self.fail_stop(|r| {
            if r.held_batches.batches.is_empty() {
                return Ok(());
            }
            // Never a commit index below one written: the last one written is what replay reads.
            if r.raft.applied_index() > r.syncs.commit_written {
                r.write_commit(false)?;
            } else if r.syncs.commit_written > r.syncs.commit_synced {
                r.sync_all()?;
            }
            r.hand_over();
            Ok(())
        })
    }

    /// Moves the batches the log's durable commit index covers to [`super::Work::commits`].
    /// So does a batch at or below what the store already holds durably (`store_durable`, no
    /// lock on the store): it changes nothing (a store ahead of its log after a crash between a
    /// snapshot's install and its record replays entries it holds), and written for, it would
    /// be written for again every turn.
    fn hand_over(&mut self) {
        let durable = self.syncs.commit_synced.max(self.store_durable).0;
        let mut released = false;
        while self.held_batches.batches.front().is_some_and(|b| b.applied_index() <= durable) {
            let batch = self.held_batches.batches.pop_front().expect("checked");
            self.work.commits.push(batch);
            released = true;
        }
        if released {
            self.held_batches.since = self.ticks;
        }
    }

    /// Writes a hard state alone and syncs the log, or leaves the sync to the driver (`later`,
    /// under asynchronous writes) as it does the writes before. It holds the term and vote as
    /// last made durable, not the core's (a `Ready` may be waiting with a new one, at a stop),
    /// and the applied index as commit index: every entry applied is written (the core's
    /// commit index may be past the entries written, and replay refuses a log whose commit
    /// index is past its last entry).
    fn write_commit(&mut self, later: bool) -> Result<(), StorageError> {
        let (term, vote) = self.synced_term_vote;
        let hs = cairn_raft::HardState { term, vote, commit: self.raft.applied_index() };
        if later && self.cfg.raft.async_storage_writes {
            return self.write_hard_state(hs);
        }
        self.append(Vec::new(), Some(hs))?;
        self.sync_all()?;
        // What waited for the writes this sync covered may leave now.
        self.release_held()
    }
}
