//! Asynchronous storage writes ([`cairn_raft::Config::async_storage_writes`]): the replica
//! writes a `Ready`'s entries without syncing, numbers the write, and leaves the sync to its
//! driver ([`super::Work::log_sync`]). What promises those entries (acknowledgements) waits
//! here until a sync covering the write reports; then the core counts them durable, which lets
//! a leader count its own copy and every member apply them.
//!
//! A `Ready` that changes term or vote, or installs a snapshot, is synced as it is written, and
//! that sync covers every write before it: what waited on those leaves first.

use std::collections::VecDeque;

use cairn_kv::backend::Backend;
use cairn_raft::{Entry, LogIndex, Message, Term};
use cairn_storage::fs::Dir;

use super::{Observed, Replica};
use crate::config::Bug;
use crate::error::StorageError;

/// The replica's writes left for the driver to sync.
#[derive(Debug)]
pub(super) struct Syncs {
    /// Writes may be left for the driver to sync ([`Replica::set_sync_later`]).
    pub(super) sync_later: bool,
    /// Writes to the log made without a sync, numbered.
    writes: u64,
    /// The last write a sync is known to cover.
    synced_writes: u64,
    /// Writes not yet known durable, in order.
    unsynced: VecDeque<Unsynced>,
    /// Messages that promise what a write holds (acknowledgements), by the number of the last
    /// write before them, until a sync covers it.
    held: VecDeque<(u64, Vec<Message>)>,
    /// The commit index of the last hard state written to the log.
    pub(super) commit_written: LogIndex,
    /// The commit index the log holds durably: what a restart recovers at least
    /// (`store_batches.rs` holds the store's batches to it).
    pub(super) commit_synced: LogIndex,
    /// Writes to the log that carried entries, and the entries they carried, since the start:
    /// how many writers share each write ([`Replica::log_write_totals`]).
    entry_writes: u64,
    entries_written: u64,
}

/// A write to the log not yet known durable.
#[derive(Debug)]
struct Unsynced {
    /// Its number.
    write: u64,
    /// The index and term of its last entry, what the core is told once it is durable; none
    /// for a hard state alone.
    last_entry: Option<(LogIndex, Term)>,
    /// The commit index the log held once it was written.
    commit: LogIndex,
}

impl Default for Syncs {
    fn default() -> Syncs {
        Syncs {
            sync_later: true,
            writes: 0,
            synced_writes: 0,
            unsynced: VecDeque::new(),
            held: VecDeque::new(),
            commit_written: LogIndex::ZERO,
            commit_synced: LogIndex::ZERO,
            entry_writes: 0,
            entries_written: 0,
        }
    }
}

impl Syncs {
    /// Nothing written yet, over a log whose durable commit index is `commit`.
    pub(super) fn with_commit(commit: LogIndex) -> Syncs {
        Syncs { commit_written: commit, commit_synced: commit, ..Syncs::default() }
    }
}

impl<D: Dir, B: Backend, T> Replica<D, B, T> {
    /// A sync of the log covered every write up to number `write` ([`super::Work::log_sync`]): the
    /// core counts them durable, and what waited for them leaves in the next process.
    pub fn handle_log_synced(&mut self, write: u64) {
        if write <= self.syncs.synced_writes {
            return;
        }
        self.syncs.synced_writes = write;
        let mut last = None;
        while self.syncs.unsynced.front().is_some_and(|u| u.write <= write) {
            let done = self.syncs.unsynced.pop_front().expect("checked");
            self.syncs.commit_synced = self.syncs.commit_synced.max(done.commit);
            last = done.last_entry.or(last);
        }
        if let Some((index, term)) = last {
            self.raft.log_synced(index, term);
        }
    }

    /// With [`cairn_raft::Config::async_storage_writes`]: whether the next writes are left for
    /// the driver to sync ([`super::Work::log_sync`]), or synced as they are written, as without it.
    /// Either is safe at any moment; the default is to leave them.
    pub fn set_sync_later(&mut self, later: bool) {
        self.syncs.sync_later = later;
    }

    /// The log's writes that carried entries, and the entries they carried, since the start.
    /// Entries per write tell how many writers share each write (and its fsync): one for a
    /// single client's puts, more as clients wait behind one another.
    pub fn log_write_totals(&self) -> (u64, u64) {
        (self.syncs.entry_writes, self.syncs.entries_written)
    }

    /// Syncs the log on this thread and reports it ([`super::Work::log_sync`]): every write so far is
    /// covered.
    pub fn sync_log(&mut self) -> Result<(), StorageError> {
        self.fail_stop(|r| r.sync_all())
    }

    /// Syncs the log on this thread: every write so far is durable, and the core is told.
    pub(super) fn sync_all(&mut self) -> Result<(), StorageError> {
        self.sync_wal()?;
        self.handle_log_synced(self.syncs.writes);
        Ok(())
    }

