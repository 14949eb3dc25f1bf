use super::*;

fn add_user(s: &mut AuthState, name: &str) {
    let cmd = AuthCommand::UserAdd {
        name: name.into(),
        password_hash: format!("hash-of-{name}"),
        no_password: false,
    };
    s.apply(&cmd).expect("a new user is added");
}

fn grant(s: &mut AuthState, user: &str, role: &str) -> Result<(), AuthError> {
    s.apply(&AuthCommand::UserGrantRole { user: user.into(), role: role.into() })
}

#[test]
fn enable_needs_a_root_user_holding_the_root_role() {
    let mut s = AuthState::default();
    assert_eq!(s.revision, 1, "etcd's new store is at auth revision 1");
    assert_eq!(s.apply(&AuthCommand::Enable), Err(AuthError::RootUserNotExist));
    add_user(&mut s, ROOT);
    assert_eq!(s.apply(&AuthCommand::Enable), Err(AuthError::RootRoleNotExist));
    grant(&mut s, ROOT, ROOT).expect("the root role needs no RoleAdd");
    let before = s.revision;
    s.apply(&AuthCommand::Enable).expect("root exists");
    assert!(s.enabled);
    assert_eq!(s.revision, before, "enabling does not move the auth revision");
    // While enabled, root can be neither deleted nor stripped of its role.
    let del = AuthCommand::UserDelete { name: ROOT.into() };
    assert_eq!(s.apply(&del), Err(AuthError::InvalidAuthMgmt));
    let revoke = AuthCommand::UserRevokeRole { name: ROOT.into(), role: ROOT.into() };
    assert_eq!(s.apply(&revoke), Err(AuthError::InvalidAuthMgmt));
    assert_eq!(
        s.apply(&AuthCommand::RoleDelete { role: ROOT.into() }),
        Err(AuthError::InvalidAuthMgmt)
    );
    s.apply(&AuthCommand::Disable).expect("disable");
    assert_eq!(s.disabled_at, s.revision, "tokens issued before now are void");
    s.apply(&del).expect("root can go once auth is off");
}

#[test]
fn users_and_roles_refuse_as_etcd_does() {
    let mut s = AuthState::default();
    let empty = AuthCommand::UserAdd {
        name: String::new(),
        password_hash: String::new(),
        no_password: true,
    };
    assert_eq!(s.apply(&empty), Err(AuthError::UserEmpty));
    add_user(&mut s, "alice");
    let again = AuthCommand::UserAdd {
        name: "alice".into(),
        password_hash: "x".into(),
        no_password: false,
    };
    assert_eq!(s.apply(&again), Err(AuthError::UserAlreadyExist));
    assert_eq!(grant(&mut s, "bob", "r"), Err(AuthError::UserNotFound));
    assert_eq!(grant(&mut s, "alice", "r"), Err(AuthError::RoleNotFound));
    assert_eq!(s.apply(&AuthCommand::RoleAdd { name: String::new() }), Err(AuthError::RoleEmpty));
    s.apply(&AuthCommand::RoleAdd { name: "r".into() }).expect("new role");
    assert_eq!(
        s.apply(&AuthCommand::RoleAdd { name: "r".into() }),
        Err(AuthError::RoleAlreadyExist)
    );
    grant(&mut s, "alice", "r").expect("grant");
    let rev = s.revision;
    grant(&mut s, "alice", "r").expect("a repeated grant succeeds");
    assert_eq!(s.revision, rev, "and changes nothing");
    let revoke = AuthCommand::UserRevokeRole { name: "alice".into(), role: "other".into() };
    assert_eq!(s.apply(&revoke), Err(AuthError::RoleNotGranted));
    let perm = Permission { key: "a".into(), range_end: "b".into(), perm_type: PermType::Read };
    let grant_perm = AuthCommand::RoleGrantPermission { name: "r".into(), perm: perm.clone() };
    s.apply(&grant_perm).expect("grant permission");
    let bad = Permission { key: "b".into(), range_end: "a".into(), perm_type: PermType::Read };
    let reversed = AuthCommand::RoleGrantPermission { name: "r".into(), perm: bad };
    assert_eq!(s.apply(&reversed), Err(AuthError::InvalidAuthMgmt));
    let wrong = AuthCommand::RoleRevokePermission {
        role: "r".into(),
        key: "a".into(),
        range_end: "c".into(),
    };
    assert_eq!(s.apply(&wrong), Err(AuthError::PermissionNotGranted));
    s.apply(&AuthCommand::RoleDelete { role: "r".into() }).expect("delete role");
    assert!(s.users["alice"].roles.is_empty(), "deleting a role revokes it from every user");
    assert_eq!(
        s.apply(&AuthCommand::UserDelete { name: "bob".into() }),
        Err(AuthError::UserNotFound)
    );
}

#[test]
fn the_store_survives_encoding_and_damage_is_an_error() {
    let mut s = AuthState::default();
    add_user(&mut s, ROOT);
    grant(&mut s, ROOT, ROOT).expect("grant root");
    s.apply(&AuthCommand::RoleAdd { name: "r".into() }).expect("role");
    let perm =
        Permission { key: "k".into(), range_end: "\0".into(), perm_type: PermType::ReadWrite };
    s.apply(&AuthCommand::RoleGrantPermission { name: "r".into(), perm }).expect("perm");
    s.apply(&AuthCommand::Enable).expect("enable");
    let raw = s.encode();
    assert_eq!(AuthState::decode(&raw).expect("round trip"), s);
    for cut in 0..raw.len() {
        assert!(AuthState::decode(&raw[..cut]).is_err(), "a store cut at {cut} is refused");
    }
    let mut longer = raw.clone();
    longer.push(0);
    assert!(AuthState::decode(&longer).is_err());
}
