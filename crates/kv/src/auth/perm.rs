//! etcd's permission checks (`server/auth/store.go` `isOpPermitted`, `range_perm_cache.go`,
//! `server/etcdserver/apply_auth.go`): a user's roles' permissions are merged per type, a
//! one-key request needs a permission covering that key, a range request needs the union of
//! permissions to cover the whole range.

use bytes::Bytes;

use super::{AuthError, AuthState, PermType};
use crate::types::{
    Command, DeleteRangeRequest, LeaseId, PutRequest, RangeRequest, RequestOp, TxnRequest,
};

/// Who asks, as decided from the request (a token today): the user and the auth revision the
/// decision was made at. The default (no user, revision 0) is an anonymous caller, refused every
/// key once auth is on (`ErrUserEmpty`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    /// The user's name; empty when the request named none.
    pub user: String,
    /// The auth revision when the caller was identified.
    pub revision: u64,
}

/// An interval of keys `[begin, end)`; `None` for no end.
type Interval = (Vec<u8>, Option<Vec<u8>>);

/// A request's or a permission's keys as etcd reads them: one key is `[key, key + "\0")`, an
/// end of `"\0"` means no end.
fn interval(key: &[u8], range_end: &[u8]) -> Interval {
    match range_end {
        b"" => (key.to_vec(), Some([key, b"\0"].concat())),
        b"\0" => (key.to_vec(), None),
        end => (key.to_vec(), Some(end.to_vec())),
    }
}

/// `a >= b` for interval ends, where `None` is past every key.
fn end_ge(a: Option<&[u8]>, b: Option<&[u8]>) -> bool {
    match (a, b) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(a), Some(b)) => a >= b,
    }
}

impl AuthState {
    /// Whether `caller` may do `typ` on `key` (one key when `range_end` is empty, else the
    /// range), with etcd's order of checks: no user, a stale revision, an unknown user, root.
    pub fn check(
        &self,
        caller: &Caller,
        key: &[u8],
        range_end: &[u8],
        typ: PermType,
    ) -> Result<(), AuthError> {
        if !self.enabled {
            return Ok(());
        }
        if caller.revision == 0 {
            return Err(AuthError::UserEmpty);
        }
        if caller.revision < self.revision {
            return Err(AuthError::AuthOldRevision);
        }
        let user = self.users.get(&caller.user).ok_or(AuthError::PermissionDenied)?;
        if user.is_root() {
            return Ok(());
        }
        let wanted = |t: PermType| if typ == PermType::Read { t.reads() } else { t.writes() };
        let mut granted: Vec<Interval> = user
            .roles
            .iter()
            .filter_map(|r| self.roles.get(r))
            .flat_map(|r| r.permissions.iter())
            .filter(|p| wanted(p.perm_type))
            .map(|p| interval(&p.key, &p.range_end))
            .collect();
        granted.sort();
        if covers(&granted, key, range_end) {
            Ok(())
        } else {
            Err(AuthError::PermissionDenied)
        }
    }

    /// etcd's `IsAdminPermitted`: auth off, or a known user holding the root role.
    pub fn check_admin(&self, caller: &Caller) -> Result<(), AuthError> {
        if !self.enabled {
            return Ok(());
        }
        if caller.user.is_empty() {
            return Err(AuthError::UserEmpty);
        }
        let user = self.users.get(&caller.user).ok_or(AuthError::UserNotFound)?;
        if user.is_root() {
            Ok(())
        } else {
            Err(AuthError::PermissionDenied)
        }
    }

    /// A range (or a watch on the same keys) needs read on them.
    pub fn check_range(&self, caller: &Caller, req: &RangeRequest) -> Result<(), AuthError> {
        self.check(caller, &req.key, &req.range_end, PermType::Read)
    }

    /// A put needs write on its key, and read too when it asks for the previous value.
    /// (Whether its lease's keys are writable is checked where the leases are known.)
    pub fn check_put(&self, caller: &Caller, req: &PutRequest) -> Result<(), AuthError> {
        self.check(caller, &req.key, &[], PermType::Write)?;
        if req.prev_kv {
            self.check(caller, &req.key, &[], PermType::Read)?;
        }
        Ok(())
    }

    /// A delete needs write on its keys, and read too when it asks for the previous values.
    pub fn check_delete(&self, caller: &Caller, req: &DeleteRangeRequest) -> Result<(), AuthError> {
        self.check(caller, &req.key, &req.range_end, PermType::Write)?;
        if req.prev_kv {
            self.check(caller, &req.key, &req.range_end, PermType::Read)?;
        }
        Ok(())
    }

