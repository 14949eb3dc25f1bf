//! The encoding of auth commands in log entries (tags 30-49 of `command.rs`'s framing): the
//! auth store's changes, with passwords already hashed, and a client's command carried with
//! who asked (etcd's request header).

use cairn_kv::auth::{AuthCommand, PermType, Permission};

use crate::command::{DecodeError, R, W};

/// A client's command with its caller: `user | auth revision u64 | the command's framing`.
pub(crate) const AUTHORIZED: u8 = 30;
const ENABLE: u8 = 31;
const DISABLE: u8 = 32;
const USER_ADD: u8 = 33;
const USER_DELETE: u8 = 34;
const USER_CHANGE_PASSWORD: u8 = 35;
const USER_GRANT_ROLE: u8 = 36;
const USER_REVOKE_ROLE: u8 = 37;
const ROLE_ADD: u8 = 38;
const ROLE_DELETE: u8 = 39;
const ROLE_GRANT_PERMISSION: u8 = 40;
const ROLE_REVOKE_PERMISSION: u8 = 41;

pub(crate) fn auth(w: &mut W, c: &AuthCommand) {
    match c {
        AuthCommand::Enable => w.u8(ENABLE),
        AuthCommand::Disable => w.u8(DISABLE),
        AuthCommand::UserAdd { name, password_hash, no_password } => {
            w.u8(USER_ADD);
            w.bytes(name.as_bytes());
            w.bytes(password_hash.as_bytes());
            w.bool(*no_password);
        }
        AuthCommand::UserDelete { name } => {
            w.u8(USER_DELETE);
            w.bytes(name.as_bytes());
        }
        AuthCommand::UserChangePassword { name, password_hash } => {
            w.u8(USER_CHANGE_PASSWORD);
            w.bytes(name.as_bytes());
            w.bytes(password_hash.as_bytes());
        }
        AuthCommand::UserGrantRole { user, role } => {
            w.u8(USER_GRANT_ROLE);
            w.bytes(user.as_bytes());
            w.bytes(role.as_bytes());
        }
        AuthCommand::UserRevokeRole { name, role } => {
            w.u8(USER_REVOKE_ROLE);
            w.bytes(name.as_bytes());
            w.bytes(role.as_bytes());
        }
        AuthCommand::RoleAdd { name } => {
            w.u8(ROLE_ADD);
            w.bytes(name.as_bytes());
        }
        AuthCommand::RoleDelete { role } => {
            w.u8(ROLE_DELETE);
            w.bytes(role.as_bytes());
        }
        AuthCommand::RoleGrantPermission { name, perm } => {
            w.u8(ROLE_GRANT_PERMISSION);
            w.bytes(name.as_bytes());
            w.bytes(&perm.key);
            w.bytes(&perm.range_end);
            w.u8(perm.perm_type as u8);
        }
        AuthCommand::RoleRevokePermission { role, key, range_end } => {
            w.u8(ROLE_REVOKE_PERMISSION);
            w.bytes(role.as_bytes());
            w.bytes(key);
            w.bytes(range_end);
        }
    }
}

pub(crate) fn get_auth(tag: u8, r: &mut R<'_>) -> Result<AuthCommand, DecodeError> {
    Ok(match tag {
        ENABLE => AuthCommand::Enable,
        DISABLE => AuthCommand::Disable,
        USER_ADD => AuthCommand::UserAdd {
            name: r.string()?,
            password_hash: r.string()?,
            no_password: r.bool()?,
        },
        USER_DELETE => AuthCommand::UserDelete { name: r.string()? },
        USER_CHANGE_PASSWORD => {
            AuthCommand::UserChangePassword { name: r.string()?, password_hash: r.string()? }
        }
        USER_GRANT_ROLE => AuthCommand::UserGrantRole { user: r.string()?, role: r.string()? },
        USER_REVOKE_ROLE => AuthCommand::UserRevokeRole { name: r.string()?, role: r.string()? },
        ROLE_ADD => AuthCommand::RoleAdd { name: r.string()? },
        ROLE_DELETE => AuthCommand::RoleDelete { role: r.string()? },
        ROLE_GRANT_PERMISSION => {
            let name = r.string()?;
            let key = r.bytes()?;
            let range_end = r.bytes()?;
            let perm_type =
                PermType::from_i32(i32::from(r.u8()?)).ok_or(DecodeError("bad permission type"))?;
            AuthCommand::RoleGrantPermission {
                name,
                perm: Permission { key, range_end, perm_type },
            }
        }
        ROLE_REVOKE_PERMISSION => AuthCommand::RoleRevokePermission {
            role: r.string()?,
            key: r.bytes()?,
            range_end: r.bytes()?,
        },
        _ => return Err(DecodeError("unknown auth command")),
    })
}

#[cfg(test)]
mod tests {
    use cairn_kv::auth::Caller;
    use cairn_kv::{Command, PutRequest};

    use super::*;
    use crate::command::{decode, encode};

    #[test]
    fn every_auth_command_and_a_caller_round_trip() {
        let perm =
            Permission { key: "a".into(), range_end: "\0".into(), perm_type: PermType::Write };
        let changes = vec![
            AuthCommand::Enable,
            AuthCommand::Disable,
            AuthCommand::UserAdd {
                name: "u".into(),
                password_hash: "$2b$".into(),
                no_password: true,
            },
            AuthCommand::UserDelete { name: "u".into() },
            AuthCommand::UserChangePassword { name: "u".into(), password_hash: "h".into() },
            AuthCommand::UserGrantRole { user: "u".into(), role: "r".into() },
            AuthCommand::UserRevokeRole { name: "u".into(), role: "r".into() },
            AuthCommand::RoleAdd { name: "r".into() },
            AuthCommand::RoleDelete { role: "r".into() },
            AuthCommand::RoleGrantPermission { name: "r".into(), perm },
            AuthCommand::RoleRevokePermission {
                role: "r".into(),
                key: "a".into(),
                range_end: "b".into(),
            },
        ];
        for change in changes {
            let cmd = Command::Auth(change);
            assert_eq!(decode(&encode(7, &cmd)).expect("decodes"), (7, cmd));
        }
        let put = Command::Put(PutRequest { key: "k".into(), ..PutRequest::default() });
        let cmd = Command::Authorized {
            caller: Caller { user: "u".into(), revision: 9 },
            command: Box::new(put),
        };
        let raw = encode(3, &cmd);
        assert_eq!(decode(&raw).expect("decodes"), (3, cmd.clone()));
        for cut in 0..raw.len() {
            assert!(decode(&raw[..cut]).is_err(), "cut at {cut}");
        }
        let nested = Command::Authorized { caller: Caller::default(), command: Box::new(cmd) };
        assert!(decode(&encode(1, &nested)).is_err(), "a caller inside a caller is refused");
    }
}
