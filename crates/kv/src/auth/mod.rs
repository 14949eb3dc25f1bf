//! etcd's auth store as replicated state: users, roles, their key permissions, whether auth is
//! enabled, and the auth revision. Every change is a [`AuthCommand`] applied through the log, so
//! every member holds the same store; it lives beside the key space (no key revision, invisible
//! to Range, Watch and HashKV), persisted with the data it describes and carried in snapshots.
//!
//! The rules are etcd's (`server/auth/store.go`): a root user holding the root role must exist
//! before auth is enabled, neither can be removed while it is on, and each change moves the auth
//! revision, which lets a member refuse a request checked against an older store.

mod codec;
mod perm;

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;

pub use perm::Caller;

/// The user and the role that pass every check once auth is enabled.
pub const ROOT: &str = "root";

/// What a permission allows (etcd's `authpb.Permission_Type`; the numbers are the wire's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PermType {
    /// Range and watch.
    Read = 0,
    /// Put and delete.
    Write = 1,
    /// Both.
    ReadWrite = 2,
}

impl PermType {
    /// The type a wire number names, if any.
    pub fn from_i32(v: i32) -> Option<PermType> {
        match v {
            0 => Some(PermType::Read),
            1 => Some(PermType::Write),
            2 => Some(PermType::ReadWrite),
            _ => None,
        }
    }

    fn reads(self) -> bool {
        matches!(self, PermType::Read | PermType::ReadWrite)
    }

    fn writes(self) -> bool {
        matches!(self, PermType::Write | PermType::ReadWrite)
    }
}

/// A key permission: one key (empty `range_end`), the keys in `[key, range_end)`, or every key
/// from `key` on (`range_end` = `"\0"`), as etcd reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permission {
    /// The first key.
    pub key: Bytes,
    /// The end of the range (exclusive); empty for one key, `"\0"` for no end.
    pub range_end: Bytes,
    /// What it allows.
    pub perm_type: PermType,
}

/// A user as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct User {
    /// Its name.
    pub name: String,
    /// The bcrypt hash of its password (never the password: members hash before proposing);
    /// empty for a user without a password.
    pub password_hash: String,
    /// Its roles, sorted.
    pub roles: Vec<String>,
    /// etcd's `no_password` option: it authenticates only by other means (a client
    /// certificate's common name).
    pub no_password: bool,
}

impl User {
    /// Whether it holds the root role.
    pub fn is_root(&self) -> bool {
        self.roles.binary_search_by(|r| r.as_str().cmp(ROOT)).is_ok()
    }
}

/// A role as stored: its permissions, sorted by key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Role {
    /// Its name.
    pub name: String,
    /// Its permissions, sorted by key.
    pub permissions: Vec<Permission>,
}

/// The whole auth store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthState {
    /// Whether requests are checked.
    pub enabled: bool,
    /// etcd's auth revision: 1 for a new store, moved by every change but AuthEnable.
    pub revision: u64,
    /// The auth revision at the latest AuthDisable (0: never): tokens issued before it are void,
    /// as etcd drops every token when auth is disabled.
    pub disabled_at: u64,
    /// Users by name.
    pub users: BTreeMap<String, User>,
    /// Roles by name (the root role is implicit, as in etcd: it is granted, never added).
    pub roles: BTreeMap<String, Role>,
}

impl Default for AuthState {
    fn default() -> AuthState {
        AuthState {
            enabled: false,
            revision: 1,
            disabled_at: 0,
            users: BTreeMap::new(),
            roles: BTreeMap::new(),
        }
    }
}

/// A change to the auth store, as replicated. Passwords arrive hashed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthCommand {
    /// Turns checking on; refused without a root user holding the root role.
    Enable,
    /// Turns checking off.
    Disable,
    /// Adds a user.
    UserAdd {
        /// Its name.
        name: String,
        /// The bcrypt hash of its password; empty with `no_password`.
        password_hash: String,
        /// etcd's `no_password` option.
        no_password: bool,
    },
    /// Deletes a user.
    UserDelete {
        /// Its name.
        name: String,
    },
    /// Replaces a user's password.
    UserChangePassword {
        /// Its name.
        name: String,
        /// The new password's bcrypt hash.
        password_hash: String,
    },
    /// Grants a role to a user.
    UserGrantRole {
        /// The user.
        user: String,
        /// The role.
        role: String,
    },
    /// Revokes a role from a user.
    UserRevokeRole {
        /// The user.
        name: String,
        /// The role.
        role: String,
    },
    /// Adds a role.
    RoleAdd {
        /// Its name.
        name: String,
    },
    /// Deletes a role, and revokes it from every user.
    RoleDelete {
        /// Its name.
        role: String,
    },
    /// Grants a permission to a role (replacing the type of one on the same range).
    RoleGrantPermission {
        /// The role.
        name: String,
        /// The permission.
        perm: Permission,
    },
    /// Revokes the permission on exactly `[key, range_end)` from a role.
    RoleRevokePermission {
        /// The role.
        role: String,
        /// The permission's key.
        key: Bytes,
        /// The permission's range end.
        range_end: Bytes,
    },
}