    /// A transaction needs read on every compare's keys and the rights of every operation in
    /// both branches (whichever runs), nested transactions included. etcd 3.5 skips nested
    /// transactions' operations; checking them keeps them from reaching keys the caller could
    /// not touch directly.
    pub fn check_txn(&self, caller: &Caller, txn: &TxnRequest) -> Result<(), AuthError> {
        for c in &txn.compare {
            self.check(caller, &c.key, &c.range_end, PermType::Read)?;
        }
        for op in txn.success.iter().chain(&txn.failure) {
            match op {
                RequestOp::Range(r) => self.check_range(caller, r)?,
                RequestOp::Put(p) => self.check_put(caller, p)?,
                RequestOp::DeleteRange(d) => self.check_delete(caller, d)?,
                RequestOp::Txn(t) => self.check_txn(caller, t)?,
            }
        }
        Ok(())
    }

    /// Whether `caller` may have `cmd` applied, as etcd's auth applier decides at apply time:
    /// auth changes need a root user, writes and transactions the rights on their keys, a put
    /// with a lease and a lease revoke write on every key the lease holds (`lease_keys`).
    /// Compaction and lease grants are not checked, as in etcd.
    pub fn authorize(
        &self,
        caller: &Caller,
        cmd: &Command,
        lease_keys: impl Fn(LeaseId) -> Vec<Bytes>,
    ) -> Result<(), AuthError> {
        match cmd {
            // Raising or clearing an alarm changes what every client may do: root only. (The
            // alarms a member raises itself are proposed without a caller.)
            Command::Auth(_)
            | Command::AlarmActivate(_)
            | Command::AlarmDeactivate(_)
            | Command::Membership { .. } => self.check_admin(caller),
            Command::Put(p) => {
                self.check(caller, &p.key, &[], PermType::Write)?;
                if p.lease.0 != 0 {
                    self.check_lease_keys(caller, &lease_keys(p.lease))?;
                }
                if p.prev_kv {
                    self.check(caller, &p.key, &[], PermType::Read)?;
                }
                Ok(())
            }
            Command::DeleteRange(d) => self.check_delete(caller, d),
            Command::Txn(t) => self.check_txn(caller, t),
            Command::LeaseRevoke { id } => self.check_lease_keys(caller, &lease_keys(*id)),
            // A caller inside a caller is never proposed; refusing it keeps one identity per
            // command.
            Command::Authorized { .. } => Err(AuthError::PermissionDenied),
            Command::Compact(_)
            | Command::PublishMember { .. }
            | Command::LeaseGrant { .. }
            | Command::LeaseExpire { .. }
            | Command::LeaseCheckpoint { .. }
            | Command::LeaseGrantCheckpoint { .. } => Ok(()),
        }
    }

    /// Revoking a lease (or attaching a key to it) needs write on every key it holds, unless
    /// the caller is a root user.
    pub fn check_lease_keys<'a>(
        &self,
        caller: &Caller,
        keys: impl IntoIterator<Item = &'a Bytes>,
    ) -> Result<(), AuthError> {
        if self.check_admin(caller).is_ok() {
            return Ok(());
        }
        for key in keys {
            self.check(caller, key, &[], PermType::Write)?;
        }
        Ok(())
    }
}

/// Whether the intervals, sorted by their start, cover the request: one key (`range_end`
/// empty) needs an interval holding it, a range needs their union to hold all of it (etcd's
/// `Intersects` and `Contains` on its interval trees). An empty or reversed range is refused
/// unless its first key is held, where etcd finds no interval to visit and refuses.
fn covers(granted: &[Interval], key: &[u8], range_end: &[u8]) -> bool {
    if range_end.is_empty() {
        return granted
            .iter()
            .any(|(b, e)| b.as_slice() <= key && !end_ge(Some(key), e.as_deref()));
    }
    let (begin, end) = interval(key, range_end);
    let mut reached: Option<&[u8]> = Some(&begin);
    let mut advanced = false;
    for (b, e) in granted {
        let Some(at) = reached else { break };
        if b.as_slice() > at {
            break;
        }
        if !end_ge(Some(at), e.as_deref()) {
            reached = e.as_deref();
            advanced = true;
        }
    }
    advanced && end_ge(reached, end.as_deref())
}

#[cfg(test)]
mod tests;
