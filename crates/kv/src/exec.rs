//! Executing mutating commands at apply time, with etcd's semantics.
//!
//! A command runs at revision `current + 1`; each change it makes gets the next sub-revision. If
//! it changes nothing (a failed compare with read-only ops, a delete of nothing) the revision does
//! not move. A transaction's compares, nested ones included, are all evaluated against the state
//! before it (as etcd's `compareToPath`), its chosen branch is checked before anything is written
//! (so a bad op fails the whole transaction), and later ops see earlier ops' writes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;

use crate::auth::AuthState;
use crate::backend::{BackendError, BackendView, Record, WriteBatch};
use crate::index::{Index, IndexEntry};
use crate::lease::LeaseTable;
use crate::range::{self, KeyRange};
use crate::types::*;
use crate::watch::{owned, Event, EventKind};
use crate::KvError;

/// The apply path's view: the index (with this batch's changes), committed records, and the
/// records this batch wrote but has not committed yet.
pub(crate) struct Exec<'a, V: BackendView> {
    pub(crate) index: &'a mut Index,
    pub(crate) view: &'a V,
    pub(crate) pending: HashMap<RevisionId, Record>,
    pub(crate) batch: WriteBatch,
    /// The latest revision, counting this batch's commands.
    pub(crate) current: Revision,
    pub(crate) compacted: Revision,
    /// Set by a Compact command in this batch.
    pub(crate) compact_to: Option<Revision>,
    /// Every member's published attributes, with this batch's changes.
    pub(crate) members: &'a mut BTreeMap<u64, MemberAttributes>,
    /// Raised alarms, changed by alarm commands (beside the key space, as members are).
    pub(crate) alarms: &'a mut std::collections::BTreeSet<crate::types::AlarmMember>,
    /// The events of the command being executed, for watchers.
    pub(crate) events: Vec<Arc<Event>>,
    /// Every lease and the keys it holds, with this batch's changes.
    pub(crate) leases: &'a mut LeaseTable,
    /// The auth store, with this batch's changes.
    pub(crate) auth: &'a mut Arc<AuthState>,
    /// The Raft index of the entry being executed: a grant records it.
    pub(crate) raft_index: u64,
}

/// Reads at a revision: from the index, committed records, and (on the apply path) the records
/// of the batch being applied.
pub(crate) struct Reader<'a, V: BackendView> {
    pub(crate) index: &'a Index,
    pub(crate) view: &'a V,
    pub(crate) pending: Option<&'a HashMap<RevisionId, Record>>,
    pub(crate) compacted: Revision,
}

impl<V: BackendView> Reader<'_, V> {
    fn record(&self, rev: RevisionId) -> Result<Record, KvError> {
        if let Some(r) = self.pending.and_then(|p| p.get(&rev)) {
            return Ok(r.clone());
        }
        self.view
            .get(rev)
            .map_err(KvError::Backend)?
            .ok_or(KvError::Backend(BackendError::MissingRecord(rev)))
    }

    pub(crate) fn kv(
        &self,
        key: &Bytes,
        e: IndexEntry,
        with_value: bool,
    ) -> Result<KeyValue, KvError> {
        let value = if with_value { self.record(e.rev)?.value } else { Bytes::new() };
        Ok(KeyValue {
            key: key.clone(),
            create_revision: e.create,
            mod_revision: e.rev.main,
            version: e.version,
            value,
            lease: e.lease,
        })
    }

    pub(crate) fn range_at(
        &self,
        req: &RangeRequest,
        current: Revision,
    ) -> Result<RangeResponse, KvError> {
        let rev = if req.revision.0 <= 0 { current } else { req.revision };
        if rev > current {
            return Err(KvError::FutureRev);
        }
        if rev < self.compacted {
            return Err(KvError::Compacted);
        }
        let range = KeyRange::new(&req.key, &req.range_end);
        let full = range::needs_full_scan(req);
        let mut count = 0i64;
        let mut hits = Vec::new();
        self.index.range(&range, rev, |k, e| {
            count += 1;
            if !req.count_only && (full || req.limit <= 0 || (hits.len() as i64) <= req.limit) {
                hits.push((k.clone(), e));
            }
            true
        });
        // keys_only skips values, unless they are needed to sort (etcd clears them only after).
        let with_value = !req.keys_only || req.sort_target == SortTarget::Value;
        let mut kvs = Vec::with_capacity(hits.len());
        for (k, e) in hits {
            kvs.push(self.kv(&k, e, with_value)?);
        }
        let more = range::finish(req, &mut kvs);
        Ok(RangeResponse { revision: current, kvs, more, count })
    }
}

