//! etcd's Auth service, and where a request's caller is decided.
//!
//! Reads are checked here against the member's auth store; writes carry their caller into the
//! log and are checked when applied (`cairn_kv::auth`), as etcd's auth applier checks them.

use cairn_kv::auth::{AuthCommand, AuthError, Caller, PermType, Permission};
use cairn_kv::KvError;
use cairn_node::{Engine, EngineError};
use cairn_proto::authpb;
use cairn_proto::etcdserverpb as pb;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use crate::errors::status;
use crate::jwt::AuthToken;
use crate::services::Ctx;
use crate::ClientCertName;

/// The metadata keys etcd clients put their token under (gRPC; the JSON gateway's).
const TOKEN_KEYS: [&str; 2] = ["token", "authorization"];

/// How this member tells who asks, beside its auth store.
#[derive(Clone, Debug, Default)]
pub(crate) struct Authn {
    /// etcd's `--client-cert-auth` (its `ClientCertAuthEnabled`): a verified client
    /// certificate's Common Name names the caller of a request without a token. A trusted CA
    /// file alone makes the listener verify certificates but, as in etcd, not name callers.
    pub(crate) cert_auth: bool,
    /// `--auth-token`: how tokens are issued and checked.
    pub(crate) tokens: AuthToken,
}

/// What a request carries to name its caller, kept for a stream's later requests (a watch
/// stream's creates).
#[derive(Clone, Debug, Default)]
pub(crate) struct Credentials {
    token: Option<Box<[u8]>>,
    cert_name: Option<Box<str>>,
}

impl Credentials {
    pub(crate) fn of<T>(req: &Request<T>) -> Credentials {
        Credentials {
            token: token(req.metadata()).map(Box::from),
            cert_name: cert_name(req).map(Box::from),
        }
    }
}

/// The token a request carries, if any.
fn token(metadata: &MetadataMap) -> Option<&[u8]> {
    TOKEN_KEYS.iter().find_map(|k| metadata.get(*k)).map(|v| v.as_bytes())
}

/// The Common Name of the client certificate the listener verified, if any.
fn cert_name<T>(req: &Request<T>) -> Option<&str> {
    req.extensions().get::<ClientCertName>().map(|n| n.0.as_str())
}

impl Authn {
    /// Who asks: `None` while auth is off (one atomic load: the whole cost of auth then), else
    /// the caller the request names, or the anonymous caller, whom every check refuses.
    ///
    /// This is the one place a caller's identity is decided, in etcd's order
    /// (`EtcdServer.AuthInfoFromCtx`): a token when the request carries one, valid or not;
    /// else, with `--client-cert-auth`, the verified certificate's Common Name at the current
    /// auth revision (a name that is no user is refused by the checks, as etcd refuses it).
    pub(crate) fn caller_of(
        &self,
        engine: &Engine,
        token: Option<&[u8]>,
        cert_name: Option<&str>,
    ) -> Result<Option<Caller>, AuthError> {
        if !engine.auth_enabled() {
            return Ok(None);
        }
        if let Some(token) = token {
            let token = std::str::from_utf8(token).map_err(|_| AuthError::InvalidAuthToken)?;
            return self.token_caller(engine, token).map(Some);
        }
        match cert_name.filter(|_| self.cert_auth) {
            Some(name) => {
                let revision = engine.auth_state().revision;
                Ok(Some(Caller { user: name.to_string(), revision }))
            }
            None => Ok(Some(Caller::default())),
        }
    }

    /// The caller a token names: a simple token's user at the current auth revision, a JWT
    /// token's user at the revision it was issued at (older than the store's, the checks answer
    /// `ErrAuthOldRevision` and etcd's clients authenticate again).
    fn token_caller(&self, engine: &Engine, token: &str) -> Result<Caller, AuthError> {
        match &self.tokens {
            AuthToken::Simple => {
                engine.caller_from_token(token).map_err(|_| AuthError::InvalidAuthToken)
            }
            AuthToken::Jwt(jwt) => jwt
                .info(token)
                .map(|(user, revision)| Caller { user, revision })
                .ok_or(AuthError::InvalidAuthToken),
            AuthToken::Nop => Err(AuthError::InvalidAuthToken),
        }
    }

