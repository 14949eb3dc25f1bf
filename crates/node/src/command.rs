//! The binary encoding of replicated commands: what a Raft entry's data holds.
//!
//! `version u8 (=1) | request id u64 | command`, where a command is a tag byte followed by its
//! fields; byte strings are `len u32 | bytes`, numbers big-endian, booleans one byte. Decoding
//! never panics: a malformed entry is an error (and a bug, since only this code writes them).

use bytes::{Buf, BufMut, Bytes};
use cairn_kv::*;

const VERSION: u8 = 1;

/// A decoding failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError(pub(crate) &'static str);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed command: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

pub(crate) struct W(pub(crate) Vec<u8>);

impl W {
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.0.put_u32(b.len() as u32);
        self.0.put_slice(b);
    }
    pub(crate) fn i64(&mut self, v: i64) {
        self.0.put_i64(v);
    }
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.put_u8(v);
    }
    pub(crate) fn bool(&mut self, v: bool) {
        self.0.put_u8(u8::from(v));
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.put_u64(v);
    }
}

pub(crate) struct R<'a>(pub(crate) &'a [u8]);

impl R<'_> {
    pub(crate) fn need(&self, n: usize) -> Result<(), DecodeError> {
        if self.0.len() < n {
            Err(DecodeError("truncated"))
        } else {
            Ok(())
        }
    }
    pub(crate) fn bytes(&mut self) -> Result<Bytes, DecodeError> {
        self.need(4)?;
        let n = self.0.get_u32() as usize;
        self.need(n)?;
        let b = Bytes::copy_from_slice(&self.0[..n]);
        self.0.advance(n);
        Ok(b)
    }
    pub(crate) fn i64(&mut self) -> Result<i64, DecodeError> {
        self.need(8)?;
        Ok(self.0.get_i64())
    }
    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        self.need(1)?;
        Ok(self.0.get_u8())
    }
    pub(crate) fn bool(&mut self) -> Result<bool, DecodeError> {
        Ok(self.u8()? != 0)
    }
    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        self.need(8)?;
        Ok(self.0.get_u64())
    }
    pub(crate) fn string(&mut self) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| DecodeError("string not UTF-8"))
    }
    pub(crate) fn count(&mut self) -> Result<usize, DecodeError> {
        self.need(4)?;
        let n = self.0.get_u32() as usize;
        // Each element takes at least one byte: a count beyond the input is corrupt.
        if n > self.0.len() {
            return Err(DecodeError("count beyond input"));
        }
        Ok(n)
    }
}

/// Encodes a command proposed under `request_id`.
pub fn encode(request_id: u64, cmd: &Command) -> Bytes {
    let mut w = W(Vec::with_capacity(64));
    w.u8(VERSION);
    w.0.put_u64(request_id);
    match cmd {
        Command::Put(p) => {
            w.u8(1);
            put(&mut w, p);
        }
        Command::DeleteRange(d) => {
            w.u8(2);
            delete(&mut w, d);
        }
        Command::Txn(t) => {
            w.u8(3);
            txn(&mut w, t);
        }
        Command::Compact(c) => {
            w.u8(4);
            w.i64(c.revision.0);
            w.bool(c.physical);
        }
        Command::PublishMember { member, attributes } => {
            w.u8(5);
            w.u64(*member);
            publish(&mut w, attributes);
        }
        Command::LeaseGrant { .. }
        | Command::LeaseRevoke { .. }
        | Command::LeaseExpire { .. }
        | Command::LeaseCheckpoint { .. }
        | Command::LeaseGrantCheckpoint { .. } => lease(&mut w, cmd),
        Command::Membership { peers, removed } => {
            w.u8(9);
            membership(&mut w, peers, removed);
        }
        // Alarms take tags 20-29.
        Command::AlarmActivate(a) => {
            w.u8(20);
            alarm(&mut w, a);
        }
        Command::AlarmDeactivate(a) => {
            w.u8(21);
            alarm(&mut w, a);
        }
        Command::Auth(change) => crate::command_auth::auth(&mut w, change),
        Command::Authorized { caller, command } => {
            w.u8(crate::command_auth::AUTHORIZED);
            w.bytes(caller.user.as_bytes());
            w.u64(caller.revision);
            let inner = encode(0, command);
            // The inner command's own framing, without its version and id.
            w.bytes(&inner[9..]);
        }
    }
    w.0.into()
}

