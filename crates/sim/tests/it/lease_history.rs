//! The lease checks on hand-built histories: what members propose on their own is accepted, and
//! each lease promise, broken once, is caught (revokes that keep keys, puts naming a lease that
//! is gone, keepalives answered otherwise than the model or out of real-time order, expiries
//! before the TTL promised, expired leases left too long after healing).

use bytes::Bytes;
use cairn_kv::model::Model;
use cairn_kv::*;
use cairn_sim::checker::Violation;
use cairn_sim::history::{History, LeaseAnswer, LeaseChange, OpKind, Outcome};
use cairn_sim::leases::{LeaseAck, Leases};

/// Ticks of 19 to 21 units, 10 ticks a second, a grace of 10 ticks: the simulator's clocks.
fn checker() -> Leases {
    Leases::new(19, 21, 100_000, 10)
}

fn put(key: &str, lease: i64) -> Command {
    let (key, value) = (Bytes::from(key.to_string()), Bytes::from_static(b"v"));
    Command::Put(PutRequest { key, value, lease: LeaseId(lease), ..PutRequest::default() })
}

fn all() -> RangeRequest {
    RangeRequest {
        key: Bytes::from_static(b"\0"),
        range_end: Bytes::from_static(b"\0"),
        ..RangeRequest::default()
    }
}

/// A history whose log every member applies as the model does.
struct Log {
    h: History,
    model: Model,
    t: u64,
}

impl Log {
    fn new() -> Log {
        Log { h: History::default(), model: Model::default(), t: 0 }
    }

    fn at(&mut self) -> u64 {
        self.t += 1;
        self.t
    }

    /// Client `op` sends `cmd`, it is committed next and acknowledged.
    fn client(&mut self, op: u64, cmd: Command) -> Result<CommandResponse, KvError> {
        let at = self.at();
        self.h.invoke(op, OpKind::Write(cmd.clone()), at);
        let result = self.append(op, cmd);
        let at = self.at();
        self.h.complete(op, Outcome::Write(result.clone()), at);
        result
    }

    /// A member's own entry under request id `op`.
    fn append(&mut self, op: u64, cmd: Command) -> Result<CommandResponse, KvError> {
        let index = self.h.log_len() + 1;
        let result = self.model.apply_at(index, &cmd);
        self.h.applied(1, index, Some((op, cmd)), Some(result.clone())).expect("as the model");
        result
    }

    /// A lease query asked and answered after the whole log so far.
    fn query(&mut self, op: u64, kind: OpKind, result: Result<LeaseAnswer, KvError>) {
        let at = self.at();
        self.h.invoke(op, kind, at);
        let index = self.h.log_len();
        let outcome = Outcome::Lease { result, at_index: index, answered_index: index };
        let at = self.at();
        self.h.complete(op, outcome, at);
    }
}

fn fails_with<T: std::fmt::Debug>(r: Result<T, Violation>, words: &[&str]) {
    let what = r.expect_err("a violation").0;
    for w in words {
        assert!(what.contains(w), "{what:?} does not mention {w:?}");
    }
}

