//! The auth store's binary form, persisted beside the key space and carried in snapshot
//! images: `version u8 (=1) | enabled u8 | revision u64 | disabled_at u64 | users | roles`,
//! each list a `count u32` then its items; strings and keys are `len u32 | bytes`, numbers
//! big-endian. Decoding never panics: damaged bytes are an error.

use bytes::{Buf, BufMut, Bytes};

use super::{AuthState, PermType, Permission, Role, User};

const VERSION: u8 = 1;

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.put_u32(b.len() as u32);
    out.put_slice(b);
}

pub(super) fn encode(s: &AuthState) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.put_u8(VERSION);
    out.put_u8(u8::from(s.enabled));
    out.put_u64(s.revision);
    out.put_u64(s.disabled_at);
    out.put_u32(s.users.len() as u32);
    for u in s.users.values() {
        put_bytes(&mut out, u.name.as_bytes());
        put_bytes(&mut out, u.password_hash.as_bytes());
        out.put_u8(u8::from(u.no_password));
        out.put_u32(u.roles.len() as u32);
        for r in &u.roles {
            put_bytes(&mut out, r.as_bytes());
        }
    }
    out.put_u32(s.roles.len() as u32);
    for r in s.roles.values() {
        put_bytes(&mut out, r.name.as_bytes());
        out.put_u32(r.permissions.len() as u32);
        for p in &r.permissions {
            put_bytes(&mut out, &p.key);
            put_bytes(&mut out, &p.range_end);
            out.put_u8(p.perm_type as u8);
        }
    }
    out
}

struct R<'a>(&'a [u8]);

const SHORT: &str = "auth store cut short";

impl R<'_> {
    fn need(&self, n: usize) -> Result<(), &'static str> {
        if self.0.len() < n {
            Err(SHORT)
        } else {
            Ok(())
        }
    }
    fn u8(&mut self) -> Result<u8, &'static str> {
        self.need(1)?;
        Ok(self.0.get_u8())
    }
    fn u64(&mut self) -> Result<u64, &'static str> {
        self.need(8)?;
        Ok(self.0.get_u64())
    }
    /// A count of items, each at least one byte long: one beyond the input is damage.
    fn count(&mut self) -> Result<usize, &'static str> {
        self.need(4)?;
        let n = self.0.get_u32() as usize;
        if n > self.0.len() {
            return Err(SHORT);
        }
        Ok(n)
    }
    fn bytes(&mut self) -> Result<Bytes, &'static str> {
        self.need(4)?;
        let n = self.0.get_u32() as usize;
        self.need(n)?;
        let b = Bytes::copy_from_slice(&self.0[..n]);
        self.0.advance(n);
        Ok(b)
    }
    fn string(&mut self) -> Result<String, &'static str> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| "auth store name not UTF-8")
    }
}

pub(super) fn decode(raw: &[u8]) -> Result<AuthState, &'static str> {
    let mut r = R(raw);
    if r.u8()? != VERSION {
        return Err("auth store of an unknown version");
    }
    let mut s = AuthState { enabled: r.u8()? != 0, revision: r.u64()?, ..AuthState::default() };
    s.disabled_at = r.u64()?;
    for _ in 0..r.count()? {
        let name = r.string()?;
        let password_hash = r.string()?;
        let no_password = r.u8()? != 0;
        let roles = (0..r.count()?).map(|_| r.string()).collect::<Result<_, _>>()?;
        s.users.insert(name.clone(), User { name, password_hash, roles, no_password });
    }
    for _ in 0..r.count()? {
        let name = r.string()?;
        let n = r.count()?;
        let mut permissions = Vec::with_capacity(n);
        for _ in 0..n {
            let key = r.bytes()?;
            let range_end = r.bytes()?;
            let perm_type = PermType::from_i32(i32::from(r.u8()?)).ok_or("bad permission type")?;
            permissions.push(Permission { key, range_end, perm_type });
        }
        s.roles.insert(name.clone(), Role { name, permissions });
    }
    if !r.0.is_empty() {
        return Err("bytes after the auth store");
    }
    Ok(s)
}
