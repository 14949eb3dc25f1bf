//! The seam between the data model and the bytes on disk.
//!
//! The history is a map from [`RevisionId`] to an encoded [`Record`]: every change ever made, until
//! compaction removes what no read can see. [`Meta`] holds the applied Raft index and the current
//! and compacted revisions; beside them, each member's published [`MemberAttributes`], by member
//! id. A [`WriteBatch`] commits records, attributes and meta atomically, which is what lets a
//! restart replay the Raft log from exactly `applied_index + 1`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Buf, BufMut, Bytes};

use crate::types::{
    AlarmMember, AlarmType, Lease, LeaseId, MemberAttributes, Revision, RevisionId,
};

/// A backend failure. The node must stop: the store cannot know what was written.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum BackendError {
    /// The storage engine failed; its own error, shared so the error stays cloneable.
    Engine(Arc<dyn std::error::Error + Send + Sync>),
    /// Bytes read back do not decode: a bad record, meta or revision key, or a history out of
    /// revision order.
    Corrupt(&'static str),
    /// The key index references a record the backend does not hold.
    MissingRecord(RevisionId),
}

impl BackendError {
    /// Wraps a storage engine's error.
    pub fn engine(e: impl std::error::Error + Send + Sync + 'static) -> BackendError {
        BackendError::Engine(Arc::new(e))
    }
}

impl PartialEq for BackendError {
    /// Engine errors are equal only when they are the same error (one failure, cloned): engine
    /// errors have no equality of their own.
    fn eq(&self, other: &BackendError) -> bool {
        match (self, other) {
            (BackendError::Engine(a), BackendError::Engine(b)) => Arc::ptr_eq(a, b),
            (BackendError::Corrupt(a), BackendError::Corrupt(b)) => a == b,
            (BackendError::MissingRecord(a), BackendError::MissingRecord(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for BackendError {}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::Engine(e) => write!(f, "backend: {e}"),
            BackendError::Corrupt(what) => write!(f, "backend: corrupt data: {what}"),
            BackendError::MissingRecord(rev) => {
                write!(f, "backend: history record {}.{} missing", rev.main, rev.sub)
            }
        }
    }
}

/// `Display` includes the engine's error, so `source` does not repeat it; match
/// [`BackendError::Engine`] to reach (and downcast) it.
impl std::error::Error for BackendError {}

/// One change as stored: `tombstone u8 | create i64 | version i64 | lease i64 | key_len u32 | key |
/// value` (big endian).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub key: Bytes,
    pub value: Bytes,
    pub create: Revision,
    pub version: i64,
    pub lease: LeaseId,
    pub tombstone: bool,
}

impl Record {
    /// The length of [`Record::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        29 + self.key.len() + self.value.len()
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut out);
        out
    }

    /// Appends the encoding to `out`. Keys are far below 4 GiB (requests are limited to a few
    /// MiB), so the key length fits its `u32`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.put_u8(u8::from(self.tombstone));
        out.put_i64(self.create.0);
        out.put_i64(self.version);
        out.put_i64(self.lease.0);
        out.put_u32(self.key.len() as u32);
        out.put_slice(&self.key);
        out.put_slice(&self.value);
    }

    pub fn decode(mut raw: &[u8]) -> Result<Record, BackendError> {
        if raw.len() < 29 {
            return Err(BackendError::Corrupt("history record too short"));
        }
        let tombstone = match raw.get_u8() {
            0 => false,
            1 => true,
            _ => return Err(BackendError::Corrupt("history record with a bad tombstone flag")),
        };
        let create = Revision(raw.get_i64());
        let version = raw.get_i64();
        let lease = LeaseId(raw.get_i64());
        let key_len = raw.get_u32() as usize;
        if raw.len() < key_len {
            return Err(BackendError::Corrupt("history record key cut short"));
        }
        let key = Bytes::copy_from_slice(&raw[..key_len]);
        let value = Bytes::copy_from_slice(&raw[key_len..]);
        Ok(Record { key, value, create, version, lease, tombstone })
    }
}