#[test]
fn expiries_and_checkpoints_members_propose_are_accepted_and_a_revoke_takes_every_key() {
    let mut l = Log::new();
    let lease = Lease { id: LeaseId(5), ttl: 2, remaining_ttl: 0, grant_index: 1 };
    let granted = l.client(1, Command::LeaseGrant { id: lease.id, ttl: 2 });
    assert_eq!(granted, Ok(CommandResponse::LeaseGrant { revision: Revision(1), lease }));
    l.client(2, put("a", 5)).expect("attached");
    l.client(3, put("b", 5)).expect("attached");
    // Request id 3 again: a member's own counter may hand out a client's id.
    l.append(3, Command::LeaseCheckpoint { checkpoints: vec![(LeaseId(5), 1)] }).unwrap();
    l.query(4, OpKind::KeepAlive(LeaseId(5)), Ok(LeaseAnswer::Renewed { ttl: 2 }));
    let revoked = l.append(900, Command::LeaseRevoke { id: LeaseId(5) });
    // Both keys go in one revision, the revoke's.
    assert_eq!(revoked, Ok(CommandResponse::LeaseRevoke { revision: Revision(4) }));
    let before = RangeRequest { revision: Revision(3), ..all() };
    assert_eq!(l.h.expected_range(&before, 5).unwrap().count, 2);
    assert_eq!(l.h.expected_range(&all(), 5).unwrap().count, 0);
    l.query(5, OpKind::KeepAlive(LeaseId(5)), Err(KvError::LeaseNotFound));
    let gone = LeaseAnswer::Ttl { granted: 0, remaining: -1 };
    l.query(6, OpKind::TimeToLive(LeaseId(5)), Ok(gone));
    assert_eq!(l.client(7, put("c", 5)), Err(KvError::LeaseNotFound));
    let changes = l.h.take_lease_changes();
    let expired = LeaseChange::Revoked { id: LeaseId(5), ttl: Some(2), own: true };
    assert_eq!(changes, vec![LeaseChange::Granted { id: LeaseId(5), ttl: 2 }, expired]);
    let stats = l.h.check().unwrap_or_else(|v| panic!("{}", v.0));
    assert_eq!((stats.lease_grants, stats.lease_expiries, stats.lease_revokes), (1, 1, 0));
    assert_eq!((stats.lease_checkpoints, stats.lease_queries_checked), (1, 3));
}

/// A checkpoint a member took for a grant, committed after a client revoked the lease and
/// granted its id anew, is the member's own entry, counted as a checkpoint, and leaves the new
/// grant's remaining TTL as it was, as every store must.
#[test]
fn a_checkpoint_of_an_earlier_grant_is_accepted_and_leaves_the_new_grant_alone() {
    let mut l = Log::new();
    l.client(1, Command::LeaseGrant { id: LeaseId(5), ttl: 20 }).unwrap();
    l.client(2, Command::LeaseRevoke { id: LeaseId(5) }).unwrap();
    l.client(3, Command::LeaseGrant { id: LeaseId(5), ttl: 20 }).unwrap();
    let taken = |grant_index, remaining| GrantCheckpoint { id: LeaseId(5), grant_index, remaining };
    // Request id 900, which no client sent: the leader's own.
    let stale = Command::LeaseGrantCheckpoint { checkpoints: vec![taken(1, 7)] };
    assert_eq!(l.append(900, stale), Ok(CommandResponse::LeaseCheckpoint));
    let new = Lease { id: LeaseId(5), ttl: 20, remaining_ttl: 0, grant_index: 3 };
    assert_eq!(l.h.model_leases(), vec![new]);
    let own = Command::LeaseGrantCheckpoint { checkpoints: vec![taken(3, 12)] };
    l.append(901, own).unwrap();
    assert_eq!(l.h.model_leases(), vec![Lease { remaining_ttl: 12, ..new }]);
    let stats = l.h.check().unwrap_or_else(|v| panic!("{}", v.0));
    assert_eq!((stats.lease_checkpoints, stats.lease_grants, stats.lease_revokes), (2, 2, 1));
}

#[test]
fn a_member_whose_revoke_keeps_the_keys_is_caught() {
    let mut l = Log::new();
    l.client(1, Command::LeaseGrant { id: LeaseId(5), ttl: 2 }).unwrap();
    l.client(2, put("a", 5)).unwrap();
    // The model deletes "a" at revision 3; a store that kept it stays at revision 2.
    let kept = Ok(CommandResponse::LeaseRevoke { revision: Revision(2) });
    let revoke = Some((900, Command::LeaseRevoke { id: LeaseId(5) }));
    fails_with(l.h.applied(1, 3, revoke, Some(kept)), &["executed index 3", "the model gives"]);
}

#[test]
fn a_member_attaching_a_key_to_a_missing_lease_is_caught() {
    let mut l = Log::new();
    let at = l.at();
    l.h.invoke(1, OpKind::Write(put("a", 77)), at);
    let attached = Ok(CommandResponse::Put(PutResponse { revision: Revision(2), prev_kv: None }));
    let wrong = l.h.applied(1, 1, Some((1, put("a", 77))), Some(attached));
    fails_with(wrong, &["executed index 1", "LeaseNotFound"]);
}