/// The changes of one command in progress.
pub(crate) struct Writer {
    rev: Revision,
    sub: u32,
}

impl Writer {
    fn next_id(&mut self) -> RevisionId {
        let id = RevisionId { main: self.rev, sub: self.sub };
        self.sub += 1;
        id
    }

    fn wrote(&self) -> bool {
        self.sub > 0
    }
}

impl<V: BackendView> Exec<'_, V> {
    pub(crate) fn execute(&mut self, cmd: &Command) -> Result<CommandResponse, KvError> {
        let mut w = Writer { rev: self.current.next(), sub: 0 };
        let result = match cmd {
            Command::Put(req) => {
                self.check_put(req)?;
                self.put(&mut w, req).map(CommandResponse::Put)
            }
            Command::DeleteRange(req) => self.delete(&mut w, req).map(CommandResponse::DeleteRange),
            Command::Txn(req) => {
                // Proposers validate, but a transaction that writes a key twice could fail
                // halfway; checking again here keeps every command all-or-nothing.
                crate::validate::check_txn(req, usize::MAX)?;
                self.txn(&mut w, req).map(CommandResponse::Txn)
            }
            Command::Compact(req) => self.compact(req).map(CommandResponse::Compact),
            Command::PublishMember { member, attributes } => {
                // Beside the key space: no revision, no history record.
                let mut changed = self.members.get(member).cloned().unwrap_or_default();
                if !changed.removed {
                    changed.name.clone_from(&attributes.name);
                    changed.client_urls.clone_from(&attributes.client_urls);
                    self.set_member(*member, changed);
                }
                Ok(CommandResponse::PublishMember)
            }
            Command::Membership { peers, removed } => {
                for (member, peer_urls) in peers {
                    let mut changed = self.members.get(member).cloned().unwrap_or_default();
                    changed.peer_urls.clone_from(peer_urls);
                    changed.removed = false;
                    self.set_member(*member, changed);
                }
                for member in removed {
                    self.set_member(
                        *member,
                        MemberAttributes { removed: true, ..Default::default() },
                    );
                }
                Ok(CommandResponse::Membership)
            }
            Command::LeaseGrant { .. }
            | Command::LeaseRevoke { .. }
            | Command::LeaseExpire { .. }
            | Command::LeaseCheckpoint { .. }
            | Command::LeaseGrantCheckpoint { .. } => self.lease(&mut w, cmd),
            Command::AlarmActivate(a) => Ok(self.alarm(*a, true)),
            Command::AlarmDeactivate(a) => Ok(self.alarm(*a, false)),
            Command::Auth(change) => {
                // Beside the key space, as members' attributes: no revision, no history.
                let mut next = AuthState::clone(self.auth);
                next.apply(change)?;
                self.batch.auth = Some(next.encode());
                let auth_revision = next.revision;
                *self.auth = Arc::new(next);
                Ok(CommandResponse::Auth { revision: self.current, auth_revision })
            }
            Command::Authorized { caller, command } => {
                let leases = &*self.leases;
                self.auth.authorize(caller, command, |id| leases.keys(id))?;
                return self.execute(command);
            }
        };
        if w.wrote() {
            self.current = w.rev;
        }
        result
    }

    /// etcd's alarm apply: activating NONE does nothing; activating answers the alarm even if
    /// it was raised already; deactivating answers it only if it was raised.
    fn alarm(&mut self, a: crate::types::AlarmMember, activate: bool) -> CommandResponse {
        let changed = if activate {
            if a.alarm == crate::types::AlarmType::None {
                return CommandResponse::Alarm(None);
            }
            self.alarms.insert(a);
            true
        } else {
            self.alarms.remove(&a)
        };
        if changed {
            self.batch.alarms = Some(crate::backend::encode_alarms(self.alarms));
        }
        CommandResponse::Alarm(changed.then_some(a))
    }

    fn set_member(&mut self, member: u64, attributes: MemberAttributes) {
        self.batch.members.push((member, attributes.encode()));
        self.members.insert(member, attributes);
    }

    /// The revision reads see: including this command's writes once it made any.
    pub(crate) fn read_rev(&self, w: &Writer) -> Revision {
        if w.wrote() {
            w.rev
        } else {
            self.current
        }
    }

    pub(crate) fn reader(&self) -> Reader<'_, V> {
        Reader {
            index: self.index,
            view: self.view,
            pending: Some(&self.pending),
            compacted: self.compacted,
        }
    }

    fn kv(&self, key: &Bytes, e: IndexEntry, with_value: bool) -> Result<KeyValue, KvError> {
        self.reader().kv(key, e, with_value)
    }

    /// The prev_kv of a delete event: the key's state at the revision before, as etcd reads it
    /// for watchers, which differs from `in_txn` (the state the delete saw) only when an
    /// earlier nested transaction of the same request put the key.
    fn event_prev(
        &self,
        w: &Writer,
        key: &Bytes,
        in_txn: &KeyValue,
    ) -> Result<Option<KeyValue>, KvError> {
        if !w.wrote() || in_txn.mod_revision != w.rev {
            return Ok(Some(in_txn.clone()));
        }
        self.index.get(key, self.current).map(|e| self.kv(key, e, true)).transpose()
    }

    fn write(&mut self, id: RevisionId, key: Bytes, record: Record) {
        let entry = IndexEntry::of(id, &record);
        self.batch.puts.push((id, record.encode()));
        self.pending.insert(id, record);
        self.index.push(key, entry);
    }

    fn check_put(&self, req: &PutRequest) -> Result<(), KvError> {
        if (req.ignore_value || req.ignore_lease)
            && self.index.get(&req.key, self.current).is_none()
        {
            return Err(KvError::KeyNotFound);
        }
        if req.lease.0 != 0 && !req.ignore_lease && !self.leases.contains(req.lease) {
            return Err(KvError::LeaseNotFound);
        }
        Ok(())
    }

    fn put(&mut self, w: &mut Writer, req: &PutRequest) -> Result<PutResponse, KvError> {
        let prev = self.index.get(&req.key, self.read_rev(w));
        let prev_kv = match prev {
            Some(e) => Some(self.kv(&req.key, e, true)?),
            None => None,
        };
        let value = match (&prev_kv, req.ignore_value) {
            (Some(p), true) => p.value.clone(),
            (None, true) => return Err(KvError::KeyNotFound),
            (_, false) => req.value.clone(),
        };
        let lease = match (&prev_kv, req.ignore_lease) {
            (Some(p), true) => p.lease,
            (None, true) => return Err(KvError::KeyNotFound),
            (_, false) => req.lease,
        };
        let id = w.next_id();
        let record = Record {
            key: req.key.clone(),
            value,
            create: prev.map_or(id.main, |p| p.create),
            version: prev.map_or(1, |p| p.version + 1),
            lease,
            tombstone: false,
        };
        let kv = KeyValue {
            key: req.key.clone(),
            create_revision: record.create,
            mod_revision: id.main,
            version: record.version,
            value: record.value.clone(),
            lease: record.lease,
        };
        if prev.map(|p| p.lease) != Some(lease) {
            if let Some(p) = prev {
                self.leases.detach(p.lease, &req.key);
            }
            self.leases.attach(lease, &req.key);
        }
        self.write(id, req.key.clone(), record);
        let event_prev = prev_kv.clone().map(owned);
        self.events.push(Arc::new(Event::new(EventKind::Put, owned(kv), event_prev)));
        Ok(PutResponse { revision: id.main, prev_kv: prev_kv.filter(|_| req.prev_kv) })
    }

    pub(crate) fn delete(
        &mut self,
        w: &mut Writer,
        req: &DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, KvError> {
        let range = KeyRange::new(&req.key, &req.range_end);
        let mut live = Vec::new();
        self.index.range(&range, self.read_rev(w), |k, e| {
            live.push((k.clone(), e));
            true
        });
        let mut prev_kvs = Vec::new();
        for (key, e) in &live {
            let prev = self.kv(key, *e, true)?;
            if req.prev_kv {
                prev_kvs.push(prev.clone());
            }
            let id = w.next_id();
            self.leases.detach(e.lease, key);
            let kv = KeyValue { key: key.clone(), mod_revision: id.main, ..KeyValue::default() };
            let event_prev = self.event_prev(w, key, &prev)?.map(owned);
            self.events.push(Arc::new(Event::new(EventKind::Delete, owned(kv), event_prev)));
            let record = Record {
                key: key.clone(),
                value: Bytes::new(),
                create: Revision(0),
                version: 0,
                lease: LeaseId(0),
                tombstone: true,
            };
            self.write(id, key.clone(), record);
        }
        Ok(DeleteRangeResponse { revision: self.read_rev(w), deleted: live.len() as i64, prev_kvs })
    }

    fn compare(&self, c: &Compare) -> bool {
        let range = KeyRange::new(&c.key, &c.range_end);
        let mut entries = Vec::new();
        self.index.range(&range, self.current, |k, e| {
            entries.push((k.clone(), e));
            true
        });
        if entries.is_empty() {
            // A missing key compares as zero, except that a value compare is false.
            return match &c.target {
                CompareTarget::Value(_) => false,
                other => compare_missing(other, c.result),
            };
        }
        entries.iter().all(|(k, e)| match &c.target {
            CompareTarget::Version(v) => holds(e.version.cmp(v), c.result),
            CompareTarget::Create(r) => holds(e.create.cmp(r), c.result),
            CompareTarget::Mod(r) => holds(e.rev.main.cmp(r), c.result),
            CompareTarget::Lease(l) => holds(e.lease.cmp(l), c.result),
            CompareTarget::Value(v) => self
                .kv(k, *e, true)
                .is_ok_and(|kv| holds(kv.value.as_ref().cmp(v.as_ref()), c.result)),
        })
    }

    /// Evaluates every compare of `txn` and its nested transactions against the state before it,
    /// in depth-first order of the branches that will run.
    fn path(&self, txn: &TxnRequest, out: &mut Vec<bool>) {
        let ok = txn.compare.iter().all(|c| self.compare(c));
        out.push(ok);
        for op in if ok { &txn.success } else { &txn.failure } {
            if let RequestOp::Txn(nested) = op {
                self.path(nested, out);
            }
        }
    }

    /// Checks the branches that will run before anything is written.
    fn check_path(
        &self,
        txn: &TxnRequest,
        path: &mut std::slice::Iter<'_, bool>,
    ) -> Result<(), KvError> {
        let ok = path.next().copied().unwrap_or(false);
        for op in if ok { &txn.success } else { &txn.failure } {
            match op {
                RequestOp::Range(r) => {
                    // etcd checks against the revision before the transaction, even though
                    // the transaction's own writes will be visible at the next one.
                    if r.revision > self.current {
                        return Err(KvError::FutureRev);
                    }
                    if r.revision.0 > 0 && r.revision < self.compacted {
                        return Err(KvError::Compacted);
                    }
                }
                RequestOp::Put(p) => self.check_put(p)?,
                RequestOp::DeleteRange(_) => {}
                RequestOp::Txn(nested) => self.check_path(nested, path)?,
            }
        }
        Ok(())
    }

    fn txn(&mut self, w: &mut Writer, req: &TxnRequest) -> Result<TxnResponse, KvError> {
        let mut path = Vec::new();
        self.path(req, &mut path);
        self.check_path(req, &mut path.iter())?;
        let resp = self.run_txn(w, req, &mut path.into_iter())?;
        Ok(TxnResponse { revision: self.read_rev(w), ..resp })
    }

    fn run_txn(
        &mut self,
        w: &mut Writer,
        req: &TxnRequest,
        path: &mut std::vec::IntoIter<bool>,
    ) -> Result<TxnResponse, KvError> {
        let succeeded = path.next().unwrap_or(false);
        let mut responses = Vec::new();
        for op in if succeeded { &req.success } else { &req.failure } {
            let resp = match op {
                RequestOp::Range(r) => {
                    ResponseOp::Range(self.reader().range_at(r, self.read_rev(w))?)
                }
                RequestOp::Put(p) => ResponseOp::Put(self.put(w, p)?),
                RequestOp::DeleteRange(d) => ResponseOp::DeleteRange(self.delete(w, d)?),
                RequestOp::Txn(t) => {
                    let nested = self.run_txn(w, t, path)?;
                    ResponseOp::Txn(TxnResponse { revision: self.read_rev(w), ..nested })
                }
            };
            responses.push(resp);
        }
        Ok(TxnResponse { revision: self.read_rev(w), succeeded, responses })
    }

    fn compact(&mut self, req: &CompactRequest) -> Result<CompactResponse, KvError> {
        if req.revision <= self.compacted {
            return Err(KvError::Compacted);
        }
        if req.revision > self.current {
            return Err(KvError::FutureRev);
        }
        self.compact_to = Some(req.revision);
        // Later commands of this batch already read above the new floor.
        self.compacted = req.revision;
        Ok(CompactResponse { revision: self.current })
    }
}

fn holds(ord: std::cmp::Ordering, result: CompareResult) -> bool {
    use std::cmp::Ordering::*;
    match result {
        CompareResult::Equal => ord == Equal,
        CompareResult::NotEqual => ord != Equal,
        CompareResult::Greater => ord == Greater,
        CompareResult::Less => ord == Less,
    }
}

fn compare_missing(target: &CompareTarget, result: CompareResult) -> bool {
    let ord = match target {
        CompareTarget::Version(v) => 0.cmp(v),
        CompareTarget::Create(r) | CompareTarget::Mod(r) => 0.cmp(&r.0),
        CompareTarget::Lease(l) => 0.cmp(&l.0),
        CompareTarget::Value(_) => return false,
    };
    holds(ord, result)
}