impl MemberAttributes {
    /// `name_len u32 | name | url_count u32 | (url_len u32 | url)*` for the client URLs, then,
    /// when there are peer URLs or the member was removed, the same list of peer URLs and
    /// `removed u8` (big endian): the value a backend stores under the member's id. Values
    /// written before peer URLs were kept end after the client URLs and read as none.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.name.len() + 32 * self.client_urls.len());
        put_str(&mut out, &self.name);
        put_urls(&mut out, &self.client_urls);
        if !self.peer_urls.is_empty() || self.removed {
            put_urls(&mut out, &self.peer_urls);
            out.put_u8(u8::from(self.removed));
        }
        out
    }

    pub fn decode(mut raw: &[u8]) -> Result<MemberAttributes, BackendError> {
        let name = get_str(&mut raw)?;
        let client_urls = get_urls(&mut raw)?;
        let (mut peer_urls, mut removed) = (Vec::new(), false);
        if !raw.is_empty() {
            peer_urls = get_urls(&mut raw)?;
            removed = match raw {
                [0] => false,
                [1] => true,
                _ => return Err(BackendError::Corrupt("bytes after member attributes")),
            };
        }
        Ok(MemberAttributes { name, client_urls, peer_urls, removed })
    }
}

fn put_urls(out: &mut Vec<u8>, urls: &[String]) {
    out.put_u32(urls.len() as u32);
    for url in urls {
        put_str(out, url);
    }
}

fn get_urls(raw: &mut &[u8]) -> Result<Vec<String>, BackendError> {
    if raw.len() < 4 {
        return Err(BackendError::Corrupt("member attributes cut short"));
    }
    let count = raw.get_u32() as usize;
    // Each URL takes at least its length: a count beyond the bytes left is corrupt, and
    // must not size an allocation.
    if count > raw.len() / 4 {
        return Err(BackendError::Corrupt("member attributes cut short"));
    }
    (0..count).map(|_| get_str(raw)).collect()
}

/// Strings are far below 4 GiB (a request is limited to a few MiB), so the length fits.
fn put_str(out: &mut Vec<u8>, s: &str) {
    out.put_u32(s.len() as u32);
    out.put_slice(s.as_bytes());
}

fn get_str(raw: &mut &[u8]) -> Result<String, BackendError> {
    if raw.len() < 4 {
        return Err(BackendError::Corrupt("member attributes cut short"));
    }
    let n = raw.get_u32() as usize;
    if raw.len() < n {
        return Err(BackendError::Corrupt("member attributes cut short"));
    }
    let s = String::from_utf8(raw[..n].to_vec())
        .map_err(|_| BackendError::Corrupt("member attributes not UTF-8"))?;
    raw.advance(n);
    Ok(s)
}

/// The 12-byte big-endian storage key of a revision, so byte order is revision order.
pub fn revision_key(rev: RevisionId) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..8].copy_from_slice(&(rev.main.0 as u64).to_be_bytes());
    k[8..].copy_from_slice(&rev.sub.to_be_bytes());
    k
}

pub fn parse_revision_key(k: &[u8]) -> Result<RevisionId, BackendError> {
    let k: [u8; 12] = k.try_into().map_err(|_| BackendError::Corrupt("bad revision key"))?;
    let main = u64::from_be_bytes(k[..8].try_into().unwrap_or_default()) as i64;
    let sub = u32::from_be_bytes(k[8..].try_into().unwrap_or_default());
    Ok(RevisionId { main: Revision(main), sub })
}

/// What the store knows about itself, committed with the data it describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    /// The last Raft index applied to this store.
    pub applied_index: u64,
    pub current: Revision,
    /// Reads below this revision fail as compacted.
    pub compacted: Revision,
    /// History below this revision has been physically removed.
    pub compacted_physically: Revision,
}

impl Default for Meta {
    fn default() -> Meta {
        Meta {
            applied_index: 0,
            current: Revision::INITIAL,
            compacted: Revision::NEVER_COMPACTED,
            compacted_physically: Revision::NEVER_COMPACTED,
        }
    }
}

