//! The in-memory view of the replicated log since the last compaction point.
//!
//! The core keeps every entry after the latest snapshot in memory (as etcd's server does with its
//! `MemoryStorage`), so it never reads the disk. The driver persists what a `Ready` hands it and
//! tells the core where the log was compacted.

use crate::types::{Entry, LogIndex, Snapshot, Term};

#[derive(Debug)]
pub(crate) struct RaftLog {
    /// The latest snapshot: the compaction point, and what a lagging follower is sent.
    /// Invariant: `snapshot.meta.index <= applied`, except while `pending_snapshot` is set.
    snapshot: Snapshot,
    /// A snapshot received from a leader that the driver has not yet persisted and applied.
    /// Invariant: when set, it equals `snapshot` and `entries` follow it.
    pending_snapshot: bool,
    /// Invariant: `entries[i].index == snapshot.meta.index + 1 + i`, and terms never decrease.
    entries: Vec<Entry>,
    /// Invariant: `committed <= last_index()`, and `committed` never decreases.
    committed: LogIndex,
    /// Invariant: `applied <= committed`; entries up to `applied` were handed out in a `Ready`
    /// and that `Ready` was advanced.
    applied: LogIndex,
    /// The last index handed to the driver to write (in a `Ready` it has advanced).
    /// Invariant: `written <= last_index()`; entries above it are in the next `Ready`.
    written: LogIndex,
    /// The last index known durable on this node's disk: everything a `Ready` handed out once
    /// that `Ready` was advanced with [`crate::Raft::advance`], or what
    /// [`crate::Raft::log_synced`] reported after [`crate::Raft::advance_written`].
    /// Invariant: `synced <= written`. Only entries up to here are applied, so the state machine
    /// never holds an entry that a crash could take out of this node's log.
    synced: LogIndex,
    /// Committed entries are applied only once durable here ([`crate::Config::async_storage_writes`]);
    /// otherwise they are applied in the `Ready` that writes them.
    apply_synced_only: bool,
    /// Invariant: the sum of `entries`' [`Entry::size_bytes`]: what the log holds in memory,
    /// which bounds how much a leader keeps for followers catching up.
    bytes: u64,
}

fn size_of(entries: &[Entry]) -> u64 {
    entries.iter().map(Entry::size_bytes).sum()
}

/// What a `Ready` handed out of the log, so that `advance` knows what is now durable and applied.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LogMark {
    pub(crate) last_entry: Option<(LogIndex, Term)>,
    pub(crate) snapshot_index: Option<LogIndex>,
    pub(crate) applied_to: Option<LogIndex>,
}

impl RaftLog {
    /// A log restored from what the driver persisted: its latest snapshot, the entries after it,
    /// and the commit index of its hard state.
    pub(crate) fn restore(
        snapshot: Snapshot,
        entries: Vec<Entry>,
        commit: LogIndex,
        apply_synced_only: bool,
    ) -> RaftLog {
        let snap_index = snapshot.meta.index;
        for (i, e) in entries.iter().enumerate() {
            assert_eq!(e.index, snap_index.plus(1 + i as u64), "persisted entries not contiguous");
        }
        let last = entries.last().map_or(snap_index, |e| e.index);
        assert!(commit <= last, "persisted commit {commit} beyond last entry {last}");
        let committed = commit.max(snap_index);
        RaftLog {
            snapshot,
            pending_snapshot: false,
            bytes: size_of(&entries),
            entries,
            committed,
            applied: snap_index,
            written: last,
            synced: last,
            apply_synced_only,
        }
    }

    pub(crate) fn first_index(&self) -> LogIndex {
        self.snapshot.meta.index.next()
    }

    pub(crate) fn last_index(&self) -> LogIndex {
        self.entries.last().map_or(self.snapshot.meta.index, |e| e.index)
    }

    pub(crate) fn last_term(&self) -> Term {
        self.entries.last().map_or(self.snapshot.meta.term, |e| e.term)
    }

    pub(crate) fn committed(&self) -> LogIndex {
        self.committed
    }

    pub(crate) fn applied(&self) -> LogIndex {
        self.applied
    }

    /// The last index known durable here (see the field).
    pub(crate) fn synced(&self) -> LogIndex {
        self.synced
    }

    /// The driver made the log durable up to `index`, which held an entry of `term` when it was
    /// written. Returns whether that moved the durable index: an entry since replaced (the log
    /// was truncated after the write) does not count.
    pub(crate) fn synced_to(&mut self, index: LogIndex, term: Term) -> bool {
        if index <= self.synced || index > self.written || !self.match_term(index, term) {
            return false;
        }
        self.synced = index;
        true
    }