    /// Syncs the log: the commit index last written is durable from here on.
    pub(super) fn sync_wal(&mut self) -> Result<(), StorageError> {
        self.wal.sync()?;
        self.syncs.commit_synced = self.syncs.commit_written;
        Ok(())
    }

    /// A handle to the log's active segment, to sync on another thread ([`super::Work::log_sync`]).
    /// It serves until [`Replica::log_segment`] moves past its segment.
    pub fn log_sync_handle(&self) -> Result<cairn_storage::SyncHandle<D::File>, StorageError> {
        Ok(self.wal.sync_handle()?)
    }

    /// The log's active segment number (see [`Replica::log_sync_handle`]).
    pub fn log_segment(&self) -> u64 {
        self.wal.active_segment()
    }

    /// Writes entries (and the hard state riding with them) without syncing; the driver is
    /// asked to sync ([`super::Work::log_sync`]). The term and vote are unchanged (only such a
    /// `Ready` is written this way), so a hard state alone is left to ride with a later write.
    pub(super) fn write(
        &mut self,
        entries: Vec<Entry>,
        hard_state: Option<cairn_raft::HardState>,
    ) -> Result<(), StorageError> {
        let Some((index, term)) = entries.last().map(|e| (e.index, e.term)) else {
            if hard_state.is_some() {
                self.lazy_hard_state = hard_state;
            }
            return Ok(());
        };
        self.append(entries, hard_state)?;
        self.left_to_sync(Some((index, term)));
        Ok(())
    }

    /// Writes a hard state alone for the driver to sync, unlike [`Replica::write`], which
    /// leaves one to ride with a later write.
    pub(super) fn write_hard_state(
        &mut self,
        hard_state: cairn_raft::HardState,
    ) -> Result<(), StorageError> {
        self.append(Vec::new(), Some(hard_state))?;
        self.left_to_sync(None);
        Ok(())
    }

    /// Numbers the write just made and asks the driver to sync it.
    fn left_to_sync(&mut self, last_entry: Option<(LogIndex, Term)>) {
        self.syncs.writes += 1;
        let commit = self.syncs.commit_written;
        self.syncs.unsynced.push_back(Unsynced { write: self.syncs.writes, last_entry, commit });
        self.work.log_sync = Some(self.syncs.writes);
    }

    /// Messages that promise what the last writes hold: sent now if those are durable, else
    /// kept until the sync covering them reports. Returns whether any were sent now.
    pub(super) fn hold_until_synced(&mut self, msgs: Vec<Message>) -> Result<bool, StorageError> {
        if msgs.is_empty() {
            return Ok(false);
        }
        if self.syncs.unsynced.is_empty() || self.cfg.has_bug(Bug::AckBeforeFsync) {
            self.send(msgs)?;
            return Ok(true);
        }
        match self.syncs.held.back_mut() {
            Some((write, held)) if *write == self.syncs.writes => held.extend(msgs),
            _ => self.syncs.held.push_back((self.syncs.writes, msgs)),
        }
        Ok(false)
    }

    /// Everything written so far is durable (`synced`), or is about to be made so here: a
    /// `Ready` the core must see durable before `advance` covers the writes before it.
    pub(super) fn all_synced(&mut self, synced: bool) -> Result<(), StorageError> {
        if self.syncs.unsynced.is_empty() {
            return Ok(());
        }
        if !synced && !self.cfg.has_bug(Bug::AckBeforeFsync) {
            self.sync_wal()?;
        }
        self.syncs.unsynced.clear();
        self.syncs.synced_writes = self.syncs.writes;
        self.release_held()
    }

    /// Sends what waited for writes now durable, in the order it was held.
    pub(super) fn release_held(&mut self) -> Result<(), StorageError> {
        while self.syncs.held.front().is_some_and(|(write, _)| *write <= self.syncs.synced_writes) {
            let (_, msgs) = self.syncs.held.pop_front().expect("checked");
            self.send(msgs)?;
        }
        Ok(())
    }

    /// Appends to the log (not durably), with any lazily kept hard state.
    pub(super) fn append(
        &mut self,
        entries: Vec<Entry>,
        hard_state: Option<cairn_raft::HardState>,
    ) -> Result<(), StorageError> {
        let hard_state = hard_state.or(self.lazy_hard_state.take());
        self.lazy_hard_state = None;
        self.wal.append(&entries, hard_state.as_ref())?;
        if let Some(hs) = &hard_state {
            self.syncs.commit_written = hs.commit;
        }
        if !entries.is_empty() {
            self.syncs.entry_writes += 1;
            self.syncs.entries_written += entries.len() as u64;
        }
        if self.cfg.observe && !entries.is_empty() {
            let first = entries[0].index;
            let prev_term =
                if first.0 > 1 { self.raft.term_at(first.prev()) } else { Some(Term(0)) };
            self.work.observed.push(Observed::Persisted { prev_term, entries });
        }
        Ok(())
    }
}