/// Changes committed together, atomically.
#[derive(Clone, Debug, Default)]
pub struct WriteBatch {
    pub puts: Vec<(RevisionId, Vec<u8>)>,
    pub deletes: Vec<RevisionId>,
    /// Members' attributes ([`MemberAttributes::encode`]) by member id, each replacing what was
    /// stored for that member; in order, so a later one for the same member wins.
    pub members: Vec<(u64, Vec<u8>)>,
    /// Leases ([`encode_lease`]) by id, each replacing what was stored, or `None` to delete
    /// it; in order, so a later change of the same lease wins.
    pub leases: Vec<(LeaseId, Option<Vec<u8>>)>,
    /// Every raised alarm ([`encode_alarms`]), replacing what was stored; `None`: unchanged.
    pub alarms: Option<Vec<u8>>,
    /// The whole auth store ([`crate::auth::AuthState::encode`]), replacing what was stored.
    pub auth: Option<Vec<u8>>,
    pub meta: Option<Meta>,
    /// The consensus snapshot the contents were installed from (its index, term and
    /// configuration, encoded by the caller: this crate does not read it), replacing what was
    /// stored; `None`: unchanged by a commit, none by a replace. Stored in the install's own
    /// atomic write, it lets the replica finish recording an install that a crash interrupted
    /// after the store took the image and before the log recorded it.
    pub installed_from: Option<Vec<u8>>,
}

/// The raised alarms as stored: `(member u64 | type u8)*` (big endian), in order.
pub fn encode_alarms(alarms: &BTreeSet<AlarmMember>) -> Vec<u8> {
    let mut out = Vec::with_capacity(alarms.len() * 9);
    for a in alarms {
        out.put_u64(a.member);
        out.put_u8(a.alarm as u8);
    }
    out
}

pub fn decode_alarms(mut raw: &[u8]) -> Result<BTreeSet<AlarmMember>, BackendError> {
    if !raw.len().is_multiple_of(9) {
        return Err(BackendError::Corrupt("alarms cut short"));
    }
    let mut out = BTreeSet::new();
    while !raw.is_empty() {
        let member = raw.get_u64();
        let alarm = AlarmType::from_i32(i32::from(raw.get_u8()))
            .filter(|a| *a != AlarmType::None)
            .ok_or(BackendError::Corrupt("unknown alarm type"))?;
        out.insert(AlarmMember { member, alarm });
    }
    Ok(out)
}

/// A lease as stored: `ttl i64 | remaining_ttl i64 | grant_index u64` (big endian; the id is
/// the key). Records an older cairn wrote end before `grant_index`, read as 0.
pub fn encode_lease(l: &Lease) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    out.put_i64(l.ttl);
    out.put_i64(l.remaining_ttl);
    out.put_u64(l.grant_index);
    out
}

pub fn decode_lease(id: LeaseId, mut raw: &[u8]) -> Result<Lease, BackendError> {
    if raw.len() != 16 && raw.len() != 24 {
        return Err(BackendError::Corrupt("lease record of the wrong size"));
    }
    let (ttl, remaining_ttl) = (raw.get_i64(), raw.get_i64());
    let grant_index = if raw.is_empty() { 0 } else { raw.get_u64() };
    Ok(Lease { id, ttl, remaining_ttl, grant_index })
}

/// A consistent read view of the backend.
pub trait BackendView {
    fn get(&self, rev: RevisionId) -> Result<Option<Record>, BackendError>;
    /// The length of the record's [`Record::encode`], without decoding it where the backend
    /// stores it encoded.
    fn encoded_len(&self, rev: RevisionId) -> Result<Option<usize>, BackendError> {
        Ok(self.get(rev)?.map(|r| r.encoded_len()))
    }
    /// Visits records from `from` on, in revision order, until `visit` returns false.
    fn scan(
        &self,
        from: RevisionId,
        visit: &mut dyn FnMut(RevisionId, Record) -> bool,
    ) -> Result<(), BackendError>;
    fn meta(&self) -> Result<Meta, BackendError>;
    /// Every member's published attributes, by member id.
    fn members(&self) -> Result<BTreeMap<u64, MemberAttributes>, BackendError>;
    /// Every lease, by id.
    fn leases(&self) -> Result<BTreeMap<LeaseId, Lease>, BackendError>;
    /// Every raised alarm.
    fn alarms(&self) -> Result<BTreeSet<AlarmMember>, BackendError>;
    /// The encoded auth store, if one was ever stored.
    fn auth(&self) -> Result<Option<Vec<u8>>, BackendError>;
    /// [`WriteBatch::installed_from`] as last stored, if the contents came from an install.
    fn installed_from(&self) -> Result<Option<Vec<u8>>, BackendError>;
}