    /// The bytes of the entries held (their [`Entry::size_bytes`]).
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The term of the entry at `index`, or `None` if it is compacted away or beyond the log.
    pub(crate) fn term(&self, index: LogIndex) -> Option<Term> {
        let snap = &self.snapshot.meta;
        if index == snap.index {
            return Some(snap.term);
        }
        if index < snap.index || index > self.last_index() {
            return None;
        }
        Some(self.entries[self.offset(index)].term)
    }

    pub(crate) fn match_term(&self, index: LogIndex, term: Term) -> bool {
        self.term(index) == Some(term)
    }

    fn offset(&self, index: LogIndex) -> usize {
        (index.0 - self.snapshot.meta.index.0 - 1) as usize
    }

    /// Whether a log ending at (`last_index`, `last_term`) is at least as up to date as this one
    /// (Raft paper §5.4.1).
    pub(crate) fn is_up_to_date(&self, last_index: LogIndex, last_term: Term) -> bool {
        last_term > self.last_term()
            || (last_term == self.last_term() && last_index >= self.last_index())
    }

    /// Appends entries the leader created. Returns the new last index.
    pub(crate) fn append_new(&mut self, entries: impl IntoIterator<Item = Entry>) -> LogIndex {
        for e in entries {
            debug_assert_eq!(e.index, self.last_index().next());
            debug_assert!(e.term >= self.last_term());
            self.bytes += e.size_bytes();
            self.entries.push(e);
        }
        self.last_index()
    }

    /// A follower's AppendEntries step (§5.3): if the log holds `prev_index` at `prev_term`, keep
    /// the matching prefix, replace any conflicting suffix with `entries`, and return the last index
    /// now known to match the leader. `None` means the consistency check failed.
    pub(crate) fn maybe_append(
        &mut self,
        prev_index: LogIndex,
        prev_term: Term,
        entries: &[Entry],
    ) -> Option<LogIndex> {
        if !self.match_term(prev_index, prev_term) {
            return None;
        }
        let last_new = prev_index.plus(entries.len() as u64);
        // The first entry that is missing here, or that conflicts with ours.
        let conflict = entries.iter().position(|e| !self.match_term(e.index, e.term));
        if let Some(pos) = conflict {
            let from = entries[pos].index;
            assert!(
                from > self.committed,
                "entry {from} conflicts with the committed prefix (committed {})",
                self.committed
            );
            self.truncate_from(from);
            self.bytes += size_of(&entries[pos..]);
            self.entries.extend_from_slice(&entries[pos..]);
        }
        Some(last_new)
    }

    /// Drops entries from `index` on; the next `Ready` tells the driver to overwrite them.
    fn truncate_from(&mut self, index: LogIndex) {
        let keep = self.offset(index);
        self.bytes -= size_of(&self.entries[keep..]);
        self.entries.truncate(keep);
        self.written = self.written.min(index.prev());
        self.synced = self.synced.min(index.prev());
    }

    /// Raises the commit index. Never lowers it.
    pub(crate) fn commit_to(&mut self, index: LogIndex) -> bool {
        if index <= self.committed {
            return false;
        }
        assert!(index <= self.last_index(), "commit {index} beyond last {}", self.last_index());
        self.committed = index;
        true
    }

    /// The largest index `i <= index` whose term is at most `term`: where a rejecting follower's
    /// log may match a leader whose entry at `index` has `term` (etcd's fast backtracking).
    pub(crate) fn find_conflict_by_term(&self, index: LogIndex, term: Term) -> (LogIndex, Term) {
        let mut i = index.min(self.last_index());
        loop {
            match self.term(i) {
                Some(t) if t > term => i = i.prev(),
                Some(t) => return (i, t),
                // Compacted: everything at or below the snapshot is committed and matches.
                None => return (self.snapshot.meta.index, self.snapshot.meta.term),
            }
        }
    }

    /// Entries `[lo, hi]` (clamped to the log), stopping once `max_bytes` is exceeded but always
    /// including the first. `lo` must be at or above `first_index()`.
    pub(crate) fn slice(&self, lo: LogIndex, hi: LogIndex, max_bytes: u64) -> Vec<Entry> {
        debug_assert!(lo >= self.first_index());
        let hi = hi.min(self.last_index());
        if lo > hi {
            return Vec::new();
        }
        let window = &self.entries[self.offset(lo)..=self.offset(hi)];
        let mut bytes = 0u64;
        let mut n = 0;
        for e in window {
            bytes += e.size_bytes();
            if n > 0 && bytes > max_bytes {
                break;
            }
            n += 1;
        }
        window[..n].to_vec()
    }

    /// Replaces the whole log with a snapshot from the leader (InstallSnapshot, §7).
    pub(crate) fn install_snapshot(&mut self, snapshot: Snapshot) {
        let index = snapshot.meta.index;
        self.committed = self.committed.max(index);
        self.entries.clear();
        self.bytes = 0;
        self.snapshot = snapshot;
        self.pending_snapshot = true;
        self.written = self.written.min(index);
        self.synced = self.synced.min(index);
    }

