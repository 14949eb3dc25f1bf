//! An executable specification of etcd's KV semantics: every key's full history in a map, every
//! read computed from scratch. Slow and obviously right; the store is tested against it.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::range::KeyRange;
use crate::types::*;
use crate::validate;
use crate::KvError;

/// The whole store as plain data.
#[derive(Clone, Debug)]
pub struct Model {
    current: Revision,
    compacted: Revision,
    /// Every change of every key, in order; `None` is a deletion.
    history: BTreeMap<Bytes, Vec<(Revision, Option<KeyValue>)>>,
    /// Every member's latest published attributes.
    members: BTreeMap<u64, MemberAttributes>,
    /// Every lease; the keys it holds are the live keys that name it.
    leases: BTreeMap<LeaseId, Lease>,
    /// Every raised alarm.
    alarms: std::collections::BTreeSet<AlarmMember>,
    /// The auth store.
    auth: crate::auth::AuthState,
}

impl Default for Model {
    fn default() -> Model {
        Model {
            current: Revision::INITIAL,
            compacted: Revision::NEVER_COMPACTED,
            history: BTreeMap::new(),
            members: BTreeMap::new(),
            leases: BTreeMap::new(),
            alarms: std::collections::BTreeSet::new(),
            auth: crate::auth::AuthState::default(),
        }
    }
}

impl Model {
    pub fn current(&self) -> Revision {
        self.current
    }

    /// Every live key at `rev`.
    fn state(&self, rev: Revision) -> BTreeMap<Bytes, KeyValue> {
        let mut out = BTreeMap::new();
        for (k, changes) in &self.history {
            if let Some((_, Some(kv))) = changes.iter().rev().find(|(r, _)| *r <= rev) {
                out.insert(k.clone(), kv.clone());
            }
        }
        out
    }

    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, KvError> {
        self.range_in(req, &self.state(self.current), self.current, self.compacted)
    }

    pub fn compacted(&self) -> Revision {
        self.compacted
    }

    /// Every member's published attributes, by member id.
    pub fn members(&self) -> &BTreeMap<u64, MemberAttributes> {
        &self.members
    }

    /// Every raised alarm.
    pub fn alarms(&self) -> &std::collections::BTreeSet<AlarmMember> {
        &self.alarms
    }

    /// Every lease, by id.
    pub fn leases(&self) -> &BTreeMap<LeaseId, Lease> {
        &self.leases
    }

    /// The live keys attached to `id`, in key order.
    pub fn lease_keys(&self, id: LeaseId) -> Vec<Bytes> {
        let state = self.state(self.current);
        state.into_values().filter(|kv| kv.lease == id).map(|kv| kv.key).collect()
    }

    /// A read as it was answered when the store stood at revision `current` with reads below
    /// `compacted` refused: the history only grows, so every earlier state can be read back.
    /// A checker uses it to verify reads answered while the model had applied less than now.
    pub fn range_as_of(
        &self,
        req: &RangeRequest,
        current: Revision,
        compacted: Revision,
    ) -> Result<RangeResponse, KvError> {
        self.range_in(req, &self.state(current), current, compacted)
    }