/// Durable storage of the history. One writer (the apply path) and many readers.
pub trait Backend: Send + Sync {
    type View<'a>: BackendView
    where
        Self: 'a;
    fn view(&self) -> Result<Self::View<'_>, BackendError>;
    fn commit(&self, batch: WriteBatch) -> Result<(), BackendError>;
    /// Replaces the whole history with `batch.puts`, every member's attributes with
    /// `batch.members`, every lease with `batch.leases`, the auth store with `batch.auth`
    /// (none: no store) and the install's origin with `batch.installed_from`, and sets
    /// `batch.alarms` and `batch.meta` (those that are given),
    /// atomically: a reader or a crash sees the old contents or the new, never a mix.
    /// `batch.deletes` has nothing left to delete and is ignored.
    fn replace(&self, batch: WriteBatch) -> Result<(), BackendError>;
    /// Begins a replacement of the whole contents that is written piece by piece, aside from the
    /// current contents (which go on serving reads and commits), and swapped in at the end as
    /// [`Backend::replace`] would: installing a snapshot image uses it, so that a large image is
    /// never held whole. By default the pieces are gathered in memory and given to `replace`.
    fn begin_replace(&self) -> Result<Box<dyn Replacement + '_>, BackendError> {
        Ok(Box::new(Gathered { backend: self, batch: WriteBatch::default() }))
    }
    /// Makes every commit so far durable. The WAL may be compacted only up to what this covers.
    fn sync(&self) -> Result<(), BackendError>;
    /// Approximate bytes used on disk.
    fn size_bytes(&self) -> u64;
    /// Of [`Backend::size_bytes`], the bytes that hold data rather than freed pages a later
    /// write may reuse (etcd's "size in use"); what defragmentation would leave. A backend
    /// that frees nothing uses all it holds.
    fn size_in_use_bytes(&self) -> u64 {
        self.size_bytes()
    }
    /// Returns the space of freed pages to the file system, with reads and commits going on
    /// meanwhile; afterwards the backend holds the same contents. A backend in memory holds no
    /// freed pages, so by default there is nothing to do.
    fn defragment(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

/// A replacement of a backend's whole contents, from [`Backend::begin_replace`]. Dropped before
/// [`Replacement::swap`], it changes nothing.
pub trait Replacement {
    /// Adds a history record (its [`Record::encode`]); records come in increasing revision order.
    fn put(&mut self, rev: RevisionId, record: &[u8]) -> Result<(), BackendError>;
    /// Writes the rest, as [`Backend::replace`] takes it (`rest.puts` are added to the records),
    /// and makes the replacement durable where the backend writes aside; not yet visible.
    fn prepare(&mut self, rest: WriteBatch) -> Result<(), BackendError>;
    /// Makes the prepared replacement the backend's contents, atomically: a reader or a crash
    /// sees the old contents or the new. The caller syncs the backend afterwards.
    fn swap(self: Box<Self>) -> Result<(), BackendError>;
}

/// [`Backend::begin_replace`]'s default: everything in one batch for [`Backend::replace`].
struct Gathered<'a, B: ?Sized> {
    backend: &'a B,
    batch: WriteBatch,
}

impl<B: Backend + ?Sized> Replacement for Gathered<'_, B> {
    fn put(&mut self, rev: RevisionId, record: &[u8]) -> Result<(), BackendError> {
        self.batch.puts.push((rev, record.to_vec()));
        Ok(())
    }

    fn prepare(&mut self, mut rest: WriteBatch) -> Result<(), BackendError> {
        let mut puts = std::mem::take(&mut self.batch.puts);
        puts.append(&mut rest.puts);
        self.batch = WriteBatch { puts, ..rest };
        Ok(())
    }

    fn swap(self: Box<Self>) -> Result<(), BackendError> {
        self.backend.replace(self.batch)
    }
}

/// An in-memory backend, for tests and for an embedded engine that needs no durability.
#[derive(Debug, Default)]
pub struct MemBackend {
    state: Mutex<MemState>,
}

