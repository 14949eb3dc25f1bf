//! The engine's auth API: changes to the auth store (through the log, passwords hashed here
//! first, as etcd hashes on the member that proposes), authentication with simple tokens, and
//! clients' commands proposed with their caller so the apply path checks them.
//!
//! Simple tokens are etcd's: random, kept in memory on the member that issued them, valid for
//! `auth_token_ttl` since their last use. A token dies with its user, with a change of that
//! user's password, and when auth is disabled, as etcd's do.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cairn_kv::auth::{AuthCommand, AuthError, AuthState, Caller};
use cairn_kv::{
    Command, CommandResponse, DeleteRangeRequest, DeleteRangeResponse, KvError, LeaseId,
    PutRequest, PutResponse, Revision, TxnRequest, TxnResponse,
};

use super::Engine;
use crate::error::EngineError;

/// Past this many live tokens, issuing one first sweeps out the expired.
const SWEEP_ABOVE: usize = 1024;

/// The simple tokens this member issued.
#[derive(Debug, Default)]
pub(crate) struct Tokens(Mutex<HashMap<String, Token>>);

#[derive(Debug)]
struct Token {
    user: String,
    /// The user's password hash when the token was issued: a new password voids it.
    password_hash: String,
    /// The auth revision at issue: an AuthDisable after it voids it.
    issued_at: u64,
    expires: Instant,
}

impl Tokens {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Token>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn issue(&self, user: &str, password_hash: &str, revision: u64, ttl: Duration) -> String {
        let mut raw = [0u8; 16];
        // Without the OS's randomness no token could be trusted; failing to get it is a
        // broken host, where refusing every token (none is issued) is the safe answer.
        if getrandom::fill(&mut raw).is_err() {
            return String::new();
        }
        let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let now = Instant::now();
        let mut tokens = self.lock();
        if tokens.len() > SWEEP_ABOVE {
            tokens.retain(|_, t| t.expires > now);
        }
        let entry = Token {
            user: user.to_string(),
            password_hash: password_hash.to_string(),
            issued_at: revision,
            expires: now + ttl,
        };
        tokens.insert(token.clone(), entry);
        token
    }

    /// The user a live token names, renewing it (etcd's simple tokens live `ttl` past their
    /// last use).
    fn lookup(&self, token: &str, state: &AuthState, ttl: Duration) -> Option<String> {
        let now = Instant::now();
        let mut tokens = self.lock();
        let t = tokens.get_mut(token)?;
        let same_user =
            state.users.get(&t.user).is_some_and(|u| u.password_hash == t.password_hash);
        if t.expires <= now || t.issued_at < state.disabled_at || !same_user {
            tokens.remove(token);
            return None;
        }
        t.expires = now + ttl;
        Some(t.user.clone())
    }
}

/// Runs slow work (bcrypt) on a thread of its own, so the caller's async runtime is not held.
async fn off_thread<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, EngineError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("cairn-bcrypt".into())
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|_| EngineError::Internal("could not start a thread to hash a password"))?;
    rx.await.map_err(|_| EngineError::Internal("the password hashing thread failed"))
}

fn auth_err(e: AuthError) -> EngineError {
    EngineError::Kv(KvError::Auth(e))
}

impl Engine {
    /// Whether auth is enabled on this member: one atomic load, the only cost auth adds to a
    /// request while it is off.
    pub fn auth_enabled(&self) -> bool {
        self.shared.store.auth_enabled()
    }

    /// The auth store as this member executed it.
    pub fn auth_state(&self) -> Arc<AuthState> {
        self.shared.store.auth()
    }

    /// The caller a simple token names, at the current auth revision (etcd's simple tokens
    /// carry no revision of their own), or `ErrInvalidAuthToken`.
    pub fn caller_from_token(&self, token: &str) -> Result<Caller, EngineError> {
        let state = self.auth_state();
        match self.tokens.lookup(token, &state, self.cfg.auth_token_ttl) {
            Some(user) => Ok(Caller { user, revision: state.revision }),
            None => Err(auth_err(AuthError::InvalidAuthToken)),
        }
    }

    /// etcd's `Authenticate`: a token for a user whose password matches, once auth is on.
    pub async fn authenticate(&self, name: &str, password: &str) -> Result<String, EngineError> {
        let (password_hash, revision) = self.check_password(name, password).await?;
        let ttl = self.cfg.auth_token_ttl;
        let token = self.tokens.issue(name, &password_hash, revision, ttl);
        if token.is_empty() {
            return Err(EngineError::Internal("no randomness for an auth token"));
        }
        Ok(token)
    }

