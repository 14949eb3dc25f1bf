//! The MVCC store: the key index in memory, the history in a [`Backend`].
//!
//! Applying committed commands is split in two so the backend's commit (and its fsync) leaves the
//! write path, as etcd's batched bbolt commits do:
//! 1. [`Store::execute`], under the index write lock: run the commands. Their index entries and
//!    revisions are visible to reads at once; their records wait in an in-memory overlay until
//!    committed. The outcomes are final: the commands are committed in the Raft log (whose WAL
//!    is the durability point), and execution is deterministic.
//! 2. [`Store::commit`], later and for several executions at once: write the records and the meta
//!    (applied index, revisions) in one backend transaction, then drop them from the overlay.
//!    After a crash the store holds the last committed state and the WAL replays the rest.
//!
//! A reader takes the read lock, opens a backend view, and reads records from the overlay or the
//! view. Records leave the overlay only after they are committed, under the write lock, so a
//! reader always finds what its index entries point to; physical compaction only removes records
//! the index no longer references.
//!
//! [`Store::install`] replaces the whole state with a snapshot image (`store/image.rs` has it,
//! [`Store::image`] and [`Store::hash_kv`]). Executions prepared before an install describe the
//! state it replaced, so each [`Prepared`] carries the store's epoch, which an install advances,
//! and [`Store::commit`] drops batches of an earlier epoch.

mod events;
mod image;
mod read;

pub use events::History;
pub use read::{RangeRead, KV_OVERHEAD_BYTES};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::auth::AuthState;

use crate::backend::{Backend, BackendError, BackendView, Meta, Record, WriteBatch};
use crate::exec::{Exec, Reader};
use crate::index::{Index, IndexEntry};
use crate::lease::LeaseTable;
use crate::types::{
    AlarmMember, Command, CommandResponse, MemberAttributes, RangeRequest, RangeResponse, Revision,
    RevisionId,
};
use crate::types::{Lease, LeaseId};
use crate::watch::{EventRing, RevisionEvents, RING_BYTES};
use crate::KvError;

#[derive(Debug)]
struct Inner {
    index: Index,
    /// Committed state: what the backend holds. Invariant: every revision up to `current` is
    /// committed in the backend.
    current: Revision,
    compacted: Revision,
    applied_index: u64,
    compacted_physically: Revision,
    /// Executed state, what reads see: ahead of the committed state by the executions whose
    /// records are still in `unflushed`.
    exec_current: Revision,
    exec_compacted: Revision,
    exec_applied: u64,
    /// Records executed and not yet committed.
    unflushed: HashMap<RevisionId, Record>,
    /// Records dropped from the index and not yet removed from the backend.
    to_remove: Vec<RevisionId>,
    /// An index compaction in progress: its revision and the key to resume at.
    index_compaction: Option<(Revision, Option<bytes::Bytes>)>,
    /// Installs so far. Invariant: changes only under the writer mutex and the write lock.
    epoch: u64,
    /// Every member's published attributes, as executed (what reads see).
    members: BTreeMap<u64, MemberAttributes>,
    /// The events of the latest executed revisions, for watchers.
    ring: EventRing,
    /// Every lease and the keys it holds, as executed.
    leases: LeaseTable,
    /// Every raised alarm, as executed.
    alarms: BTreeSet<AlarmMember>,
    /// The auth store, as executed; shared with checkers, copied when a change is executed.
    auth: Arc<AuthState>,
}

impl Inner {
    /// A reader of the executed state over `view`, which must have been opened under the lock
    /// that guards `self`: every record the index references is then in the overlay or in it.
    fn reader<'a, V: BackendView>(&'a self, view: &'a V) -> Reader<'a, V> {
        Reader {
            index: &self.index,
            view,
            pending: Some(&self.unflushed),
            compacted: self.exec_compacted,
        }
    }