/// The lease commands' tags (6, 7, 8, 10, 11) and fields.
fn lease(w: &mut W, cmd: &Command) {
    match cmd {
        Command::LeaseGrant { id, ttl } => {
            w.u8(6);
            w.i64(id.0);
            w.i64(*ttl);
        }
        Command::LeaseRevoke { id } => {
            w.u8(7);
            w.i64(id.0);
        }
        // A tag of its own rather than a field added to tag 7: entries an older cairn wrote
        // still decode as they were meant, and an older member applying this one stops at it
        // as unknown (naming the entry) instead of misreading it as an unconditional revoke.
        Command::LeaseExpire { id, grant_index } => {
            w.u8(10);
            w.i64(id.0);
            w.u64(*grant_index);
        }
        Command::LeaseCheckpoint { checkpoints } => {
            w.u8(8);
            w.0.put_u32(checkpoints.len() as u32);
            for (id, remaining) in checkpoints {
                w.i64(id.0);
                w.i64(*remaining);
            }
        }
        // A tag of its own for the same reason as tag 10: tag 8 entries an older cairn wrote
        // still apply by id, as they were meant, and an older member stops at this one rather
        // than misreading the grant's index as a lease id.
        Command::LeaseGrantCheckpoint { checkpoints } => {
            w.u8(11);
            w.0.put_u32(checkpoints.len() as u32);
            for c in checkpoints {
                w.i64(c.id.0);
                w.u64(c.grant_index);
                w.i64(c.remaining);
            }
        }
        _ => unreachable!("only lease commands come here"),
    }
}

/// Decodes an entry's data into its request id and command.
pub fn decode(raw: &[u8]) -> Result<(u64, Command), DecodeError> {
    let mut r = R(raw);
    if r.u8()? != VERSION {
        return Err(DecodeError("unknown version"));
    }
    r.need(8)?;
    let id = r.0.get_u64();
    let cmd = match r.u8()? {
        1 => Command::Put(get_put(&mut r)?),
        2 => Command::DeleteRange(get_delete(&mut r)?),
        3 => Command::Txn(get_txn(&mut r, 0)?),
        4 => Command::Compact(CompactRequest { revision: Revision(r.i64()?), physical: r.bool()? }),
        5 => Command::PublishMember { member: r.u64()?, attributes: get_publish(&mut r)? },
        6 => Command::LeaseGrant { id: LeaseId(r.i64()?), ttl: r.i64()? },
        7 => Command::LeaseRevoke { id: LeaseId(r.i64()?) },
        10 => Command::LeaseExpire { id: LeaseId(r.i64()?), grant_index: r.u64()? },
        8 => {
            // Each checkpoint takes 16 bytes: a count beyond what is left is malformed.
            let n = r.count()?;
            r.need(n.saturating_mul(16))?;
            let checkpoints =
                (0..n).map(|_| Ok((LeaseId(r.i64()?), r.i64()?))).collect::<Result<_, _>>()?;
            Command::LeaseCheckpoint { checkpoints }
        }
        11 => Command::LeaseGrantCheckpoint { checkpoints: get_grant_checkpoints(&mut r)? },
        20 => Command::AlarmActivate(get_alarm(&mut r)?),
        21 => Command::AlarmDeactivate(get_alarm(&mut r)?),
        crate::command_auth::AUTHORIZED => {
            let user = r.string()?;
            let revision = r.u64()?;
            let inner = r.bytes()?;
            let mut framed = vec![VERSION];
            framed.extend_from_slice(&[0; 8]);
            framed.extend_from_slice(&inner);
            let command = match decode(&framed)?.1 {
                Command::Authorized { .. } => return Err(DecodeError("a caller inside a caller")),
                c => Box::new(c),
            };
            Command::Authorized { caller: cairn_kv::auth::Caller { user, revision }, command }
        }
        tag @ 30..=49 => Command::Auth(crate::command_auth::get_auth(tag, &mut r)?),
        9 => {
            let n = r.count()?;
            let peers =
                (0..n).map(|_| Ok((r.u64()?, urls_in(&mut r)?))).collect::<Result<_, _>>()?;
            let n = r.count()?;
            r.need(n.saturating_mul(8))?;
            let removed = (0..n).map(|_| r.u64()).collect::<Result<_, _>>()?;
            Command::Membership { peers, removed }
        }
        _ => return Err(DecodeError("unknown command")),
    };
    if !r.0.is_empty() {
        return Err(DecodeError("trailing bytes"));
    }
    Ok((id, cmd))
}