#[derive(Clone, Debug, Default)]
struct MemState {
    records: BTreeMap<RevisionId, Vec<u8>>,
    members: BTreeMap<u64, Vec<u8>>,
    leases: BTreeMap<LeaseId, Vec<u8>>,
    alarms: Vec<u8>,
    auth: Option<Vec<u8>>,
    meta: Meta,
    installed_from: Option<Vec<u8>>,
}

/// A snapshot of a [`MemBackend`] (a copy: fine for tests).
#[derive(Debug)]
pub struct MemView(MemState);

impl MemBackend {
    fn lock(&self) -> MutexGuard<'_, MemState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Backend for MemBackend {
    type View<'a> = MemView;

    fn view(&self) -> Result<MemView, BackendError> {
        Ok(MemView(self.lock().clone()))
    }

    fn commit(&self, batch: WriteBatch) -> Result<(), BackendError> {
        let mut s = self.lock();
        for (rev, rec) in batch.puts {
            s.records.insert(rev, rec);
        }
        for rev in batch.deletes {
            s.records.remove(&rev);
        }
        s.members.extend(batch.members);
        apply_leases(&mut s.leases, batch.leases);
        if let Some(alarms) = batch.alarms {
            s.alarms = alarms;
        }
        if batch.auth.is_some() {
            s.auth = batch.auth;
        }
        if let Some(meta) = batch.meta {
            s.meta = meta;
        }
        if batch.installed_from.is_some() {
            s.installed_from = batch.installed_from;
        }
        Ok(())
    }

    fn replace(&self, batch: WriteBatch) -> Result<(), BackendError> {
        let mut s = self.lock();
        s.records = batch.puts.into_iter().collect();
        s.members = batch.members.into_iter().collect();
        s.leases = BTreeMap::new();
        apply_leases(&mut s.leases, batch.leases);
        if let Some(alarms) = batch.alarms {
            s.alarms = alarms;
        }
        s.auth = batch.auth;
        if let Some(meta) = batch.meta {
            s.meta = meta;
        }
        s.installed_from = batch.installed_from;
        Ok(())
    }

    fn sync(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.lock().records.values().map(|v| v.len() as u64 + 12).sum()
    }
}

impl BackendView for MemView {
    fn get(&self, rev: RevisionId) -> Result<Option<Record>, BackendError> {
        self.0.records.get(&rev).map(|r| Record::decode(r)).transpose()
    }

    fn scan(
        &self,
        from: RevisionId,
        visit: &mut dyn FnMut(RevisionId, Record) -> bool,
    ) -> Result<(), BackendError> {
        for (rev, raw) in self.0.records.range(from..) {
            if !visit(*rev, Record::decode(raw)?) {
                break;
            }
        }
        Ok(())
    }

    fn meta(&self) -> Result<Meta, BackendError> {
        Ok(self.0.meta)
    }

    fn members(&self) -> Result<BTreeMap<u64, MemberAttributes>, BackendError> {
        decode_members(&self.0.members)
    }

    fn leases(&self) -> Result<BTreeMap<LeaseId, Lease>, BackendError> {
        self.0.leases.iter().map(|(id, raw)| Ok((*id, decode_lease(*id, raw)?))).collect()
    }

    fn alarms(&self) -> Result<BTreeSet<AlarmMember>, BackendError> {
        decode_alarms(&self.0.alarms)
    }
    fn auth(&self) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self.0.auth.clone())
    }

    fn installed_from(&self) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self.0.installed_from.clone())
    }
}

/// Applies a batch's lease changes to a map of encoded leases, for backends that keep one.
pub fn apply_leases(
    stored: &mut BTreeMap<LeaseId, Vec<u8>>,
    changes: Vec<(LeaseId, Option<Vec<u8>>)>,
) {
    for (id, change) in changes {
        match change {
            Some(raw) => stored.insert(id, raw),
            None => stored.remove(&id),
        };
    }
}

/// Decodes stored attributes, for backends that keep them encoded in a map.
pub fn decode_members(
    raw: &BTreeMap<u64, Vec<u8>>,
) -> Result<BTreeMap<u64, MemberAttributes>, BackendError> {
    raw.iter().map(|(id, a)| Ok((*id, MemberAttributes::decode(a)?))).collect()
}