    /// The state of a backend holding `index`'s history, `members` and `meta`: nothing
    /// executed beyond it.
    fn new(
        mut index: Index,
        members: BTreeMap<u64, MemberAttributes>,
        leases: BTreeMap<LeaseId, Lease>,
        alarms: BTreeSet<AlarmMember>,
        auth: AuthState,
        meta: Meta,
        epoch: u64,
    ) -> Inner {
        // The history may hold records a compaction made unreachable but did not remove yet.
        let to_remove = index.compact(meta.compacted);
        let leases = LeaseTable::rebuild(leases, &index);
        Inner {
            index,
            current: meta.current,
            compacted: meta.compacted,
            applied_index: meta.applied_index,
            compacted_physically: meta.compacted_physically,
            exec_current: meta.current,
            exec_compacted: meta.compacted,
            exec_applied: meta.applied_index,
            unflushed: HashMap::new(),
            to_remove,
            index_compaction: None,
            epoch,
            members,
            ring: EventRing::new(RING_BYTES),
            leases,
            alarms,
            auth: Arc::new(auth),
        }
    }
}

/// The etcd data model over a backend.
#[derive(Debug)]
pub struct Store<B: Backend> {
    backend: B,
    inner: RwLock<Inner>,
    /// Serializes backend writers (commits and physical compaction).
    writer: Mutex<()>,
    /// The revisions of range reads in progress, whose history compaction keeps for now.
    pins: Arc<read::Pins>,
    /// Whether the executed auth store is enabled: the one check a request makes when it is not.
    auth_enabled: AtomicBool,
    /// `Inner::epoch`, readable without the lock: bumped before an install swaps the backend's
    /// records, for reads that fill values without the lock (store/read.rs).
    installs: AtomicU64,
}

/// One committed Raft entry for the store: its index, and its command if it carries one.
pub type Applied<'a> = (u64, Option<&'a Command>);

/// What applying one entry produced: `None` without a command (or when applied before).
pub type Outcome = Option<Result<CommandResponse, KvError>>;

/// Executed commands waiting for [`Store::commit`].
#[derive(Debug, Default)]
pub struct Prepared {
    batch: WriteBatch,
    applied_index: u64,
    current: Revision,
    compact_to: Option<Revision>,
    /// The store's epoch at execution: an install since makes the batch void.
    epoch: u64,
}

impl Prepared {
    /// The Raft index this batch brings the store to once committed.
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }
}