#[test]
fn keepalives_and_ttls_answered_otherwise_than_the_model_are_caught() {
    let mut l = Log::new();
    l.query(1, OpKind::KeepAlive(LeaseId(5)), Ok(LeaseAnswer::Renewed { ttl: 2 }));
    fails_with(l.h.check(), &["keepalive 1", "lease 5", "nonexistent"]);
    let mut l = Log::new();
    l.client(1, Command::LeaseGrant { id: LeaseId(5), ttl: 2 }).unwrap();
    l.query(2, OpKind::KeepAlive(LeaseId(5)), Err(KvError::LeaseNotFound));
    fails_with(l.h.check(), &["keepalive 2", "with TTL 2"]);
    let mut l = Log::new();
    l.client(1, Command::LeaseGrant { id: LeaseId(5), ttl: 2 }).unwrap();
    l.query(2, OpKind::TimeToLive(LeaseId(5)), Ok(LeaseAnswer::Ttl { granted: 3, remaining: 1 }));
    fails_with(l.h.check(), &["time-to-live 2", "with TTL 2"]);
}

#[test]
fn a_keepalive_answered_from_a_stale_store_is_caught_in_real_time() {
    let mut l = Log::new();
    l.client(1, Command::LeaseGrant { id: LeaseId(5), ttl: 2 }).unwrap();
    l.client(2, put("a", 0)).unwrap();
    // Asked after write 2 was acknowledged, answered by a store that had not executed it.
    let at = l.at();
    l.h.invoke(3, OpKind::KeepAlive(LeaseId(5)), at);
    let stale = Outcome::Lease {
        result: Ok(LeaseAnswer::Renewed { ttl: 2 }),
        at_index: 1,
        answered_index: 1,
    };
    let at = l.at();
    l.h.complete(3, stale, at);
    fails_with(l.h.check(), &["real-time order", "write 2", "keepalive 3"]);
}

#[test]
fn an_expiry_before_the_promised_ttl_is_caught() {
    let mut c = checker();
    c.changed(LeaseChange::Granted { id: LeaseId(5), ttl: 2 }, 1000).unwrap();
    c.acknowledged(LeaseAck::Renewed { id: LeaseId(5), ttl: 2 }, 1300).unwrap();
    // 2 s are 20 ticks of at least 19 units: not before 1680.
    let early = LeaseChange::Revoked { id: LeaseId(5), ttl: Some(2), own: true };
    fails_with(c.changed(early, 1679), &["lease 5", "renewed for 2s at t=1300", "t=1680"]);
    let mut c = checker();
    c.acknowledged(LeaseAck::Renewed { id: LeaseId(5), ttl: 2 }, 1300).unwrap();
    c.changed(early, 1680).expect("on time");
    // A client's own revoke may come at any time.
    c.acknowledged(LeaseAck::Renewed { id: LeaseId(6), ttl: 2 }, 1700).unwrap();
    let by_client = LeaseChange::Revoked { id: LeaseId(6), ttl: Some(2), own: false };
    c.changed(by_client, 1701).expect("a client may revoke");
}

#[test]
fn an_expired_lease_revoked_too_long_after_healing_is_caught() {
    let mut c = checker();
    c.changed(LeaseChange::Granted { id: LeaseId(5), ttl: 2 }, 1000).unwrap();
    c.leader_elected(2000);
    c.healed(3000);
    // From healing: grace 10 + 20 + 1 + slack 5 ticks of at most 21 units.
    let late = LeaseChange::Revoked { id: LeaseId(5), ttl: Some(2), own: true };
    fails_with(c.changed(late, 3757), &["liveness", "lease 5", "t=3756"]);
    let mut c = checker();
    c.healed(3000);
    c.changed(late, 3756).expect("within the bound");
}

#[test]
fn a_time_to_live_beyond_the_ttl_and_a_leaders_grace_is_caught() {
    let mut c = checker();
    let ttl = |remaining| LeaseAck::Ttl { id: LeaseId(5), granted: 2, remaining };
    c.acknowledged(ttl(3), 100).expect("a new leader's grace is a second");
    fails_with(c.acknowledged(ttl(4), 100), &["lease 5", "4s left of a 2s lease"]);
}