impl AuthCommand {
    /// Whether only a root user may ask for it once auth is on (every change does).
    pub fn needs_admin(&self) -> bool {
        true
    }
}

/// etcd's auth errors; [`AuthError::etcd_message`] is the message clients match on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum AuthError {
    RootUserNotExist,
    RootRoleNotExist,
    UserAlreadyExist,
    UserEmpty,
    UserNotFound,
    RoleAlreadyExist,
    RoleNotFound,
    RoleEmpty,
    AuthFailed,
    PermissionNotGiven,
    PermissionDenied,
    RoleNotGranted,
    PermissionNotGranted,
    AuthNotEnabled,
    InvalidAuthToken,
    InvalidAuthMgmt,
    AuthOldRevision,
}

impl AuthError {
    /// etcd's description (`api/v3rpc/rpctypes`).
    pub fn etcd_message(self) -> &'static str {
        match self {
            AuthError::RootUserNotExist => "etcdserver: root user does not exist",
            AuthError::RootRoleNotExist => "etcdserver: root user does not have root role",
            AuthError::UserAlreadyExist => "etcdserver: user name already exists",
            AuthError::UserEmpty => "etcdserver: user name is empty",
            AuthError::UserNotFound => "etcdserver: user name not found",
            AuthError::RoleAlreadyExist => "etcdserver: role name already exists",
            AuthError::RoleNotFound => "etcdserver: role name not found",
            AuthError::RoleEmpty => "etcdserver: role name is empty",
            AuthError::AuthFailed => {
                "etcdserver: authentication failed, invalid user ID or password"
            }
            AuthError::PermissionNotGiven => "etcdserver: permission not given",
            AuthError::PermissionDenied => "etcdserver: permission denied",
            AuthError::RoleNotGranted => "etcdserver: role is not granted to the user",
            AuthError::PermissionNotGranted => "etcdserver: permission is not granted to the role",
            AuthError::AuthNotEnabled => "etcdserver: authentication is not enabled",
            AuthError::InvalidAuthToken => "etcdserver: invalid auth token",
            AuthError::InvalidAuthMgmt => "etcdserver: invalid auth management",
            AuthError::AuthOldRevision => "etcdserver: revision of auth store is old",
        }
    }
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.etcd_message())
    }
}

impl std::error::Error for AuthError {}