/// `count u32 | (id i64 | grant_index u64 | remaining i64)*` (tag 11).
fn get_grant_checkpoints(r: &mut R<'_>) -> Result<Vec<GrantCheckpoint>, DecodeError> {
    // Each checkpoint takes 24 bytes: a count beyond what is left is malformed, and refused
    // before anything is allocated for it.
    let n = r.count()?;
    r.need(n.saturating_mul(24))?;
    (0..n)
        .map(|_| {
            Ok(GrantCheckpoint {
                id: LeaseId(r.i64()?),
                grant_index: r.u64()?,
                remaining: r.i64()?,
            })
        })
        .collect()
}

/// `member u64 | type u8` (etcd's numbers).
fn alarm(w: &mut W, a: &AlarmMember) {
    w.u64(a.member);
    w.u8(a.alarm as u8);
}

fn get_alarm(r: &mut R<'_>) -> Result<AlarmMember, DecodeError> {
    let member = r.u64()?;
    let alarm = AlarmType::from_i32(i32::from(r.u8()?)).ok_or(DecodeError("bad alarm type"))?;
    Ok(AlarmMember { member, alarm })
}

/// `count u32 | (member u64 | urls)* | count u32 | removed member u64*`.
fn membership(w: &mut W, peers: &[(u64, Vec<String>)], removed: &[u64]) {
    w.0.put_u32(peers.len() as u32);
    for (member, urls) in peers {
        w.u64(*member);
        urls_out(w, urls);
    }
    w.0.put_u32(removed.len() as u32);
    for member in removed {
        w.u64(*member);
    }
}

/// `count u32 | url*`.
fn urls_out(w: &mut W, urls: &[String]) {
    w.0.put_u32(urls.len() as u32);
    for url in urls {
        w.bytes(url.as_bytes());
    }
}

fn urls_in(r: &mut R<'_>) -> Result<Vec<String>, DecodeError> {
    let n = r.count()?;
    (0..n).map(|_| r.string()).collect()
}

/// `name | count u32 | url*`.
fn publish(w: &mut W, a: &MemberAttributes) {
    w.bytes(a.name.as_bytes());
    w.0.put_u32(a.client_urls.len() as u32);
    for url in &a.client_urls {
        w.bytes(url.as_bytes());
    }
}

fn get_publish(r: &mut R<'_>) -> Result<MemberAttributes, DecodeError> {
    let name = r.string()?;
    let n = r.count()?;
    let client_urls = (0..n).map(|_| r.string()).collect::<Result<_, _>>()?;
    Ok(MemberAttributes { name, client_urls, ..Default::default() })
}

fn put(w: &mut W, p: &PutRequest) {
    w.bytes(&p.key);
    w.bytes(&p.value);
    w.i64(p.lease.0);
    w.bool(p.prev_kv);
    w.bool(p.ignore_value);
    w.bool(p.ignore_lease);
}

fn get_put(r: &mut R<'_>) -> Result<PutRequest, DecodeError> {
    Ok(PutRequest {
        key: r.bytes()?,
        value: r.bytes()?,
        lease: LeaseId(r.i64()?),
        prev_kv: r.bool()?,
        ignore_value: r.bool()?,
        ignore_lease: r.bool()?,
    })
}

fn delete(w: &mut W, d: &DeleteRangeRequest) {
    w.bytes(&d.key);
    w.bytes(&d.range_end);
    w.bool(d.prev_kv);
}

fn get_delete(r: &mut R<'_>) -> Result<DeleteRangeRequest, DecodeError> {
    Ok(DeleteRangeRequest { key: r.bytes()?, range_end: r.bytes()?, prev_kv: r.bool()? })
}

fn range(w: &mut W, q: &RangeRequest) {
    w.bytes(&q.key);
    w.bytes(&q.range_end);
    w.i64(q.limit);
    w.i64(q.revision.0);
    w.u8(q.sort_order as u8);
    w.u8(q.sort_target as u8);
    w.bool(q.serializable);
    w.bool(q.keys_only);
    w.bool(q.count_only);
    for r in [q.min_mod_revision, q.max_mod_revision, q.min_create_revision, q.max_create_revision]
    {
        w.i64(r.0);
    }
}

