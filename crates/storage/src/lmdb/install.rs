//! Replacing the whole database (installing a snapshot image) by writing the new contents into
//! a fresh environment beside the current one and exchanging the two directories.
//!
//! Replacing the contents in place, in one write transaction, cannot reuse a single page the
//! old contents free (LMDB reuses a page only after the transaction that freed it, and every
//! reader older than it, ends), so each install left the file larger by the size of the image:
//! a learner that installed three snapshots of a 500 MB store held a 1.5 GB file. A fresh
//! environment holds exactly the image, written in key order (LMDB's append mode packs the
//! pages full), and the whole image never sits in one transaction's dirty pages.
//!
//! 1. `begin`: a fresh directory `<db>.install-<pid>-<n>/`, and an environment in it. Commits
//!    and reads go on against the current environment meanwhile (the store discards commits of
//!    the state the image replaces); a defragmentation waits (one rewrite of the file at a
//!    time).
//! 2. `put`: records in revision order, committed in transactions of about 16 MiB.
//! 3. `prepare`: the rest (members, leases, auth, alarms, meta), then a sync of the copy and
//!    its directory.
//! 4. `swap`: under the commit lock, the two directories are exchanged atomically and their
//!    parent synced (as a defragmentation does), and readers and commits move to the new
//!    environment; views already open keep the old one until they end. The old directory, now
//!    under the copy's name, is removed.
//!
//! A crash before the exchange leaves the old database and an unfinished copy, which the next
//! open removes ([`super::defrag::remove_leftovers`]); after it, the new database, complete and
//! synced, and the old one under the copy's name, removed the same way.

use std::path::PathBuf;
use std::sync::{Arc, MutexGuard};

use cairn_kv::backend::{revision_key, BackendError, Replacement, WriteBatch};
use cairn_kv::RevisionId;
use heed::PutFlags;

use super::defrag::{exchange, fresh_dir, sync_dir};
use super::{err, Handles, LmdbBackend};

/// Records gathered before they are written in one transaction: large enough that commits
/// (each an fsync of the copy) are few, small enough that a transaction's dirty pages stay
/// well within memory.
const TXN_BYTES: usize = 16 << 20;

/// A replacement being written aside; see the module comment.
pub(super) struct Install<'a> {
    backend: &'a LmdbBackend,
    /// Held from the start: no defragmentation copies the file while it is being replaced.
    _one: MutexGuard<'a, ()>,
    dir: PathBuf,
    /// The copy's environment; `None` once swapped in.
    to: Option<Handles>,
    pending: Vec<(RevisionId, Vec<u8>)>,
    pending_bytes: usize,
}

impl<'a> Install<'a> {
    pub(super) fn begin(backend: &'a LmdbBackend) -> Result<Install<'a>, BackendError> {
        let one = backend.defragmenting.lock().unwrap_or_else(|e| e.into_inner());
        let dir = fresh_dir(&backend.path, "install")?;
        let to = match Handles::open(&dir, backend.map_size) {
            Ok(h) => h,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let pending = Vec::new();
        Ok(Install { backend, _one: one, dir, to: Some(to), pending, pending_bytes: 0 })
    }

    fn to(&self) -> Result<&Handles, BackendError> {
        self.to.as_ref().ok_or(BackendError::Corrupt("replacement already swapped in"))
    }

    /// Writes the gathered records, in order, and `rest` (members, leases, auth, alarms, meta)
    /// if given, in one transaction.
    fn flush(&mut self, rest: Option<&WriteBatch>) -> Result<(), BackendError> {
        let pending = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        let to = self.to()?;
        let mut wtxn = to.env.write_txn().map_err(err("begin write"))?;
        for (rev, rec) in &pending {
            to.history
                .put_with_flags(&mut wtxn, PutFlags::APPEND, &revision_key(*rev), rec)
                .map_err(|e| self.backend.write_failed(err("put")(e)))?;
        }
        if let Some(rest) = rest {
            to.write_rest(&mut wtxn, rest).map_err(|e| self.backend.write_failed(e))?;
        }
        wtxn.commit().map_err(self.backend.write_err("commit installed copy"))
    }
}

impl Replacement for Install<'_> {
    fn put(&mut self, rev: RevisionId, record: &[u8]) -> Result<(), BackendError> {
        self.pending_bytes += record.len() + 12;
        self.pending.push((rev, record.to_vec()));
        if self.pending_bytes >= TXN_BYTES {
            self.flush(None)?;
        }
        Ok(())
    }

    fn prepare(&mut self, mut rest: WriteBatch) -> Result<(), BackendError> {
        self.pending.append(&mut rest.puts);
        self.flush(Some(&rest))?;
        let to = self.to()?;
        to.env.force_sync().map_err(self.backend.write_err("sync installed copy"))?;
        sync_dir(&self.dir)
    }

    fn swap(mut self: Box<Self>) -> Result<(), BackendError> {
        let to = self.to.take().ok_or(BackendError::Corrupt("replacement already swapped in"))?;
        // No commit runs from here on until readers and commits use the new environment.
        let journal = self.backend.journal();
        exchange(&self.dir, &self.backend.path)?;
        self.backend.note_size(&to);
        *self.backend.cur.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(to);
        drop(journal);
        Ok(())
    }
}

impl Drop for Install<'_> {
    // Removes the copy (unfinished, or after the exchange the old database). Views of the old
    // environment still open keep reading it: its files are unlinked, not gone.
    fn drop(&mut self) {
        self.to = None;
        // What cannot be removed now is removed at the next open.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