impl AuthState {
    /// Applies a change with etcd's rules; a refused change leaves the store as it was.
    pub fn apply(&mut self, cmd: &AuthCommand) -> Result<(), AuthError> {
        match cmd {
            AuthCommand::Enable => return self.enable(),
            AuthCommand::Disable => {
                if !self.enabled {
                    return Ok(());
                }
                self.enabled = false;
                self.revision += 1;
                self.disabled_at = self.revision;
                return Ok(());
            }
            AuthCommand::UserAdd { name, password_hash, no_password } => {
                self.add_user(name, password_hash, *no_password)?
            }
            AuthCommand::UserDelete { name } => {
                if self.enabled && name == ROOT {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                self.users.remove(name).ok_or(AuthError::UserNotFound)?;
            }
            AuthCommand::UserChangePassword { name, password_hash } => {
                let user = self.users.get_mut(name).ok_or(AuthError::UserNotFound)?;
                if !user.no_password {
                    user.password_hash = password_hash.clone();
                }
            }
            AuthCommand::UserGrantRole { user, role } => {
                if !self.grant_role(user, role)? {
                    // etcd answers a repeated grant with success, changing nothing.
                    return Ok(());
                }
            }
            AuthCommand::UserRevokeRole { name, role } => self.revoke_role(name, role)?,
            AuthCommand::RoleAdd { name } => self.add_role(name)?,
            AuthCommand::RoleDelete { role } => {
                if self.enabled && role == ROOT {
                    return Err(AuthError::InvalidAuthMgmt);
                }
                self.roles.remove(role).ok_or(AuthError::RoleNotFound)?;
                for user in self.users.values_mut() {
                    user.roles.retain(|r| r != role);
                }
            }
            AuthCommand::RoleGrantPermission { name, perm } => self.grant_permission(name, perm)?,
            AuthCommand::RoleRevokePermission { role, key, range_end } => {
                let r = self.roles.get_mut(role).ok_or(AuthError::RoleNotFound)?;
                let before = r.permissions.len();
                r.permissions.retain(|p| p.key != key || p.range_end != range_end);
                if r.permissions.len() == before {
                    return Err(AuthError::PermissionNotGranted);
                }
            }
        }
        self.revision += 1;
        Ok(())
    }

    fn add_user(&mut self, name: &str, hash: &str, no_password: bool) -> Result<(), AuthError> {
        if name.is_empty() {
            return Err(AuthError::UserEmpty);
        }
        if self.users.contains_key(name) {
            return Err(AuthError::UserAlreadyExist);
        }
        let user = User {
            name: name.to_string(),
            password_hash: hash.to_string(),
            roles: Vec::new(),
            no_password,
        };
        self.users.insert(name.to_string(), user);
        Ok(())
    }

    fn revoke_role(&mut self, name: &str, role: &str) -> Result<(), AuthError> {
        if self.enabled && name == ROOT && role == ROOT {
            return Err(AuthError::InvalidAuthMgmt);
        }
        let user = self.users.get_mut(name).ok_or(AuthError::UserNotFound)?;
        let before = user.roles.len();
        user.roles.retain(|r| r != role);
        if user.roles.len() == before {
            return Err(AuthError::RoleNotGranted);
        }
        Ok(())
    }

    fn add_role(&mut self, name: &str) -> Result<(), AuthError> {
        if name.is_empty() {
            return Err(AuthError::RoleEmpty);
        }
        if self.roles.contains_key(name) {
            return Err(AuthError::RoleAlreadyExist);
        }
        let role = Role { name: name.to_string(), permissions: vec![] };
        self.roles.insert(name.to_string(), role);
        Ok(())
    }

    /// etcd enables without moving the revision, and ignores a second enable.
    fn enable(&mut self) -> Result<(), AuthError> {
        if self.enabled {
            return Ok(());
        }
        let root = self.users.get(ROOT).ok_or(AuthError::RootUserNotExist)?;
        if !root.is_root() {
            return Err(AuthError::RootRoleNotExist);
        }
        self.enabled = true;
        Ok(())
    }

    /// Returns whether the user lacked the role.
    fn grant_role(&mut self, user: &str, role: &str) -> Result<bool, AuthError> {
        if !self.users.contains_key(user) {
            return Err(AuthError::UserNotFound);
        }
        // The root role is never added: granting it is what makes a root user.
        if role != ROOT && !self.roles.contains_key(role) {
            return Err(AuthError::RoleNotFound);
        }
        let u = self.users.get_mut(user).ok_or(AuthError::UserNotFound)?;
        match u.roles.binary_search_by(|r| r.as_str().cmp(role)) {
            Ok(_) => Ok(false),
            Err(at) => {
                u.roles.insert(at, role.to_string());
                Ok(true)
            }
        }
    }

    fn grant_permission(&mut self, name: &str, perm: &Permission) -> Result<(), AuthError> {
        if !valid_permission_range(&perm.key, &perm.range_end) {
            return Err(AuthError::InvalidAuthMgmt);
        }
        let role = self.roles.get_mut(name).ok_or(AuthError::RoleNotFound)?;
        match role
            .permissions
            .iter_mut()
            .find(|p| p.key == perm.key && p.range_end == perm.range_end)
        {
            Some(p) => p.perm_type = perm.perm_type,
            None => {
                role.permissions.push(perm.clone());
                role.permissions.sort_by(|a, b| a.key.cmp(&b.key));
            }
        }
        Ok(())
    }

    /// The roles a user holds (for UserGet), or why not.
    pub fn user(&self, name: &str) -> Result<&User, AuthError> {
        self.users.get(name).ok_or(AuthError::UserNotFound)
    }

    /// A role's permissions (for RoleGet), or why not. The root role exists implicitly.
    pub fn role(&self, name: &str) -> Result<&[Permission], AuthError> {
        match self.roles.get(name) {
            Some(r) => Ok(&r.permissions),
            None if name == ROOT => Ok(&[]),
            None => Err(AuthError::RoleNotFound),
        }
    }

    /// The store as persisted and carried in snapshot images.
    pub fn encode(&self) -> Vec<u8> {
        codec::encode(self)
    }

    /// The store from [`AuthState::encode`]'s bytes.
    pub fn decode(raw: &[u8]) -> Result<AuthState, crate::BackendError> {
        codec::decode(raw).map_err(crate::BackendError::Corrupt)
    }
}

/// etcd's `isValidPermissionRange`: a key is required, and a range must not be empty or
/// reversed unless it is open-ended (`"\0"`).
fn valid_permission_range(key: &[u8], range_end: &[u8]) -> bool {
    if key.is_empty() {
        return false;
    }
    range_end.is_empty() || key < range_end || range_end == b"\0"
}

#[cfg(test)]
mod tests;
