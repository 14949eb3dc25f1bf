//! The MVCC store: the key index in memory, the history in a [`Backend`].
//!
//! One writer applies batches of committed commands; many readers read concurrently. Apply runs
//! in three steps so that readers never wait for the backend's commit and never see an
//! uncommitted revision:
//! 1. under the index write lock, execute the commands: new index entries get revisions above
//!    the visible current revision, which readers ignore;
//! 2. commit the records and the meta (applied index, revisions) in one backend transaction;
//! 3. under the write lock again, publish the new current revision (and compact the index).
//!
//! A reader takes the read lock, opens a backend view, and reads at a revision no higher than the
//! visible one, so every record it needs is committed, and physical compaction (which only removes
//! records the index no longer references) cannot pull one from under its view.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::backend::{Backend, BackendError, BackendView, Meta, WriteBatch};
use crate::exec::{Exec, Reader};
use crate::index::{Index, IndexEntry};
use crate::types::{Command, CommandResponse, RangeRequest, RangeResponse, Revision, RevisionId};
use crate::KvError;

#[derive(Debug)]
struct Inner {
    index: Index,
    /// Invariant: every revision up to here is committed in the backend.
    current: Revision,
    compacted: Revision,
    applied_index: u64,
    compacted_physically: Revision,
    /// Records dropped from the index and not yet removed from the backend.
    to_remove: Vec<RevisionId>,
}

/// The etcd data model over a backend.
#[derive(Debug)]
pub struct Store<B: Backend> {
    backend: B,
    inner: RwLock<Inner>,
    /// Serializes writers (apply and physical compaction).
    writer: Mutex<()>,
}

/// One committed Raft entry for the store: its index, and its command if it carries one.
pub type Applied<'a> = (u64, Option<&'a Command>);

/// What applying one entry produced: `None` without a command (or when applied before).
pub type Outcome = Option<Result<CommandResponse, KvError>>;