    /// A read where `latest` is the newest state (it may include a transaction's own writes).
    fn range_in(
        &self,
        req: &RangeRequest,
        latest: &BTreeMap<Bytes, KeyValue>,
        current: Revision,
        compacted: Revision,
    ) -> Result<RangeResponse, KvError> {
        let rev = if req.revision.0 <= 0 { current } else { req.revision };
        if rev > current {
            return Err(KvError::FutureRev);
        }
        if rev < compacted {
            return Err(KvError::Compacted);
        }
        let state = if rev == current { latest.clone() } else { self.state(rev) };
        let range = KeyRange::new(&req.key, &req.range_end);
        let mut kvs: Vec<KeyValue> =
            state.into_values().filter(|kv| range.contains(&kv.key)).collect();
        let count = kvs.len() as i64;
        if req.count_only {
            return Ok(RangeResponse { revision: current, kvs: vec![], more: false, count });
        }
        kvs.retain(|kv| {
            let ok = |min: Revision, max: Revision, v: Revision| {
                (min.0 == 0 || v >= min) && (max.0 == 0 || v <= max)
            };
            ok(req.min_mod_revision, req.max_mod_revision, kv.mod_revision)
                && ok(req.min_create_revision, req.max_create_revision, kv.create_revision)
        });
        let key_of = |kv: &KeyValue| -> (i64, Bytes) {
            match req.sort_target {
                SortTarget::Key => (0, kv.key.clone()),
                SortTarget::Version => (kv.version, Bytes::new()),
                SortTarget::Create => (kv.create_revision.0, Bytes::new()),
                SortTarget::Mod => (kv.mod_revision.0, Bytes::new()),
                SortTarget::Value => (0, kv.value.clone()),
            }
        };
        let order = match (req.sort_order, req.sort_target) {
            (SortOrder::None, SortTarget::Key) => SortOrder::None,
            (SortOrder::None, _) => SortOrder::Ascend,
            (o, _) => o,
        };
        match order {
            SortOrder::None => {}
            SortOrder::Ascend => kvs.sort_by_key(key_of),
            SortOrder::Descend => kvs.sort_by_key(|kv| std::cmp::Reverse(key_of(kv))),
        }
        let more = req.limit > 0 && kvs.len() as i64 > req.limit;
        if more {
            kvs.truncate(req.limit as usize);
        }
        if req.keys_only {
            kvs.iter_mut().for_each(|kv| kv.value = Bytes::new());
        }
        Ok(RangeResponse { revision: current, kvs, more, count })
    }

    /// Every change from revision `from` on, by revision, each revision's changes in key order
    /// (a key changed twice in one revision, in the order it changed): `(revision, key, the
    /// key's state after (None: deleted), its state before the revision)`. What a watcher from
    /// `from` must receive (etcd reads an event's prev_kv at the revision before); refused below
    /// the compaction point, as watches are.
    #[allow(clippy::type_complexity)]
    pub fn changes_from(
        &self,
        from: Revision,
    ) -> Result<Vec<(Revision, Bytes, Option<KeyValue>, Option<KeyValue>)>, KvError> {
        if from < self.compacted {
            return Err(KvError::Compacted);
        }
        let mut out = Vec::new();
        for (key, changes) in &self.history {
            for (i, (rev, state)) in changes.iter().enumerate() {
                if *rev < from {
                    continue;
                }
                let before = changes[..i].iter().rev().find(|(r, _)| r < rev);
                let before = before.and_then(|(_, kv)| kv.clone());
                out.push((*rev, key.clone(), state.clone(), before));
            }
        }
        out.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        Ok(out)
    }

    /// The auth store.
    pub fn auth(&self) -> &crate::auth::AuthState {
        &self.auth
    }

    /// Applies a mutating command; on error nothing changes.
    ///
    /// Members (beside the key space): a publish sets name and client URLs unless the member
    /// was removed; the membership sets peer URLs or marks members removed.
    pub fn apply(&mut self, cmd: &Command) -> Result<CommandResponse, KvError> {
        self.apply_at(0, cmd)
    }