impl<B: Backend> Store<B> {
    /// Opens the store, rebuilding the index from the backend's history.
    pub fn open(backend: B) -> Result<Store<B>, BackendError> {
        let mut index = Index::default();
        let (meta, members, leases, alarms, auth);
        {
            let view = backend.view()?;
            meta = view.meta()?;
            members = view.members()?;
            leases = view.leases()?;
            alarms = view.alarms()?;
            auth = view.auth()?.map(|raw| AuthState::decode(&raw)).transpose()?.unwrap_or_default();
            let mut last = RevisionId::default();
            let mut ordered = true;
            view.scan(RevisionId::default(), &mut |rev, rec| {
                ordered &= rev > last;
                last = rev;
                let entry = IndexEntry::of(rev, &rec);
                index.push(rec.key, entry);
                true
            })?;
            if !ordered {
                return Err(BackendError::Corrupt("history out of revision order"));
            }
        }
        let auth_enabled = AtomicBool::new(auth.enabled);
        let inner = Inner::new(index, members, leases, alarms, auth, meta, 0);
        Ok(Store {
            backend,
            inner: RwLock::new(inner),
            writer: Mutex::new(()),
            pins: Arc::default(),
            auth_enabled,
            installs: AtomicU64::new(0),
        })
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The revision reads see (everything executed).
    pub fn current_revision(&self) -> Revision {
        self.read().exec_current
    }

    /// The compaction point ([`Revision::NEVER_COMPACTED`] before the first).
    pub fn compacted_revision(&self) -> Revision {
        self.read().exec_compacted
    }

    /// The last Raft index executed: what reads reflect.
    pub fn executed_index(&self) -> u64 {
        self.read().exec_applied
    }

    /// The last Raft index committed to the backend; a restart replays the log from the next one.
    pub fn applied_index(&self) -> u64 {
        self.read().applied_index
    }

    /// The backend's size on disk.
    pub fn size_bytes(&self) -> u64 {
        self.backend.size_bytes()
    }

    /// Of [`Store::size_bytes`], the bytes holding data rather than free pages.
    pub fn size_in_use_bytes(&self) -> u64 {
        self.backend.size_in_use_bytes()
    }

    /// Keys that exist at the current revision.
    pub fn key_count(&self) -> usize {
        self.read().index.key_count()
    }

    /// Makes everything committed so far durable in the backend; returns the applied index covered.
    pub fn sync(&self) -> Result<u64, BackendError> {
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let applied = self.read().applied_index;
        self.backend.sync()?;
        Ok(applied)
    }

    /// Sets the budget of the ring of recent events (default [`RING_BYTES`]); watchers behind
    /// it read the stored history instead. Clears the ring.
    pub fn set_event_ring_bytes(&self, bytes: usize) {
        self.write().ring = EventRing::new(bytes);
    }

    /// A lease, as executed.
    pub fn lease(&self, id: LeaseId) -> Option<Lease> {
        self.read().leases.get(id)
    }

    /// The keys a lease holds, in key order, as executed.
    pub fn lease_keys(&self, id: LeaseId) -> Vec<bytes::Bytes> {
        self.read().leases.keys(id)
    }

    /// How many leases exist.
    pub fn lease_count(&self) -> usize {
        self.read().leases.all().len()
    }

    /// Every lease, in id order, as executed.
    pub fn leases(&self) -> Vec<Lease> {
        self.read().leases.all().values().copied().collect()
    }

    /// Up to `max` leases from `from` on, in id order (work spread over many calls).
    pub fn lease_page(&self, from: LeaseId, max: usize) -> Vec<Lease> {
        self.read().leases.page(from, max)
    }

    /// Every member's published attributes, by member id, as executed.
    pub fn members(&self) -> BTreeMap<u64, MemberAttributes> {
        self.read().members.clone()
    }

    /// Every raised alarm, as executed.
    pub fn alarms(&self) -> BTreeSet<AlarmMember> {
        self.read().alarms.clone()
    }

    /// One member's published attributes, as executed.
    pub fn member(&self, id: u64) -> Option<MemberAttributes> {
        self.read().members.get(&id).cloned()
    }

    /// Whether auth is enabled, as executed: one atomic load.
    pub fn auth_enabled(&self) -> bool {
        self.auth_enabled.load(Ordering::Acquire)
    }

    /// The auth store, as executed.
    pub fn auth(&self) -> Arc<AuthState> {
        self.read().auth.clone()
    }

    /// A read at the request's revision (0: the latest executed one).
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, KvError> {
        let inner = self.read();
        // Open the view while holding the lock: every record the index references is in the
        // overlay or in this view.
        let view = self.backend.view()?;
        inner.reader(&view).range_at(req, inner.exec_current)
    }

    /// Executes committed Raft entries. Entries at or below the executed index are skipped
    /// (replay after a restart). Returns each entry's outcome, and the work to [`Store::commit`].
    pub fn execute(
        &self,
        entries: &[Applied<'_>],
    ) -> Result<(Vec<Outcome>, Prepared), BackendError> {
        let mut guard = self.write();
        // The view must be opened under the lock: a commit drops records from the overlay only
        // under it, so every record is in the overlay or in this view. (Opened before the lock,
        // a concurrent commit could land in between and a record would be in neither.)
        let view = self.backend.view()?;
        let inner = &mut *guard;
        let before = inner.exec_applied;
        let fresh = |i: u64| i > before;
        let Some(last_index) = entries.iter().map(|(i, _)| *i).filter(|i| fresh(*i)).max() else {
            let outcomes = entries.iter().map(|_| None).collect();
            return Ok((
                outcomes,
                Prepared {
                    applied_index: before,
                    current: inner.exec_current,
                    epoch: inner.epoch,
                    ..Prepared::default()
                },
            ));
        };
        let mut exec = Exec {
            index: &mut inner.index,
            view: &view,
            pending: std::mem::take(&mut inner.unflushed),
            batch: WriteBatch::default(),
            current: inner.exec_current,
            compacted: inner.exec_compacted,
            compact_to: None,
            members: &mut inner.members,
            events: Vec::new(),
            leases: &mut inner.leases,
            alarms: &mut inner.alarms,
            auth: &mut inner.auth,
            raft_index: 0,
        };
        let (outcomes, revisions, failure) = execute_all(&mut exec, entries, before);
        self.auth_enabled.store(exec.auth.enabled, Ordering::Release);
        inner.unflushed = std::mem::take(&mut exec.pending);
        if let Some(e) = failure {
            return Err(e);
        }
        let prepared = Prepared {
            batch: exec.batch,
            applied_index: last_index,
            current: exec.current,
            compact_to: exec.compact_to,
            epoch: inner.epoch,
        };
        inner.exec_current = prepared.current;
        inner.exec_applied = last_index;
        for rev in revisions {
            inner.ring.push(rev);
        }
        if let Some(c) = prepared.compact_to {
            inner.exec_compacted = c;
        }
        Ok((outcomes, prepared))
    }

    /// Commits executed work, in execution order, in one backend transaction, then publishes it.
    /// Work executed before an [`Store::install`] is dropped: it belongs to the replaced state.
    pub fn commit(&self, prepared: Vec<Prepared>) -> Result<(), BackendError> {
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        // The epoch is checked under the writer mutex, which an install holds while it replaces
        // the state: checked before it, an install could land between the check and the backend
        // commit, and stale records and meta (an older applied index) would overwrite the image.
        let (compacted, compacted_physically, epoch) = {
            let inner = self.read();
            (inner.compacted, inner.compacted_physically, inner.epoch)
        };
        let prepared: Vec<Prepared> = prepared.into_iter().filter(|p| p.epoch == epoch).collect();
        let Some(last) = prepared.last() else { return Ok(()) };
        let (applied_index, current) = (last.applied_index, last.current);
        let compact_to = prepared.iter().filter_map(|p| p.compact_to).max();
        let compacted = compact_to.unwrap_or(compacted);
        let mut batch = WriteBatch::default();
        let mut written = Vec::new();
        for p in prepared {
            written.extend(p.batch.puts.iter().map(|(rev, _)| *rev));
            batch.puts.extend(p.batch.puts);
            batch.deletes.extend(p.batch.deletes);
            batch.members.extend(p.batch.members);
            batch.leases.extend(p.batch.leases);
            if p.batch.alarms.is_some() {
                batch.alarms = p.batch.alarms;
            }
            if p.batch.auth.is_some() {
                batch.auth = p.batch.auth;
            }
        }
        batch.meta = Some(Meta { applied_index, current, compacted, compacted_physically });
        self.backend.commit(batch)?;
        let mut inner = self.write();
        for rev in written {
            inner.unflushed.remove(&rev);
        }
        inner.current = current;
        inner.applied_index = applied_index;
        if let Some(c) = compact_to {
            // Reads below `c` are refused from now on; the index sheds the history they would
            // have needed in bounded steps (compact_step), never in one long pause.
            inner.compacted = c;
            inner.index_compaction = Some((c, None));
        }
        Ok(())
    }

    /// Executes and commits at once.
    pub fn apply(&self, entries: &[Applied<'_>]) -> Result<Vec<Outcome>, BackendError> {
        let (outcomes, prepared) = self.execute(entries)?;
        self.commit(vec![prepared])?;
        Ok(outcomes)
    }

    /// Removes up to `max` records that compaction made unreachable, in one backend transaction,
    /// so compaction never stops the world. Returns whether work remains.
    pub fn compact_step(&self, max: usize) -> Result<bool, BackendError> {
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let batch = {
            let mut inner = self.write();
            // A read in progress below the compaction point still needs the history it would
            // shed (store/read.rs); the pin is taken under the read lock, so it is seen here.
            if !self.index_compaction_held(&inner) {
                if let Some((at, cursor)) = inner.index_compaction.take() {
                    let (dropped, resume) = inner.index.compact_some(at, cursor.as_ref(), max);
                    inner.to_remove.extend(dropped);
                    inner.index_compaction = resume.map(|k| (at, Some(k)));
                }
            }
            let idle = inner.index_compaction.is_none() && inner.to_remove.is_empty();
            if idle && inner.compacted_physically == inner.compacted {
                return Ok(false);
            }
            let n = max.min(inner.to_remove.len());
            let deletes: Vec<RevisionId> = inner.to_remove.drain(..n).collect();
            if inner.to_remove.is_empty() && inner.index_compaction.is_none() {
                inner.compacted_physically = inner.compacted;
            }
            let meta = Meta {
                applied_index: inner.applied_index,
                current: inner.current,
                compacted: inner.compacted,
                compacted_physically: inner.compacted_physically,
            };
            WriteBatch { deletes, meta: Some(meta), ..WriteBatch::default() }
        };
        self.backend.commit(batch)?;
        Ok(self.compaction_work())
    }

    /// Whether the history below the latest executed compaction is physically gone.
    pub fn physically_compacted(&self) -> bool {
        let inner = self.read();
        inner.to_remove.is_empty()
            && inner.index_compaction.is_none()
            && inner.compacted_physically == inner.exec_compacted
    }

    /// Whether [`Store::compact_step`] has work it can do now (a compaction must be committed
    /// before its history can be removed).
    pub fn compaction_work(&self) -> bool {
        let inner = self.read();
        let index = inner.index_compaction.is_some();
        !inner.to_remove.is_empty()
            || (index && !self.index_compaction_held(&inner))
            || (!index && inner.compacted_physically != inner.compacted)
    }

    /// Whether the index compaction in progress waits for a range read pinned below it: until
    /// the read ends, there is no work (the committer must not spin on it).
    fn index_compaction_held(&self, inner: &Inner) -> bool {
        let lowest = self.pins.lowest();
        inner.index_compaction.as_ref().is_some_and(|(at, _)| lowest.is_some_and(|p| p < *at))
    }
}

/// Runs the fresh entries (index above `before`): each one's outcome, the events of each
/// revision they made, and the backend failure that stopped them, if one did.
fn execute_all<V: BackendView>(
    exec: &mut Exec<'_, V>,
    entries: &[Applied<'_>],
    before: u64,
) -> (Vec<Outcome>, Vec<RevisionEvents>, Option<BackendError>) {
    let mut outcomes = Vec::with_capacity(entries.len());
    let mut revisions = Vec::new();
    for (raft_index, cmd) in entries {
        let outcome = match cmd {
            Some(cmd) if *raft_index > before => {
                let rev_before = exec.current;
                exec.raft_index = *raft_index;
                let r = exec.execute(cmd);
                if let Err(KvError::Backend(e)) = &r {
                    return (outcomes, revisions, Some(e.clone()));
                }
                // A command that wrote nothing (or failed, which writes nothing) has no
                // revision and no events.
                let events = std::mem::take(&mut exec.events);
                if exec.current != rev_before {
                    revisions.push(RevisionEvents { revision: exec.current, events });
                }
                Some(r)
            }
            _ => None,
        };
        outcomes.push(outcome);
    }
    (outcomes, revisions, None)
}