impl<B: Backend> Store<B> {
    /// Opens the store, rebuilding the index from the backend's history.
    pub fn open(backend: B) -> Result<Store<B>, BackendError> {
        let mut index = Index::default();
        let meta;
        {
            let view = backend.view()?;
            meta = view.meta()?;
            let mut last = RevisionId::default();
            let mut ordered = true;
            view.scan(RevisionId::default(), &mut |rev, rec| {
                ordered &= rev > last;
                last = rev;
                let entry = IndexEntry {
                    rev,
                    create: rec.create,
                    version: rec.version,
                    lease: rec.lease,
                    tombstone: rec.tombstone,
                };
                index.push(rec.key, entry);
                true
            })?;
            if !ordered {
                return Err(BackendError("history out of revision order".into()));
            }
        }
        let to_remove = index.compact(meta.compacted);
        let inner = Inner {
            index,
            current: meta.current,
            compacted: meta.compacted,
            applied_index: meta.applied_index,
            compacted_physically: meta.compacted_physically,
            to_remove,
        };
        Ok(Store { backend, inner: RwLock::new(inner), writer: Mutex::new(()) })
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn current_revision(&self) -> Revision {
        self.read().current
    }

    pub fn compacted_revision(&self) -> Revision {
        self.read().compacted
    }

    /// The last Raft index applied; a restart replays the log from the next one.
    pub fn applied_index(&self) -> u64 {
        self.read().applied_index
    }

    pub fn size_bytes(&self) -> u64 {
        self.backend.size_bytes()
    }

    /// Makes everything applied so far durable in the backend; returns the applied index covered.
    pub fn sync(&self) -> Result<u64, BackendError> {
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let applied = self.read().applied_index;
        self.backend.sync()?;
        Ok(applied)
    }

    pub fn key_count(&self) -> usize {
        self.read().index.key_count()
    }

    /// A read at the request's revision (0: the current one).
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, KvError> {
        let inner = self.read();
        // Open the view while holding the lock: records the index references stay in it.
        let view = self.backend.view().map_err(|e| KvError::Backend(e.0))?;
        let reader =
            Reader { index: &inner.index, view: &view, pending: None, compacted: inner.compacted };
        reader.range_at(req, inner.current)
    }

    /// Applies a batch of committed Raft entries in one backend transaction, together with the
    /// applied index. Entries at or below the applied index are skipped (replay after a restart).
    /// Returns each entry's outcome, `None` where there is no command or it was applied before.
    pub fn apply(&self, entries: &[Applied<'_>]) -> Result<Vec<Outcome>, BackendError> {
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let view = self.backend.view()?;
        let mut inner = self.write();
        let applied_before = inner.applied_index;
        let fresh = |i: u64| i > applied_before;
        let Some(last_index) = entries.iter().map(|(i, _)| *i).filter(|i| fresh(*i)).max() else {
            return Ok(entries.iter().map(|_| None).collect());
        };
        let (current, compacted) = (inner.current, inner.compacted);
        let mut exec = Exec {
            index: &mut inner.index,
            view: &view,
            pending: HashMap::new(),
            batch: WriteBatch::default(),
            current,
            compacted,
            compact_to: None,
        };
        let mut results = Vec::with_capacity(entries.len());
        for (raft_index, cmd) in entries {
            let outcome = match cmd {
                Some(cmd) if fresh(*raft_index) => {
                    let r = exec.execute(cmd);
                    if let Err(KvError::Backend(msg)) = &r {
                        return Err(BackendError(msg.clone()));
                    }
                    Some(r)
                }
                _ => None,
            };
            results.push(outcome);
        }
        let (new_current, compact_to, mut batch) = (exec.current, exec.compact_to, exec.batch);
        let compacted_physically = inner.compacted_physically;
        drop(inner);
        batch.meta = Some(Meta {
            applied_index: last_index,
            current: new_current,
            compacted: compact_to.unwrap_or(compacted),
            compacted_physically,
        });
        drop(view);
        self.backend.commit(batch)?;
        let mut inner = self.write();
        inner.current = new_current;
        inner.applied_index = last_index;
        if let Some(c) = compact_to {
            inner.compacted = c;
            let dropped = inner.index.compact(c);
            inner.to_remove.extend(dropped);
        }
        Ok(results)
    }

    /// Removes up to `max` records that compaction made unreachable, in one backend transaction,
    /// so compaction never stops the world. Returns whether work remains.
    pub fn compact_step(&self, max: usize) -> Result<bool, BackendError> {
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let batch = {
            let mut inner = self.write();
            if inner.to_remove.is_empty() && inner.compacted_physically == inner.compacted {
                return Ok(false);
            }
            let n = max.min(inner.to_remove.len());
            let deletes: Vec<RevisionId> = inner.to_remove.drain(..n).collect();
            if inner.to_remove.is_empty() {
                inner.compacted_physically = inner.compacted;
            }
            let meta = Meta {
                applied_index: inner.applied_index,
                current: inner.current,
                compacted: inner.compacted,
                compacted_physically: inner.compacted_physically,
            };
            WriteBatch { puts: Vec::new(), deletes, meta: Some(meta) }
        };
        self.backend.commit(batch)?;
        Ok(!self.physically_compacted())
    }

    /// Whether the history below the compaction revision is physically gone.
    pub fn physically_compacted(&self) -> bool {
        let inner = self.read();
        inner.to_remove.is_empty() && inner.compacted_physically == inner.compacted
    }

    /// Visits committed changes from revision `from` on, in order (for watch replay).
    pub fn history_from(
        &self,
        from: Revision,
        visit: &mut dyn FnMut(RevisionId, crate::backend::Record) -> bool,
    ) -> Result<(), KvError> {
        let inner = self.read();
        if from < inner.compacted {
            return Err(KvError::Compacted);
        }
        let upto = inner.current;
        let view = self.backend.view().map_err(|e| KvError::Backend(e.0))?;
        drop(inner);
        view.scan(RevisionId { main: from, sub: 0 }, &mut |rev, rec| {
            rev.main <= upto && visit(rev, rec)
        })
        .map_err(|e| KvError::Backend(e.0))
    }
}
