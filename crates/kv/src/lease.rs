//! Leases in the replicated state: which exist, their TTLs and last checkpoints, and which keys
//! each holds. Deterministic like the rest of the store; when a lease expires is decided by the
//! leader's clock elsewhere and arrives here as a revoke.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;

use crate::backend::{encode_lease, BackendView};
use crate::exec::{Exec, Writer};
use crate::index::Index;
use crate::types::{Command, CommandResponse, DeleteRangeRequest, GrantCheckpoint, Lease, LeaseId};
use crate::KvError;

/// Every lease and the live keys attached to each.
#[derive(Clone, Debug, Default)]
pub struct LeaseTable {
    leases: BTreeMap<LeaseId, Lease>,
    keys: HashMap<LeaseId, BTreeSet<Bytes>>,
}

impl LeaseTable {
    /// The table of a store holding `leases`, with the keys `index` attaches to them (its live
    /// keys at the latest revision).
    pub(crate) fn rebuild(leases: BTreeMap<LeaseId, Lease>, index: &Index) -> LeaseTable {
        let mut t = LeaseTable { leases, keys: HashMap::new() };
        for (key, entries) in index.iter() {
            if let Some(e) = entries.last().filter(|e| !e.tombstone && e.lease.0 != 0) {
                t.attach(e.lease, key);
            }
        }
        t
    }

    pub fn get(&self, id: LeaseId) -> Option<Lease> {
        self.leases.get(&id).copied()
    }

    pub fn contains(&self, id: LeaseId) -> bool {
        self.leases.contains_key(&id)
    }

    pub fn all(&self) -> &BTreeMap<LeaseId, Lease> {
        &self.leases
    }

    pub fn len(&self) -> usize {
        self.leases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// The keys `id` holds, in key order.
    pub fn keys(&self, id: LeaseId) -> Vec<Bytes> {
        self.keys.get(&id).map(|k| k.iter().cloned().collect()).unwrap_or_default()
    }

    /// Up to `max` leases from `from` on, in id order (for work spread over time).
    pub fn page(&self, from: LeaseId, max: usize) -> Vec<Lease> {
        self.leases.range(from..).take(max).map(|(_, l)| *l).collect()
    }

    pub(crate) fn attach(&mut self, id: LeaseId, key: &Bytes) {
        if id.0 != 0 {
            self.keys.entry(id).or_default().insert(key.clone());
        }
    }

    pub(crate) fn detach(&mut self, id: LeaseId, key: &Bytes) {
        if let Some(keys) = self.keys.get_mut(&id) {
            keys.remove(key);
            if keys.is_empty() {
                self.keys.remove(&id);
            }
        }
    }
}

impl<V: BackendView> Exec<'_, V> {
    /// The lease commands' part of [`Exec::execute`].
    pub(crate) fn lease(
        &mut self,
        w: &mut Writer,
        cmd: &Command,
    ) -> Result<CommandResponse, KvError> {
        match cmd {
            Command::LeaseGrant { id, ttl } => self.lease_grant(*id, *ttl),
            Command::LeaseRevoke { id } => self.lease_revoke(w, *id),
            Command::LeaseExpire { id, grant_index } => self.lease_expire(w, *id, *grant_index),
            Command::LeaseCheckpoint { checkpoints } => Ok(self.lease_checkpoint(checkpoints)),
            Command::LeaseGrantCheckpoint { checkpoints } => {
                Ok(self.lease_grant_checkpoint(checkpoints))
            }
            _ => unreachable!("only lease commands come here"),
        }
    }

    fn lease_grant(&mut self, id: LeaseId, ttl: i64) -> Result<CommandResponse, KvError> {
        if self.leases.contains(id) {
            return Err(KvError::LeaseExist);
        }
        let lease = Lease { id, ttl, remaining_ttl: 0, grant_index: self.raft_index };
        self.leases.leases.insert(id, lease);
        self.batch.leases.push((id, Some(encode_lease(&lease))));
        Ok(CommandResponse::LeaseGrant { revision: self.current, lease })
    }

    /// Deletes every key the lease holds in this command's revision (in key order, as etcd),
    /// then the lease.
    fn lease_revoke(&mut self, w: &mut Writer, id: LeaseId) -> Result<CommandResponse, KvError> {
        if !self.leases.contains(id) {
            return Err(KvError::LeaseNotFound);
        }
        for key in self.leases.keys(id) {
            self.delete(w, &DeleteRangeRequest { key, ..DeleteRangeRequest::default() })?;
        }
        self.leases.leases.remove(&id);
        self.leases.keys.remove(&id);
        self.batch.leases.push((id, None));
        Ok(CommandResponse::LeaseRevoke { revision: self.read_rev(w) })
    }

    /// The leader's revoke of the grant at `grant_index` ([`crate::Command::LeaseExpire`]):
    /// a later grant under the same id is not the lease it found expired.
    fn lease_expire(
        &mut self,
        w: &mut Writer,
        id: LeaseId,
        grant_index: u64,
    ) -> Result<CommandResponse, KvError> {
        if self.leases.get(id).is_none_or(|l| l.grant_index != grant_index) {
            return Err(KvError::LeaseNotFound);
        }
        self.lease_revoke(w, id)
    }

    fn lease_checkpoint(&mut self, checkpoints: &[(LeaseId, i64)]) -> CommandResponse {
        for (id, remaining) in checkpoints {
            self.record_remaining(*id, None, *remaining);
        }
        CommandResponse::LeaseCheckpoint
    }

    /// Checkpoints of the grants they were taken for ([`crate::Command::LeaseGrantCheckpoint`]):
    /// a later grant under the same id counts down from its own start, not from this.
    fn lease_grant_checkpoint(&mut self, checkpoints: &[GrantCheckpoint]) -> CommandResponse {
        for c in checkpoints {
            self.record_remaining(c.id, Some(c.grant_index), c.remaining);
        }
        CommandResponse::LeaseCheckpoint
    }

    /// Sets a lease's remaining TTL and stores it, if the lease exists and, when `grant` names
    /// one, is that grant.
    fn record_remaining(&mut self, id: LeaseId, grant: Option<u64>, remaining: i64) {
        let Some(l) = self.leases.leases.get_mut(&id) else { return };
        if grant.is_some_and(|g| g != l.grant_index) {
            return;
        }
        l.remaining_ttl = remaining;
        let encoded = encode_lease(l);
        self.batch.leases.push((id, Some(encoded)));
    }
}