    /// [`Authn::caller_of`] for kept credentials.
    pub(crate) fn caller_for(
        &self,
        engine: &Engine,
        c: &Credentials,
    ) -> Result<Option<Caller>, AuthError> {
        self.caller_of(engine, c.token.as_deref(), c.cert_name.as_deref())
    }
}

/// A refused watch's `cancel_reason`: etcd puts the whole gRPC status text there, which its
/// client turns back into the error (and ends the stream with it).
pub(crate) fn watch_cancel_reason(e: AuthError) -> &'static str {
    match e {
        AuthError::InvalidAuthToken => {
            "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"
        }
        AuthError::AuthOldRevision => {
            "rpc error: code = InvalidArgument desc = etcdserver: revision of auth store is old"
        }
        AuthError::UserEmpty => {
            "rpc error: code = InvalidArgument desc = etcdserver: user name is empty"
        }
        _ => "rpc error: code = PermissionDenied desc = etcdserver: permission denied",
    }
}

pub(crate) fn auth_status(e: AuthError) -> Status {
    status(EngineError::Kv(KvError::Auth(e)))
}

fn perm_pb(p: &Permission) -> authpb::Permission {
    authpb::Permission {
        perm_type: p.perm_type as i32,
        key: p.key.to_vec(),
        range_end: p.range_end.to_vec(),
    }
}

impl Ctx {
    /// The request's caller ([`Authn::caller_of`]).
    pub(crate) fn caller<T>(&self, req: &Request<T>) -> Result<Option<Caller>, Status> {
        let token = token(req.metadata());
        self.authn.caller_of(&self.engine, token, cert_name(req)).map_err(auth_status)
    }

    /// etcd's check for the calls only a root user may make once auth is on.
    pub(crate) fn check_admin<T>(&self, req: &Request<T>) -> Result<(), Status> {
        match self.caller(req)? {
            Some(c) => self.engine.auth_state().check_admin(&c).map_err(auth_status),
            None => Ok(()),
        }
    }

    /// Proposes an auth change for the request's caller; answers the header etcd sends.
    async fn change<T>(
        &self,
        req: &Request<T>,
        change: AuthCommand,
    ) -> Result<Option<pb::ResponseHeader>, Status> {
        let caller = self.caller(req)?;
        let (rev, _) = self.engine.auth_change(caller, change).await.map_err(status)?;
        Ok(self.header().at(rev))
    }

    /// A read of the auth store: linearizable, as etcd's go through its log.
    async fn auth_read(&self) -> Result<Option<pb::ResponseHeader>, Status> {
        self.engine.read_barrier().await.map_err(status)?;
        Ok(self.header().at(self.engine.revision()))
    }
}