    /// etcd's password check before it issues a token of any kind: the user's password hash and
    /// the auth revision it was checked at, or `ErrAuthFailed` (`ErrAuthNotEnabled` while auth
    /// is off). A server that signs its own tokens (JWT) issues them on this answer.
    pub async fn check_password(
        &self,
        name: &str,
        password: &str,
    ) -> Result<(String, u64), EngineError> {
        // A user added just before, through another member, can authenticate here.
        self.read_barrier().await?;
        let state = self.auth_state();
        if !state.enabled {
            return Err(auth_err(AuthError::AuthNotEnabled));
        }
        let user = state.users.get(name).ok_or(auth_err(AuthError::AuthFailed))?;
        if user.no_password {
            return Err(auth_err(AuthError::AuthFailed));
        }
        let (hash, password) = (user.password_hash.clone(), password.to_string());
        let matches = off_thread(move || bcrypt::verify(password, &hash).unwrap_or(false)).await?;
        if !matches {
            return Err(auth_err(AuthError::AuthFailed));
        }
        Ok((user.password_hash.clone(), state.revision))
    }

    /// Hashes a password with this member's bcrypt cost. A caller refused anyway is refused
    /// before the (deliberately slow) hash.
    async fn hash_password(
        &self,
        caller: Option<&Caller>,
        password: &str,
    ) -> Result<String, EngineError> {
        if let Some(c) = caller {
            self.auth_state().check_admin(c).map_err(auth_err)?;
        }
        let (cost, password) = (self.cfg.bcrypt_cost, password.to_string());
        off_thread(move || bcrypt::hash(password, cost))
            .await?
            .map_err(|_| EngineError::Internal("bcrypt refused the password or cost"))
    }

    /// etcd's `UserAdd`: the password is hashed here and only its hash is replicated.
    pub async fn user_add(
        &self,
        caller: Option<Caller>,
        name: &str,
        password: &str,
        no_password: bool,
    ) -> Result<(Revision, u64), EngineError> {
        if name.is_empty() {
            return Err(auth_err(AuthError::UserEmpty));
        }
        let password_hash = if no_password {
            String::new()
        } else {
            self.hash_password(caller.as_ref(), password).await?
        };
        let change = AuthCommand::UserAdd { name: name.to_string(), password_hash, no_password };
        self.auth_change(caller, change).await
    }

    /// etcd's `UserChangePassword`, hashed here as [`Engine::user_add`] does.
    pub async fn user_change_password(
        &self,
        caller: Option<Caller>,
        name: &str,
        password: &str,
    ) -> Result<(Revision, u64), EngineError> {
        let password_hash = self.hash_password(caller.as_ref(), password).await?;
        let change = AuthCommand::UserChangePassword { name: name.to_string(), password_hash };
        self.auth_change(caller, change).await
    }

    /// Proposes a change to the auth store; answers the key revision and the new auth
    /// revision. `caller` is `Some` when auth is on (only a root user may change it).
    pub async fn auth_change(
        &self,
        caller: Option<Caller>,
        change: AuthCommand,
    ) -> Result<(Revision, u64), EngineError> {
        match self.propose_as(caller, Command::Auth(change)).await? {
            CommandResponse::Auth { revision, auth_revision } => Ok((revision, auth_revision)),
            _ => Err(EngineError::Internal("an auth change answered with another response")),
        }
    }

    /// Proposes a client's command; with a caller, the apply path checks that caller's rights
    /// against the auth store as of the entry (etcd's request header).
    pub async fn propose_as(
        &self,
        caller: Option<Caller>,
        cmd: Command,
    ) -> Result<CommandResponse, EngineError> {
        let cmd = match caller {
            Some(caller) => Command::Authorized { caller, command: Box::new(cmd) },
            None => cmd,
        };
        self.propose(cmd).await
    }

    /// [`Engine::put`] for a caller.
    pub async fn put_as(
        &self,
        caller: Option<Caller>,
        req: PutRequest,
    ) -> Result<PutResponse, EngineError> {
        match self.propose_as(caller, Command::Put(req)).await? {
            CommandResponse::Put(r) => Ok(r),
            _ => Err(EngineError::Internal("a put answered with another response")),
        }
    }

    /// [`Engine::delete_range`] for a caller.
    pub async fn delete_range_as(
        &self,
        caller: Option<Caller>,
        req: DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, EngineError> {
        match self.propose_as(caller, Command::DeleteRange(req)).await? {
            CommandResponse::DeleteRange(r) => Ok(r),
            _ => Err(EngineError::Internal("a delete answered with another response")),
        }
    }

    /// [`Engine::txn`] for a caller.
    pub async fn txn_as(
        &self,
        caller: Option<Caller>,
        req: TxnRequest,
    ) -> Result<TxnResponse, EngineError> {
        match self.propose_as(caller, Command::Txn(req)).await? {
            CommandResponse::Txn(r) => Ok(r),
            _ => Err(EngineError::Internal("a transaction answered with another response")),
        }
    }

    /// [`Engine::lease_revoke`] for a caller.
    pub async fn lease_revoke_as(
        &self,
        caller: Option<Caller>,
        id: LeaseId,
    ) -> Result<Revision, EngineError> {
        match self.propose_as(caller, Command::LeaseRevoke { id }).await? {
            CommandResponse::LeaseRevoke { revision } => Ok(revision),
            _ => Err(EngineError::Internal("a lease revoke answered with another response")),
        }
    }
}