    /// [`Model::apply`] of the command at Raft index `index`, which a grant records (see
    /// [`Lease::grant_index`]).
    pub fn apply_at(&mut self, index: u64, cmd: &Command) -> Result<CommandResponse, KvError> {
        if let Command::Authorized { caller, command } = cmd {
            self.auth.authorize(caller, command, |id| self.lease_keys(id))?;
            return self.apply_at(index, command);
        }
        let mut scratch = self.clone();
        let mut tx =
            Tx { state: scratch.state(scratch.current), rev: scratch.current.next(), writes: 0 };
        let resp = match cmd {
            Command::Put(p) => scratch.put(&mut tx, p, true).map(CommandResponse::Put),
            Command::DeleteRange(d) => Ok(CommandResponse::DeleteRange(scratch.delete(&mut tx, d))),
            Command::Txn(t) => {
                validate::check_txn(t, usize::MAX)?;
                let before = tx.state.clone();
                scratch.precheck(t, &before)?;
                scratch.txn(&mut tx, t, &before).map(CommandResponse::Txn)
            }
            Command::Compact(c) => {
                if c.revision <= scratch.compacted {
                    return Err(KvError::Compacted);
                }
                if c.revision > scratch.current {
                    return Err(KvError::FutureRev);
                }
                scratch.compacted = c.revision;
                Ok(CommandResponse::Compact(CompactResponse { revision: scratch.current }))
            }
            Command::PublishMember { member, attributes } => {
                publish_member(&mut scratch.members, *member, attributes);
                Ok(CommandResponse::PublishMember)
            }
            Command::Membership { peers, removed } => {
                apply_membership(&mut scratch.members, peers, removed);
                Ok(CommandResponse::Membership)
            }
            Command::LeaseGrant { .. }
            | Command::LeaseRevoke { .. }
            | Command::LeaseExpire { .. }
            | Command::LeaseCheckpoint { .. }
            | Command::LeaseGrantCheckpoint { .. } => scratch.lease(&mut tx, cmd, index),
            Command::AlarmActivate(a) if a.alarm == AlarmType::None => {
                Ok(CommandResponse::Alarm(None))
            }
            Command::AlarmActivate(a) => {
                scratch.alarms.insert(*a);
                Ok(CommandResponse::Alarm(Some(*a)))
            }
            Command::AlarmDeactivate(a) => {
                Ok(CommandResponse::Alarm(scratch.alarms.remove(a).then_some(*a)))
            }
            Command::Auth(change) => {
                scratch.auth.apply(change)?;
                let auth_revision = scratch.auth.revision;
                Ok(CommandResponse::Auth { revision: scratch.current, auth_revision })
            }
            Command::Authorized { .. } => Err(crate::auth::AuthError::PermissionDenied.into()),
        }?;
        if tx.writes > 0 {
            scratch.current = tx.rev;
        }
        *self = scratch;
        Ok(resp)
    }

    /// The lease commands' part of [`Model::apply`].
    fn lease(
        &mut self,
        tx: &mut Tx,
        cmd: &Command,
        index: u64,
    ) -> Result<CommandResponse, KvError> {
        match cmd {
            Command::LeaseGrant { id, ttl } => {
                if self.leases.contains_key(id) {
                    return Err(KvError::LeaseExist);
                }
                let lease = Lease { id: *id, ttl: *ttl, remaining_ttl: 0, grant_index: index };
                self.leases.insert(*id, lease);
                Ok(CommandResponse::LeaseGrant { revision: self.current, lease })
            }
            Command::LeaseExpire { id, grant_index } => {
                // Only the grant the leader found expired; a later one under the id stays.
                if self.leases.get(id).is_none_or(|l| l.grant_index != *grant_index) {
                    return Err(KvError::LeaseNotFound);
                }
                self.lease(tx, &Command::LeaseRevoke { id: *id }, index)
            }
            Command::LeaseRevoke { id } => {
                if self.leases.remove(id).is_none() {
                    return Err(KvError::LeaseNotFound);
                }
                for key in self.lease_keys(*id) {
                    self.record(tx, key, None);
                }
                let revision = if tx.writes > 0 { tx.rev } else { self.current };
                Ok(CommandResponse::LeaseRevoke { revision })
            }
            Command::LeaseCheckpoint { checkpoints } => {
                for (id, remaining) in checkpoints {
                    if let Some(l) = self.leases.get_mut(id) {
                        l.remaining_ttl = *remaining;
                    }
                }
                Ok(CommandResponse::LeaseCheckpoint)
            }
            Command::LeaseGrantCheckpoint { checkpoints } => {
                // Only on the grant each was taken for; a later one under the id keeps its own.
                for c in checkpoints {
                    if let Some(l) = self.leases.get_mut(&c.id) {
                        if l.grant_index == c.grant_index {
                            l.remaining_ttl = c.remaining;
                        }
                    }
                }
                Ok(CommandResponse::LeaseCheckpoint)
            }
            _ => unreachable!("only lease commands come here"),
        }
    }