type Answer<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl pb::auth_server::Auth for Ctx {
    async fn auth_enable(
        &self,
        req: Request<pb::AuthEnableRequest>,
    ) -> Answer<pb::AuthEnableResponse> {
        let header = self.change(&req, AuthCommand::Enable).await?;
        Ok(Response::new(pb::AuthEnableResponse { header }))
    }

    async fn auth_disable(
        &self,
        req: Request<pb::AuthDisableRequest>,
    ) -> Answer<pb::AuthDisableResponse> {
        let header = self.change(&req, AuthCommand::Disable).await?;
        Ok(Response::new(pb::AuthDisableResponse { header }))
    }

    async fn auth_status(
        &self,
        req: Request<pb::AuthStatusRequest>,
    ) -> Answer<pb::AuthStatusResponse> {
        let header = self.auth_read().await?;
        self.check_admin(&req)?;
        let state = self.engine.auth_state();
        Ok(Response::new(pb::AuthStatusResponse {
            header,
            enabled: state.enabled,
            auth_revision: state.revision,
        }))
    }

    async fn authenticate(
        &self,
        req: Request<pb::AuthenticateRequest>,
    ) -> Answer<pb::AuthenticateResponse> {
        let r = req.into_inner();
        let token = match &self.authn.tokens {
            AuthToken::Simple => {
                self.engine.authenticate(&r.name, &r.password).await.map_err(status)?
            }
            AuthToken::Jwt(jwt) => {
                let (_, revision) =
                    self.engine.check_password(&r.name, &r.password).await.map_err(status)?;
                // etcd answers a signing failure as it is (codes.Unknown).
                jwt.assign(&r.name, revision).map_err(|e| Status::unknown(e.to_string()))?
            }
            AuthToken::Nop => {
                self.engine.check_password(&r.name, &r.password).await.map_err(status)?;
                return Err(auth_status(AuthError::AuthFailed));
            }
        };
        let header = self.header().at(self.engine.revision());
        Ok(Response::new(pb::AuthenticateResponse { header, token }))
    }

    async fn user_add(
        &self,
        req: Request<pb::AuthUserAddRequest>,
    ) -> Answer<pb::AuthUserAddResponse> {
        let c = self.caller(&req)?;
        let r = req.into_inner();
        let no_password = r.options.is_some_and(|o| o.no_password);
        let (rev, _) =
            self.engine.user_add(c, &r.name, &r.password, no_password).await.map_err(status)?;
        Ok(Response::new(pb::AuthUserAddResponse { header: self.header().at(rev) }))
    }

    async fn user_get(
        &self,
        req: Request<pb::AuthUserGetRequest>,
    ) -> Answer<pb::AuthUserGetResponse> {
        let header = self.auth_read().await?;
        let c = self.caller(&req)?;
        let state = self.engine.auth_state();
        let name = req.into_inner().name;
        // etcd lets a user read its own roles.
        if let Some(c) = c.filter(|c| c.user != name) {
            state.check_admin(&c).map_err(auth_status)?;
        }
        let roles = state.user(&name).map_err(auth_status)?.roles.clone();
        Ok(Response::new(pb::AuthUserGetResponse { header, roles }))
    }

    async fn user_list(
        &self,
        req: Request<pb::AuthUserListRequest>,
    ) -> Answer<pb::AuthUserListResponse> {
        let header = self.auth_read().await?;
        self.check_admin(&req)?;
        let users = self.engine.auth_state().users.keys().cloned().collect();
        Ok(Response::new(pb::AuthUserListResponse { header, users }))
    }

    async fn user_delete(
        &self,
        req: Request<pb::AuthUserDeleteRequest>,
    ) -> Answer<pb::AuthUserDeleteResponse> {
        let name = req.get_ref().name.clone();
        let header = self.change(&req, AuthCommand::UserDelete { name }).await?;
        Ok(Response::new(pb::AuthUserDeleteResponse { header }))
    }

    async fn user_change_password(
        &self,
        req: Request<pb::AuthUserChangePasswordRequest>,
    ) -> Answer<pb::AuthUserChangePasswordResponse> {
        let c = self.caller(&req)?;
        let r = req.into_inner();
        let (rev, _) =
            self.engine.user_change_password(c, &r.name, &r.password).await.map_err(status)?;
        Ok(Response::new(pb::AuthUserChangePasswordResponse { header: self.header().at(rev) }))
    }

    async fn user_grant_role(
        &self,
        req: Request<pb::AuthUserGrantRoleRequest>,
    ) -> Answer<pb::AuthUserGrantRoleResponse> {
        let (user, role) = (req.get_ref().user.clone(), req.get_ref().role.clone());
        let header = self.change(&req, AuthCommand::UserGrantRole { user, role }).await?;
        Ok(Response::new(pb::AuthUserGrantRoleResponse { header }))
    }

    async fn user_revoke_role(
        &self,
        req: Request<pb::AuthUserRevokeRoleRequest>,
    ) -> Answer<pb::AuthUserRevokeRoleResponse> {
        let (name, role) = (req.get_ref().name.clone(), req.get_ref().role.clone());
        let header = self.change(&req, AuthCommand::UserRevokeRole { name, role }).await?;
        Ok(Response::new(pb::AuthUserRevokeRoleResponse { header }))
    }

    async fn role_add(
        &self,
        req: Request<pb::AuthRoleAddRequest>,
    ) -> Answer<pb::AuthRoleAddResponse> {
        let name = req.get_ref().name.clone();
        let header = self.change(&req, AuthCommand::RoleAdd { name }).await?;
        Ok(Response::new(pb::AuthRoleAddResponse { header }))
    }

    async fn role_get(
        &self,
        req: Request<pb::AuthRoleGetRequest>,
    ) -> Answer<pb::AuthRoleGetResponse> {
        let header = self.auth_read().await?;
        let c = self.caller(&req)?;
        let state = self.engine.auth_state();
        let role = req.into_inner().role;
        // etcd lets a user read the roles it holds.
        if let Some(c) = c {
            let holds = state.users.get(&c.user).is_some_and(|u| u.roles.contains(&role));
            if !holds {
                state.check_admin(&c).map_err(auth_status)?;
            }
        }
        let perm = state.role(&role).map_err(auth_status)?.iter().map(perm_pb).collect();
        Ok(Response::new(pb::AuthRoleGetResponse { header, perm }))
    }

    async fn role_list(
        &self,
        req: Request<pb::AuthRoleListRequest>,
    ) -> Answer<pb::AuthRoleListResponse> {
        let header = self.auth_read().await?;
        self.check_admin(&req)?;
        let roles = self.engine.auth_state().roles.keys().cloned().collect();
        Ok(Response::new(pb::AuthRoleListResponse { header, roles }))
    }

    async fn role_delete(
        &self,
        req: Request<pb::AuthRoleDeleteRequest>,
    ) -> Answer<pb::AuthRoleDeleteResponse> {
        let role = req.get_ref().role.clone();
        let header = self.change(&req, AuthCommand::RoleDelete { role }).await?;
        Ok(Response::new(pb::AuthRoleDeleteResponse { header }))
    }

    async fn role_grant_permission(
        &self,
        req: Request<pb::AuthRoleGrantPermissionRequest>,
    ) -> Answer<pb::AuthRoleGrantPermissionResponse> {
        let r = req.get_ref();
        let p = r.perm.as_ref().ok_or_else(|| auth_status(AuthError::PermissionNotGiven))?;
        // A type outside the enum: etcd stores it and no check ever matches it; refusing it
        // says so at once.
        let perm_type = PermType::from_i32(p.perm_type)
            .ok_or_else(|| auth_status(AuthError::InvalidAuthMgmt))?;
        let perm = Permission {
            key: p.key.clone().into(),
            range_end: p.range_end.clone().into(),
            perm_type,
        };
        let change = AuthCommand::RoleGrantPermission { name: r.name.clone(), perm };
        let header = self.change(&req, change).await?;
        Ok(Response::new(pb::AuthRoleGrantPermissionResponse { header }))
    }

    async fn role_revoke_permission(
        &self,
        req: Request<pb::AuthRoleRevokePermissionRequest>,
    ) -> Answer<pb::AuthRoleRevokePermissionResponse> {
        let r = req.get_ref();
        let change = AuthCommand::RoleRevokePermission {
            role: r.role.clone(),
            key: r.key.clone().into(),
            range_end: r.range_end.clone().into(),
        };
        let header = self.change(&req, change).await?;
        Ok(Response::new(pb::AuthRoleRevokePermissionResponse { header }))
    }
}