    /// The driver captured the application state at `snapshot.meta.index` and may drop the log up
    /// to there. Returns false (and changes nothing) if that is not newer than the current
    /// compaction point.
    pub(crate) fn compact(&mut self, snapshot: Snapshot) -> bool {
        let index = snapshot.meta.index;
        if index <= self.snapshot.meta.index || self.pending_snapshot {
            return false;
        }
        assert!(index <= self.applied, "compacting to {index} beyond applied {}", self.applied);
        assert_eq!(self.term(index), Some(snapshot.meta.term), "snapshot term mismatch");
        let drop = self.offset(index) + 1;
        self.bytes -= size_of(&self.entries[..drop]);
        self.entries.drain(..drop);
        self.snapshot = snapshot;
        true
    }

    /// Hands out what the driver must persist and apply next, and remembers it in a mark.
    pub(crate) fn take_ready(&self) -> (Option<Snapshot>, Vec<Entry>, Vec<Entry>, LogMark) {
        let mut mark = LogMark::default();
        let snapshot = if self.pending_snapshot {
            mark.snapshot_index = Some(self.snapshot.meta.index);
            Some(self.snapshot.clone())
        } else {
            None
        };
        let unwritten_from = self.written.max(self.snapshot.meta.index).next();
        let entries = self.entries[self.offset(unwritten_from)..].to_vec();
        if let Some(e) = entries.last() {
            mark.last_entry = Some((e.index, e.term));
        }
        let apply_from = self.applied.max(self.snapshot.meta.index).next();
        let apply_to = self.appliable();
        let committed_entries = if apply_from <= apply_to {
            self.entries[self.offset(apply_from)..=self.offset(apply_to)].to_vec()
        } else {
            Vec::new()
        };
        if let Some(e) = committed_entries.last() {
            mark.applied_to = Some(e.index);
        }
        (snapshot, entries, committed_entries, mark)
    }

    /// The last committed index that may be applied. Under asynchronous writes, only what is
    /// durable here too (etcd raft's rule): a follower may learn that an entry is committed
    /// before its own copy is durable, and applying it then could leave the state machine ahead
    /// of a log that a crash cut back.
    fn appliable(&self) -> LogIndex {
        if self.apply_synced_only {
            self.committed.min(self.synced)
        } else {
            self.committed
        }
    }

    pub(crate) fn has_ready(&self) -> bool {
        self.pending_snapshot
            || self.written < self.last_index()
            || self.applied.max(self.snapshot.meta.index) < self.appliable()
    }

    /// The driver handled a `Ready`: what it handed out is written, and durable if `synced`;
    /// its committed entries are applied.
    pub(crate) fn advance(&mut self, mark: LogMark, synced: bool) {
        if let Some(index) = mark.snapshot_index {
            if self.pending_snapshot && self.snapshot.meta.index == index {
                self.pending_snapshot = false;
            }
            self.applied = self.applied.max(index);
            // A snapshot is installed durably whatever else the Ready held.
            self.written = self.written.max(index);
            self.synced = self.synced.max(index);
        }
        if let Some((index, term)) = mark.last_entry {
            // The log may have been truncated since the Ready; only a still-matching entry counts.
            if self.match_term(index, term) {
                self.written = self.written.max(index);
            }
        }
        if synced {
            // Everything written so far, by this Ready or earlier ones, is durable now.
            self.synced = self.written;
        }
        if let Some(index) = mark.applied_to {
            self.applied = self.applied.max(index);
        }
    }

    pub(crate) fn check_invariants(&self) {
        let snap = self.snapshot.meta.index;
        for (i, e) in self.entries.iter().enumerate() {
            assert_eq!(e.index, snap.plus(1 + i as u64), "log entries not contiguous");
        }
        for w in self.entries.windows(2) {
            assert!(w[0].term <= w[1].term, "log terms decrease at {}", w[1].index);
        }
        if let Some(first) = self.entries.first() {
            assert!(first.term >= self.snapshot.meta.term, "entry term below snapshot term");
        }
        assert!(self.committed <= self.last_index(), "committed beyond log");
        assert!(self.applied <= self.committed, "applied beyond committed");
        assert_eq!(self.bytes, size_of(&self.entries), "the log's byte count is off");
        assert!(self.written <= self.last_index(), "written beyond log");
        assert!(self.synced <= self.written, "synced beyond written");
        if !self.pending_snapshot && self.apply_synced_only {
            assert!(self.applied <= self.synced.max(snap), "applied beyond the durable log");
        }
        if !self.pending_snapshot {
            assert!(snap <= self.applied, "snapshot beyond applied");
        }
    }
}