    fn put(
        &mut self,
        tx: &mut Tx,
        p: &PutRequest,
        check_lease: bool,
    ) -> Result<PutResponse, KvError> {
        let prev = tx.state.get(&p.key).cloned();
        if (p.ignore_value || p.ignore_lease) && prev.is_none() {
            return Err(KvError::KeyNotFound);
        }
        if check_lease && p.lease.0 != 0 && !p.ignore_lease && !self.leases.contains_key(&p.lease) {
            return Err(KvError::LeaseNotFound);
        }
        let kv = KeyValue {
            key: p.key.clone(),
            create_revision: prev.as_ref().map_or(tx.rev, |x| x.create_revision),
            mod_revision: tx.rev,
            version: prev.as_ref().map_or(1, |x| x.version + 1),
            value: if p.ignore_value {
                prev.as_ref().map(|x| x.value.clone()).unwrap_or_default()
            } else {
                p.value.clone()
            },
            lease: if p.ignore_lease {
                prev.as_ref().map_or(LeaseId(0), |x| x.lease)
            } else {
                p.lease
            },
        };
        self.record(tx, p.key.clone(), Some(kv));
        Ok(PutResponse { revision: tx.rev, prev_kv: prev.filter(|_| p.prev_kv) })
    }

    fn delete(&mut self, tx: &mut Tx, d: &DeleteRangeRequest) -> DeleteRangeResponse {
        let range = KeyRange::new(&d.key, &d.range_end);
        let doomed: Vec<KeyValue> =
            tx.state.values().filter(|kv| range.contains(&kv.key)).cloned().collect();
        for kv in &doomed {
            self.record(tx, kv.key.clone(), None);
        }
        let revision = if tx.writes > 0 { tx.rev } else { self.current };
        let deleted = doomed.len() as i64;
        DeleteRangeResponse { revision, deleted, prev_kvs: if d.prev_kv { doomed } else { vec![] } }
    }

    fn record(&mut self, tx: &mut Tx, key: Bytes, kv: Option<KeyValue>) {
        tx.writes += 1;
        match &kv {
            Some(kv) => tx.state.insert(key.clone(), kv.clone()),
            None => tx.state.remove(&key),
        };
        // A key may change twice in one revision: a put in one nested transaction and a delete
        // in a later one pass etcd's duplicate-key check, and a watcher receives both events.
        // Reads take the later state.
        self.history.entry(key).or_default().push((tx.rev, kv));
    }

    fn holds(before: &BTreeMap<Bytes, KeyValue>, c: &Compare) -> bool {
        let range = KeyRange::new(&c.key, &c.range_end);
        let hits: Vec<&KeyValue> = before.values().filter(|kv| range.contains(&kv.key)).collect();
        let check = |ord: std::cmp::Ordering| match c.result {
            CompareResult::Equal => ord.is_eq(),
            CompareResult::NotEqual => ord.is_ne(),
            CompareResult::Greater => ord.is_gt(),
            CompareResult::Less => ord.is_lt(),
        };
        let one = |kv: Option<&KeyValue>| match (&c.target, kv) {
            (CompareTarget::Value(_), None) => false,
            (CompareTarget::Value(v), Some(kv)) => check(kv.value.as_ref().cmp(v.as_ref())),
            (CompareTarget::Version(v), kv) => check(kv.map_or(0, |x| x.version).cmp(v)),
            (CompareTarget::Create(r), kv) => {
                check(kv.map_or(0, |x| x.create_revision.0).cmp(&r.0))
            }
            (CompareTarget::Mod(r), kv) => check(kv.map_or(0, |x| x.mod_revision.0).cmp(&r.0)),
            (CompareTarget::Lease(l), kv) => check(kv.map_or(0, |x| x.lease.0).cmp(&l.0)),
        };
        if hits.is_empty() {
            one(None)
        } else {
            hits.into_iter().all(|kv| one(Some(kv)))
        }
    }

