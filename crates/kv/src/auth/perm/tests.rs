use super::*;
use crate::auth::{AuthCommand, Permission, ROOT};
use crate::types::{Compare, CompareResult, CompareTarget, LeaseId};

/// A store with auth on, root, and `u` holding role `r` with `perms`.
fn store(perms: &[(&str, &str, PermType)]) -> (AuthState, Caller) {
    let mut s = AuthState::default();
    for name in [ROOT, "u"] {
        let add = AuthCommand::UserAdd {
            name: name.into(),
            password_hash: "h".into(),
            no_password: false,
        };
        s.apply(&add).expect("user");
    }
    s.apply(&AuthCommand::UserGrantRole { user: ROOT.into(), role: ROOT.into() }).expect("root");
    s.apply(&AuthCommand::RoleAdd { name: "r".into() }).expect("role");
    for (key, end, t) in perms {
        let perm = Permission {
            key: Bytes::copy_from_slice(key.as_bytes()),
            range_end: Bytes::copy_from_slice(end.as_bytes()),
            perm_type: *t,
        };
        s.apply(&AuthCommand::RoleGrantPermission { name: "r".into(), perm }).expect("perm");
    }
    s.apply(&AuthCommand::UserGrantRole { user: "u".into(), role: "r".into() }).expect("grant");
    s.apply(&AuthCommand::Enable).expect("enable");
    let caller = Caller { user: "u".into(), revision: s.revision };
    (s, caller)
}

fn read(s: &AuthState, c: &Caller, key: &str, end: &str) -> Result<(), AuthError> {
    s.check(c, key.as_bytes(), end.as_bytes(), PermType::Read)
}

#[test]
fn one_key_permissions_cover_that_key_only() {
    let (s, c) = store(&[("k", "", PermType::Read)]);
    assert_eq!(read(&s, &c, "k", ""), Ok(()));
    assert_eq!(read(&s, &c, "k0", ""), Err(AuthError::PermissionDenied));
    assert_eq!(read(&s, &c, "j", ""), Err(AuthError::PermissionDenied));
    assert_eq!(read(&s, &c, "k", "l"), Err(AuthError::PermissionDenied), "a range past the key");
    assert_eq!(read(&s, &c, "k", "k\0"), Ok(()), "the range of exactly the key");
    assert_eq!(s.check(&c, b"k", b"", PermType::Write), Err(AuthError::PermissionDenied));
}

#[test]
fn prefix_permissions_cover_ranges_inside_them() {
    let (s, c) = store(&[("foo/", "foo0", PermType::ReadWrite)]);
    assert_eq!(read(&s, &c, "foo/a", ""), Ok(()));
    assert_eq!(read(&s, &c, "foo/", "foo0"), Ok(()));
    assert_eq!(read(&s, &c, "foo/a", "foo/b"), Ok(()));
    assert_eq!(read(&s, &c, "foo/", "foo1"), Err(AuthError::PermissionDenied), "past the prefix");
    assert_eq!(read(&s, &c, "foo", "foo0"), Err(AuthError::PermissionDenied), "before it");
    assert_eq!(read(&s, &c, "foo/", "\0"), Err(AuthError::PermissionDenied), "from-key is open");
    assert_eq!(read(&s, &c, "foo0", ""), Err(AuthError::PermissionDenied), "the end is exclusive");
    assert_eq!(read(&s, &c, "b", "a"), Err(AuthError::PermissionDenied), "a reversed range");
}

#[test]
fn from_key_and_adjacent_permissions_merge() {
    let (s, c) = store(&[
        ("a", "c", PermType::Read),
        ("c", "e", PermType::ReadWrite),
        ("x", "\0", PermType::Read),
    ]);
    assert_eq!(read(&s, &c, "a", "e"), Ok(()), "two touching ranges cover their union");
    assert_eq!(read(&s, &c, "b", "f"), Err(AuthError::PermissionDenied));
    assert_eq!(read(&s, &c, "x", "\0"), Ok(()), "from-key within a from-key permission");
    assert_eq!(read(&s, &c, "y", "zzzz"), Ok(()));
    assert_eq!(read(&s, &c, "w", "\0"), Err(AuthError::PermissionDenied));
    assert_eq!(s.check(&c, b"a", b"e", PermType::Write), Err(AuthError::PermissionDenied));
    assert_eq!(s.check(&c, b"c", b"e", PermType::Write), Ok(()));
}