fn get_range(r: &mut R<'_>) -> Result<RangeRequest, DecodeError> {
    let key = r.bytes()?;
    let range_end = r.bytes()?;
    let limit = r.i64()?;
    let revision = Revision(r.i64()?);
    let sort_order = match r.u8()? {
        0 => SortOrder::None,
        1 => SortOrder::Ascend,
        2 => SortOrder::Descend,
        _ => return Err(DecodeError("bad sort order")),
    };
    let sort_target = match r.u8()? {
        0 => SortTarget::Key,
        1 => SortTarget::Version,
        2 => SortTarget::Create,
        3 => SortTarget::Mod,
        4 => SortTarget::Value,
        _ => return Err(DecodeError("bad sort target")),
    };
    Ok(RangeRequest {
        key,
        range_end,
        limit,
        revision,
        sort_order,
        sort_target,
        serializable: r.bool()?,
        keys_only: r.bool()?,
        count_only: r.bool()?,
        min_mod_revision: Revision(r.i64()?),
        max_mod_revision: Revision(r.i64()?),
        min_create_revision: Revision(r.i64()?),
        max_create_revision: Revision(r.i64()?),
    })
}

fn compare(w: &mut W, c: &Compare) {
    w.bytes(&c.key);
    w.bytes(&c.range_end);
    w.u8(c.result as u8);
    match &c.target {
        CompareTarget::Version(v) => {
            w.u8(0);
            w.i64(*v);
        }
        CompareTarget::Create(r) => {
            w.u8(1);
            w.i64(r.0);
        }
        CompareTarget::Mod(r) => {
            w.u8(2);
            w.i64(r.0);
        }
        CompareTarget::Value(v) => {
            w.u8(3);
            w.bytes(v);
        }
        CompareTarget::Lease(l) => {
            w.u8(4);
            w.i64(l.0);
        }
    }
}

fn get_compare(r: &mut R<'_>) -> Result<Compare, DecodeError> {
    let key = r.bytes()?;
    let range_end = r.bytes()?;
    let result = match r.u8()? {
        0 => CompareResult::Equal,
        1 => CompareResult::Greater,
        2 => CompareResult::Less,
        3 => CompareResult::NotEqual,
        _ => return Err(DecodeError("bad compare result")),
    };
    let target = match r.u8()? {
        0 => CompareTarget::Version(r.i64()?),
        1 => CompareTarget::Create(Revision(r.i64()?)),
        2 => CompareTarget::Mod(Revision(r.i64()?)),
        3 => CompareTarget::Value(r.bytes()?),
        4 => CompareTarget::Lease(LeaseId(r.i64()?)),
        _ => return Err(DecodeError("bad compare target")),
    };
    Ok(Compare { key, range_end, target, result })
}

fn txn(w: &mut W, t: &TxnRequest) {
    w.0.put_u32(t.compare.len() as u32);
    for c in &t.compare {
        compare(w, c);
    }
    for branch in [&t.success, &t.failure] {
        w.0.put_u32(branch.len() as u32);
        for op in branch {
            match op {
                RequestOp::Range(q) => {
                    w.u8(0);
                    range(w, q);
                }
                RequestOp::Put(p) => {
                    w.u8(1);
                    put(w, p);
                }
                RequestOp::DeleteRange(d) => {
                    w.u8(2);
                    delete(w, d);
                }
                RequestOp::Txn(n) => {
                    w.u8(3);
                    txn(w, n);
                }
            }
        }
    }
}

/// Nesting deeper than this is refused, so hostile input cannot exhaust the stack. It exceeds
/// what validation admits (`cairn_kv::validate::MAX_TXN_DEPTH`), so every proposed command
/// decodes when applied.
const MAX_DEPTH: u32 = 128;

fn get_txn(r: &mut R<'_>, depth: u32) -> Result<TxnRequest, DecodeError> {
    if depth > MAX_DEPTH {
        return Err(DecodeError("transactions nested too deeply"));
    }
    let n = r.count()?;
    let compare = (0..n).map(|_| get_compare(r)).collect::<Result<_, _>>()?;
    let mut branches = [Vec::new(), Vec::new()];
    for branch in &mut branches {
        let n = r.count()?;
        for _ in 0..n {
            branch.push(match r.u8()? {
                0 => RequestOp::Range(get_range(r)?),
                1 => RequestOp::Put(get_put(r)?),
                2 => RequestOp::DeleteRange(get_delete(r)?),
                3 => RequestOp::Txn(get_txn(r, depth + 1)?),
                _ => return Err(DecodeError("bad request op")),
            });
        }
    }
    let [success, failure] = branches;
    Ok(TxnRequest { compare, success, failure })
}