    /// etcd checks the branches that will run, in order, against the state before the
    /// transaction, and fails the whole transaction on the first bad op.
    fn precheck(&self, t: &TxnRequest, before: &BTreeMap<Bytes, KeyValue>) -> Result<(), KvError> {
        let succeeded = t.compare.iter().all(|c| Model::holds(before, c));
        for op in if succeeded { &t.success } else { &t.failure } {
            match op {
                RequestOp::Range(r) if r.revision > self.current => return Err(KvError::FutureRev),
                RequestOp::Range(r) if r.revision.0 > 0 && r.revision < self.compacted => {
                    return Err(KvError::Compacted)
                }
                RequestOp::Put(p)
                    if (p.ignore_value || p.ignore_lease) && !before.contains_key(&p.key) =>
                {
                    return Err(KvError::KeyNotFound)
                }
                RequestOp::Put(p)
                    if p.lease.0 != 0 && !p.ignore_lease && !self.leases.contains_key(&p.lease) =>
                {
                    return Err(KvError::LeaseNotFound)
                }
                RequestOp::Txn(n) => self.precheck(n, before)?,
                _ => {}
            }
        }
        Ok(())
    }

    fn txn(
        &mut self,
        tx: &mut Tx,
        t: &TxnRequest,
        before: &BTreeMap<Bytes, KeyValue>,
    ) -> Result<TxnResponse, KvError> {
        // Every compare, nested ones too, sees the state before the outermost transaction.
        let succeeded = t.compare.iter().all(|c| Model::holds(before, c));
        let mut responses = Vec::new();
        for op in if succeeded { &t.success } else { &t.failure } {
            let read_rev = if tx.writes > 0 { tx.rev } else { self.current };
            responses.push(match op {
                RequestOp::Range(r) => ResponseOp::Range(self.range_in(
                    r,
                    &tx.state.clone(),
                    read_rev,
                    self.compacted,
                )?),
                RequestOp::Put(p) => ResponseOp::Put(self.put(tx, p, true)?),
                RequestOp::DeleteRange(d) => ResponseOp::DeleteRange(self.delete(tx, d)),
                RequestOp::Txn(n) => ResponseOp::Txn(self.txn(tx, n, before)?),
            });
        }
        let revision = if tx.writes > 0 { tx.rev } else { self.current };
        Ok(TxnResponse { revision, succeeded, responses })
    }
}

/// A command in progress: the newest state including its own writes.
struct Tx {
    state: BTreeMap<Bytes, KeyValue>,
    rev: Revision,
    writes: u32,
}

fn publish_member(
    members: &mut BTreeMap<u64, MemberAttributes>,
    member: u64,
    attributes: &MemberAttributes,
) {
    let entry = members.entry(member).or_default();
    if !entry.removed {
        entry.name.clone_from(&attributes.name);
        entry.client_urls.clone_from(&attributes.client_urls);
    }
}

fn apply_membership(
    members: &mut BTreeMap<u64, MemberAttributes>,
    peers: &[(u64, Vec<String>)],
    removed: &[u64],
) {
    for (member, peer_urls) in peers {
        let entry = members.entry(*member).or_default();
        entry.peer_urls.clone_from(peer_urls);
        entry.removed = false;
    }
    for member in removed {
        members.insert(*member, MemberAttributes { removed: true, ..Default::default() });
    }
}
