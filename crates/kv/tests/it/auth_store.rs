//! The auth store as replicated state: executed through commands, kept beside the key space
//! (no revision, nothing Range, watch events or HashKV see), persisted with the data, carried in
//! snapshot images; and clients' commands checked at apply time against it.

use crate::common;

use cairn_kv::auth::{AuthCommand, AuthError, Caller, PermType, Permission, ROOT};
use cairn_kv::backend::MemBackend;
use cairn_kv::*;
use common::Shared;

fn auth(c: AuthCommand) -> Command {
    Command::Auth(c)
}

/// Root, a role `r` reading and writing `a..c`, a user `u` holding it, auth enabled; then one
/// key written by root.
fn setup() -> Vec<Command> {
    let user = |name: &str| {
        auth(AuthCommand::UserAdd {
            name: name.into(),
            password_hash: "h".into(),
            no_password: false,
        })
    };
    let perm =
        Permission { key: "a".into(), range_end: "c".into(), perm_type: PermType::ReadWrite };
    vec![
        user(ROOT),
        auth(AuthCommand::UserGrantRole { user: ROOT.into(), role: ROOT.into() }),
        auth(AuthCommand::RoleAdd { name: "r".into() }),
        auth(AuthCommand::RoleGrantPermission { name: "r".into(), perm }),
        user("u"),
        auth(AuthCommand::UserGrantRole { user: "u".into(), role: "r".into() }),
        auth(AuthCommand::Enable),
    ]
}

fn apply<B: backend::Backend>(store: &Store<B>, first: u64, cmds: &[Command]) -> Vec<Outcome> {
    let entries: Vec<Applied<'_>> =
        cmds.iter().enumerate().map(|(i, c)| (first + i as u64, Some(c))).collect();
    store.apply(&entries).expect("the backend works")
}

fn put_as(caller: &Caller, key: &str) -> Command {
    let put =
        PutRequest { key: key.to_string().into(), value: "v".into(), ..PutRequest::default() };
    Command::Authorized { caller: caller.clone(), command: Box::new(Command::Put(put)) }
}

#[test]
fn the_auth_store_is_beside_the_key_space_and_survives_restarts_and_images() {
    let backend = Shared::default();
    let store = Store::open(backend.clone()).expect("open");
    let hash_before = store.hash_kv(Revision(0)).expect("hash");
    let outcomes = apply(&store, 1, &setup());
    assert!(outcomes.iter().all(|o| matches!(o, Some(Ok(CommandResponse::Auth { .. })))));
    assert_eq!(store.current_revision(), Revision::INITIAL, "auth changes move no key revision");
    assert_eq!(store.hash_kv(Revision(0)).expect("hash"), hash_before);
    let all = RangeRequest { key: "\0".into(), range_end: "\0".into(), ..RangeRequest::default() };
    assert_eq!(store.range(&all).expect("range").count, 0, "no key holds the auth store");
    assert!(store.auth_enabled());
    let state = store.auth();
    drop(store);
    let reopened = Store::open(backend).expect("reopen");
    assert!(reopened.auth_enabled(), "enabled survives a restart");
    assert_eq!(*reopened.auth(), *state);
    let image = reopened.image().expect("image");
    let fresh = Store::open(MemBackend::default()).expect("fresh");
    fresh.install(&image).expect("install");
    assert!(fresh.auth_enabled(), "an installed image brings the auth store");
    assert_eq!(*fresh.auth(), *state);
}

#[test]
fn commands_with_a_caller_are_checked_at_apply_time() {
    let store = Store::open(MemBackend::default()).expect("open");
    apply(&store, 1, &setup());
    let rev = store.auth().revision;
    let u = Caller { user: "u".into(), revision: rev };
    let out =
        apply(&store, 10, &[put_as(&u, "b"), put_as(&u, "x"), put_as(&Caller::default(), "b")]);
    assert!(matches!(out[0], Some(Ok(CommandResponse::Put(_)))), "{:?}", out[0]);
    assert_eq!(out[1], Some(Err(KvError::Auth(AuthError::PermissionDenied))));
    assert_eq!(out[2], Some(Err(KvError::Auth(AuthError::UserEmpty))));
    // A change to the auth store between the check and the apply: the request was decided at
    // an older revision, and etcd refuses it so the client retries with the new rules.
    let revoke = auth(AuthCommand::UserRevokeRole { name: "u".into(), role: "r".into() });
    let out = apply(&store, 20, &[revoke, put_as(&u, "b")]);
    assert_eq!(out[1], Some(Err(KvError::Auth(AuthError::AuthOldRevision))));
    let as_u =
        |c: AuthCommand| Command::Authorized { caller: u.clone(), command: Box::new(auth(c)) };
    let u_now = Caller { user: "u".into(), revision: store.auth().revision };
    let change = Command::Authorized {
        caller: u_now,
        command: Box::new(auth(AuthCommand::RoleAdd { name: "mine".into() })),
    };
    let out = apply(&store, 30, &[change, as_u(AuthCommand::Disable)]);
    assert_eq!(
        out[0],
        Some(Err(KvError::Auth(AuthError::PermissionDenied))),
        "only root changes auth"
    );
    assert_eq!(out[1], Some(Err(KvError::Auth(AuthError::PermissionDenied))));
    assert!(store.auth_enabled());
}