#[test]
fn no_user_a_stale_revision_unknown_users_and_root() {
    let (s, c) = store(&[]);
    assert_eq!(read(&s, &Caller::default(), "k", ""), Err(AuthError::UserEmpty));
    let stale = Caller { user: "u".into(), revision: s.revision - 1 };
    assert_eq!(read(&s, &stale, "k", ""), Err(AuthError::AuthOldRevision));
    let ghost = Caller { user: "ghost".into(), revision: s.revision };
    assert_eq!(read(&s, &ghost, "k", ""), Err(AuthError::PermissionDenied));
    assert_eq!(s.check_admin(&ghost), Err(AuthError::UserNotFound));
    assert_eq!(s.check_admin(&c), Err(AuthError::PermissionDenied));
    let root = Caller { user: ROOT.into(), revision: s.revision };
    assert_eq!(read(&s, &root, "anything", "\0"), Ok(()));
    assert_eq!(s.check_admin(&root), Ok(()));
    let off = AuthState::default();
    assert_eq!(read(&off, &Caller::default(), "k", ""), Ok(()), "auth off checks nothing");
}

fn put(key: &str, prev_kv: bool) -> PutRequest {
    PutRequest { key: Bytes::copy_from_slice(key.as_bytes()), prev_kv, ..PutRequest::default() }
}

#[test]
fn writes_need_read_too_when_they_return_previous_values() {
    let (s, c) = store(&[("w", "", PermType::Write)]);
    assert_eq!(s.check_put(&c, &put("w", false)), Ok(()));
    assert_eq!(s.check_put(&c, &put("w", true)), Err(AuthError::PermissionDenied));
    let del = DeleteRangeRequest { key: "w".into(), range_end: Bytes::new(), prev_kv: true };
    assert_eq!(s.check_delete(&c, &del), Err(AuthError::PermissionDenied));
    let del = DeleteRangeRequest { prev_kv: false, ..del };
    assert_eq!(s.check_delete(&c, &del), Ok(()));
}

#[test]
fn transactions_need_rights_in_compares_and_both_branches_nested_too() {
    let (s, c) = store(&[("a", "", PermType::ReadWrite), ("s", "", PermType::Read)]);
    let cmp = |k: &str| Compare {
        key: Bytes::copy_from_slice(k.as_bytes()),
        range_end: Bytes::new(),
        target: CompareTarget::Version(0),
        result: CompareResult::Equal,
    };
    let ok = TxnRequest {
        compare: vec![cmp("a")],
        success: vec![RequestOp::Put(put("a", false))],
        failure: vec![RequestOp::Range(RangeRequest {
            key: "s".into(),
            ..RangeRequest::default()
        })],
    };
    assert_eq!(s.check_txn(&c, &ok), Ok(()));
    let compare_secret = TxnRequest { compare: vec![cmp("secret")], ..ok.clone() };
    assert_eq!(s.check_txn(&c, &compare_secret), Err(AuthError::PermissionDenied));
    let failure_writes =
        TxnRequest { failure: vec![RequestOp::Put(put("s", false))], ..ok.clone() };
    assert_eq!(
        s.check_txn(&c, &failure_writes),
        Err(AuthError::PermissionDenied),
        "the branch not taken counts too"
    );
    let nested = TxnRequest {
        success: vec![RequestOp::Txn(TxnRequest {
            success: vec![RequestOp::Put(put("secret", false))],
            ..TxnRequest::default()
        })],
        ..ok.clone()
    };
    assert_eq!(s.check_txn(&c, &nested), Err(AuthError::PermissionDenied));
}

#[test]
fn lease_revoke_and_lease_puts_need_write_on_every_attached_key() {
    let (s, c) = store(&[("mine", "", PermType::ReadWrite)]);
    let keys = |id: LeaseId| -> Vec<Bytes> {
        if id.0 == 1 {
            vec!["mine".into()]
        } else {
            vec!["mine".into(), "theirs".into()]
        }
    };
    assert_eq!(s.authorize(&c, &Command::LeaseRevoke { id: LeaseId(1) }, keys), Ok(()));
    assert_eq!(
        s.authorize(&c, &Command::LeaseRevoke { id: LeaseId(2) }, keys),
        Err(AuthError::PermissionDenied)
    );
    let attach = PutRequest { lease: LeaseId(2), ..put("mine", false) };
    assert_eq!(s.authorize(&c, &Command::Put(attach), keys), Err(AuthError::PermissionDenied));
    let root = Caller { user: ROOT.into(), revision: s.revision };
    assert_eq!(s.authorize(&root, &Command::LeaseRevoke { id: LeaseId(2) }, keys), Ok(()));
    let change = Command::Auth(AuthCommand::RoleAdd { name: "x".into() });
    assert_eq!(s.authorize(&c, &change, keys), Err(AuthError::PermissionDenied));
    assert_eq!(s.authorize(&root, &change, keys), Ok(()));
}
