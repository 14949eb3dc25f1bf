//! Simple auth tokens as etcd keeps them: issued for a matching password only, renewed by use,
//! void once unused for the TTL, and void once their user is deleted, gets a new password, or
//! auth is disabled (even if it is enabled again).

use std::path::PathBuf;
use std::time::Duration;

use cairn_kv::auth::{AuthCommand, AuthError, Caller, ROOT};
use cairn_kv::KvError;
use cairn_node::{Engine, EngineConfig, EngineError};

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cairn-auth-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn auth_err(e: AuthError) -> EngineError {
    EngineError::Kv(KvError::Auth(e))
}

async fn enabled(tag: &str) -> (Engine, PathBuf) {
    let dir = temp_dir(tag);
    let mut cfg = EngineConfig::new("auth", &dir);
    cfg.bcrypt_cost = 4;
    cfg.auth_token_ttl = Duration::from_secs(1);
    let e = Engine::open(cfg).expect("open");
    e.user_add(None, ROOT, "rootpw", false).await.expect("root");
    let grant = AuthCommand::UserGrantRole { user: ROOT.into(), role: ROOT.into() };
    e.auth_change(None, grant).await.expect("grant");
    e.user_add(None, "u", "upw", false).await.expect("u");
    assert_eq!(e.authenticate("u", "upw").await, Err(auth_err(AuthError::AuthNotEnabled)));
    e.auth_change(None, AuthCommand::Enable).await.expect("enable");
    (e, dir)
}

fn root(e: &Engine) -> Option<Caller> {
    Some(Caller { user: ROOT.into(), revision: e.auth_state().revision })
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_die_with_their_user_password_and_auth() {
    let (e, dir) = enabled("die").await;
    assert_eq!(e.authenticate("u", "wrong").await, Err(auth_err(AuthError::AuthFailed)));
    assert_eq!(e.authenticate("nobody", "x").await, Err(auth_err(AuthError::AuthFailed)));
    let stored = e.auth_state().users["u"].password_hash.clone();
    assert!(stored.starts_with("$2") && !stored.contains("upw"), "only a bcrypt hash is kept");

    let token = e.authenticate("u", "upw").await.expect("authenticate");
    assert_eq!(e.caller_from_token(&token).expect("valid").user, "u");
    assert!(e.caller_from_token("forged").is_err());
    e.user_change_password(root(&e), "u", "new").await.expect("change password");
    assert_eq!(e.caller_from_token(&token), Err(auth_err(AuthError::InvalidAuthToken)));
    assert_eq!(e.authenticate("u", "upw").await, Err(auth_err(AuthError::AuthFailed)));

    let token = e.authenticate("u", "new").await.expect("authenticate");
    e.auth_change(root(&e), AuthCommand::Disable).await.expect("disable");
    e.auth_change(None, AuthCommand::Enable).await.expect("enable again");
    assert_eq!(e.caller_from_token(&token), Err(auth_err(AuthError::InvalidAuthToken)));

    let token = e.authenticate("u", "new").await.expect("authenticate");
    e.auth_change(root(&e), AuthCommand::UserDelete { name: "u".into() }).await.expect("delete");
    assert_eq!(e.caller_from_token(&token), Err(auth_err(AuthError::InvalidAuthToken)));
    drop(e);
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_live_their_ttl_past_their_last_use() {
    let (e, dir) = enabled("ttl").await;
    let token = e.authenticate("u", "upw").await.expect("authenticate");
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        e.caller_from_token(&token).expect("each use renews it");
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(e.caller_from_token(&token), Err(auth_err(AuthError::InvalidAuthToken)));
    // Non-root callers change nothing, and are refused before a password is hashed.
    let u = Some(Caller { user: "u".into(), revision: e.auth_state().revision });
    let refused = e.user_add(u, "v", "vpw", false).await;
    assert_eq!(refused, Err(auth_err(AuthError::PermissionDenied)));
    drop(e);
    std::fs::remove_dir_all(&dir).expect("clean up");
}
