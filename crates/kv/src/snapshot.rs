//! Snapshot images: the store's whole state at an applied Raft index, as bytes a follower installs
//! in place of the log entries it missed. Pure: no IO.
//!
//! An image holds the executed state: the revisions and every history record the key index still
//! references once compaction at `compacted` is complete, so it does not depend on how far index
//! or physical compaction got, and two stores with the same history produce the same bytes; then
//! every member's published attributes, which a member restored from an image must know as
//! well as one that applied the entries.
//!
//! Byte layout (integers big-endian; offsets in bytes):
//!
//! ```text
//! offset  size  field
//!      0     8  magic "CAIRNKVI"
//!      8     4  format version, u32 (5; 4 had no alarm section, 3 no auth section, 2 no lease
//!               section, 1 no member section)
//!     12     8  applied_index, u64: the last Raft index the state includes
//!     20     8  current, i64: the store's revision
//!     28     8  compacted, i64: reads below it fail as compacted (-1: never compacted)
//!     36     8  record count n, u64
//!     44        n records, in increasing revision order, each:
//!                 main i64 | sub u32 | len u64 | len bytes of `Record::encode`
//!            8  member count m, u64
//!               m members, in increasing id order, each:
//!                 id u64 | len u64 | len bytes of `MemberAttributes::encode`
//!            8  lease count l, u64 (version 3)
//!               l leases, in increasing id order, each:
//!                 id i64 | ttl i64 | remaining_ttl i64
//!            8  auth store length a, u64 (version 4)
//!               a bytes of `AuthState::encode`
//!            8  alarm section length r, u64 (version 5)
//!               r bytes of `backend::encode_alarms`: member u64 | type u8, in order
//!  end-4     4  crc32c (Castagnoli) of every byte before it, u32
//! ```
//!
//! [`decode`] never panics on arbitrary bytes. It checks the magic and version, then the checksum
//! over the whole image, then the header (`1 <= current`, `-1 <= compacted <= current`) and every
//! record: it must decode, its revision must lie in `1..=current` and follow the previous one,
//! its key must not be empty, and compaction at `compacted` must keep it (a record superseded at
//! or before `compacted`, or a deletion before it, has no place in an image). Every member's
//! attributes must decode, in increasing id order; so must every lease, with a non-zero id and
//! a positive TTL; the auth store and the alarms must decode. Nothing after them but the
//! checksum. Version 2 images (no leases) are read as holding none, version 3 ones (no auth
//! section) as a new auth store, and images before version 5 as saying nothing about alarms
//! (an installing member keeps its own).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;

use bytes::{BufMut, Bytes};

use crate::auth::AuthState;
use crate::backend::{decode_alarms, encode_alarms, BackendError, Record};
use crate::types::{AlarmMember, Lease, LeaseId, MemberAttributes, Revision, RevisionId};

const MAGIC: [u8; 8] = *b"CAIRNKVI";
const VERSION: u32 = 5;
/// The version before the alarm section, still read.
const VERSION_NO_ALARMS: u32 = 4;
/// The version before the auth section, still read.
const VERSION_NO_AUTH: u32 = 3;
/// The previous version, without leases, still read.
const VERSION_NO_LEASES: u32 = 2;
/// Bytes before the first record.
pub(crate) const HEADER_LEN: usize = 44;
pub(crate) const CHECKSUM_LEN: usize = 4;
/// Revision (12 bytes) and length (8) before each record's encoding.
const RECORD_PREFIX_LEN: usize = 20;

/// What an image says about the state it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageMeta {
    /// The last Raft index applied to the state.
    pub applied_index: u64,
    pub current: Revision,
    pub compacted: Revision,
}

/// Why bytes are not a usable image.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ImageError {
    /// The bytes end before the image does.
    Truncated,
    /// The bytes do not begin with the image magic: not an image.
    WrongMagic,
    /// An image format this build does not know.
    UnknownVersion(u32),
    /// The checksum over the image does not match: damaged in transit or at rest.
    ChecksumMismatch { stored: u32, computed: u32 },
    /// The revisions in the header contradict each other.
    BadHeader(&'static str),
    /// The record at this position (0-based) does not decode.
    BadRecord { position: u64, reason: &'static str },
    /// A record does not follow the one before it in revision order.
    OutOfOrder(RevisionId),
    /// A record's revision is not in `1..=current`.
    RevisionOutOfRange(RevisionId),
    /// Compaction at the image's compacted revision would remove this record (a deletion before
    /// the compaction point), or an earlier record of its key (both at or below it).
    NotRetained(RevisionId),
    /// The member at this position of the member section (0-based) does not decode, or does
    /// not follow the one before it in id order.
    BadMember { position: u64, reason: &'static str },
    /// The lease at this position (0-based) is not valid.
    BadLease { position: u64, reason: &'static str },
    /// The auth store does not decode.
    BadAuth(&'static str),
    /// The alarm section does not decode.
    BadAlarms(&'static str),
    /// Bytes between the last section and the checksum.
    TrailingBytes,
}

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("snapshot image: ")?;
        match self {
            ImageError::Truncated => f.write_str("truncated"),
            ImageError::WrongMagic => f.write_str("not an image (wrong magic)"),
            ImageError::UnknownVersion(v) => write!(f, "unknown format version {v}"),
            ImageError::ChecksumMismatch { stored, computed } => {
                write!(f, "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")
            }
            ImageError::BadHeader(why) => write!(f, "bad header: {why}"),
            ImageError::BadRecord { position, reason } => {
                write!(f, "record {position} does not decode: {reason}")
            }
            ImageError::OutOfOrder(r) => write!(f, "record {}.{} out of order", r.main, r.sub),
            ImageError::RevisionOutOfRange(r) => {
                write!(f, "record {}.{} beyond the image's revision", r.main, r.sub)
            }
            ImageError::NotRetained(r) => {
                write!(f, "record {}.{} contradicts the compaction point", r.main, r.sub)
            }
            ImageError::BadMember { position, reason } => {
                write!(f, "member {position}: {reason}")
            }
            ImageError::BadLease { position, reason } => {
                write!(f, "lease {position}: {reason}")
            }
            ImageError::BadAuth(why) => write!(f, "auth store: {why}"),
            ImageError::BadAlarms(why) => write!(f, "alarms: {why}"),
            ImageError::TrailingBytes => f.write_str("bytes after the last section"),
        }
    }
}

impl std::error::Error for ImageError {}

/// Why [`crate::Store::install`] failed. On `Corrupt` nothing changed; on `Backend` the node must
/// stop, as after any backend failure.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InstallError {
    Corrupt(ImageError),
    Backend(BackendError),
}

impl fmt::Display for InstallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InstallError::Corrupt(e) => write!(f, "install: {e}"),
            InstallError::Backend(e) => write!(f, "install: {e}"),
        }
    }
}

impl std::error::Error for InstallError {}

/// Builds an image record by record, so a large store is not held twice as records and bytes.
#[derive(Debug)]
pub struct Encoder {
    buf: Vec<u8>,
    count: u64,
    last: Option<RevisionId>,
}

impl Encoder {
    pub fn new(meta: ImageMeta) -> Encoder {
        let mut buf = Vec::with_capacity(HEADER_LEN + CHECKSUM_LEN);
        put_header(&mut buf, meta, 0); // The record count, set by `finish`.
        Encoder { buf, count: 0, last: None }
    }

    /// Appends a record. Records must come in increasing revision order: `decode` refuses any
    /// other.
    pub fn push(&mut self, rev: RevisionId, record: &Record) {
        debug_assert!(self.last.is_none_or(|l| l < rev), "image records out of order");
        self.last = Some(rev);
        self.count += 1;
        put_record(&mut self.buf, rev, record);
    }

    /// Appends every member's attributes, every lease, a new auth store, no alarms and the
    /// checksum.
    pub fn finish(
        self,
        members: &BTreeMap<u64, MemberAttributes>,
        leases: &BTreeMap<LeaseId, Lease>,
    ) -> Bytes {
        let tail = Tail { members, leases, auth: &AuthState::default(), alarms: &BTreeSet::new() };
        self.finish_with(tail)
    }

    /// Appends the sections after the records, and the checksum.
    pub fn finish_with(mut self, tail: Tail<'_>) -> Bytes {
        self.buf[HEADER_LEN - 8..HEADER_LEN].copy_from_slice(&self.count.to_be_bytes());
        put_tail(&mut self.buf, tail);
        let crc = crc32c::crc32c(&self.buf);
        self.buf.put_u32(crc);
        Bytes::from(self.buf)
    }
}

/// The image's header, for `count` records.
pub(crate) fn put_header(buf: &mut Vec<u8>, meta: ImageMeta, count: u64) {
    buf.put_slice(&MAGIC);
    buf.put_u32(VERSION);
    buf.put_u64(meta.applied_index);
    buf.put_i64(meta.current.0);
    buf.put_i64(meta.compacted.0);
    buf.put_u64(count);
}

/// The bytes [`put_record`] writes for a record whose [`Record::encode`] is `encoded_len` long.
pub(crate) const fn record_len(encoded_len: usize) -> usize {
    RECORD_PREFIX_LEN + encoded_len
}

/// One record of the record section.
pub(crate) fn put_record(buf: &mut Vec<u8>, rev: RevisionId, record: &Record) {
    buf.reserve(record_len(record.encoded_len()));
    buf.put_i64(rev.main.0);
    buf.put_u32(rev.sub);
    buf.put_u64(record.encoded_len() as u64);
    record.encode_into(buf);
}

/// What an image holds after its records.
#[derive(Clone, Copy, Debug)]
pub struct Tail<'a> {
    pub members: &'a BTreeMap<u64, MemberAttributes>,
    pub leases: &'a BTreeMap<LeaseId, Lease>,
    pub auth: &'a AuthState,
    /// The raised alarms: a member that installs the image raises exactly these, as one that
    /// applied the entries would have.
    pub alarms: &'a BTreeSet<AlarmMember>,
}

/// The member, lease, auth and alarm sections, which follow the records.
pub(crate) fn put_tail(buf: &mut Vec<u8>, tail: Tail<'_>) {
    let Tail { members, leases, auth, alarms } = tail;
    buf.put_u64(members.len() as u64);
    for (id, attributes) in members {
        let encoded = attributes.encode();
        buf.put_u64(*id);
        buf.put_u64(encoded.len() as u64);
        buf.put_slice(&encoded);
    }
    buf.put_u64(leases.len() as u64);
    for lease in leases.values() {
        buf.put_i64(lease.id.0);
        buf.put_i64(lease.ttl);
        buf.put_i64(lease.remaining_ttl);
    }
    let auth = auth.encode();
    buf.put_u64(auth.len() as u64);
    buf.put_slice(&auth);
    let alarms = encode_alarms(alarms);
    buf.put_u64(alarms.len() as u64);
    buf.put_slice(&alarms);
}

/// Encodes an image of `records` (in increasing revision order), `members` and `leases` at
/// `meta`.
pub fn encode(
    meta: ImageMeta,
    records: &[(RevisionId, Record)],
    members: &BTreeMap<u64, MemberAttributes>,
    leases: &BTreeMap<LeaseId, Lease>,
) -> Bytes {
    let mut enc = Encoder::new(meta);
    for (rev, record) in records {
        enc.push(*rev, record);
    }
    enc.finish(members, leases)
}

/// The image of an empty store at `applied_index`.
pub fn empty_image(applied_index: u64) -> Bytes {
    let meta = ImageMeta {
        applied_index,
        current: Revision::INITIAL,
        compacted: Revision::NEVER_COMPACTED,
    };
    Encoder::new(meta).finish(&BTreeMap::new(), &BTreeMap::new())
}

/// A decoded, verified image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    meta: ImageMeta,
    records: Vec<(RevisionId, Record)>,
    members: BTreeMap<u64, MemberAttributes>,
    leases: BTreeMap<LeaseId, Lease>,
    auth: AuthState,
    alarms: Option<BTreeSet<AlarmMember>>,
}

/// An image's parts: records, members' attributes, leases.
pub type ImageParts =
    (Vec<(RevisionId, Record)>, BTreeMap<u64, MemberAttributes>, BTreeMap<LeaseId, Lease>);

impl Image {
    pub fn meta(&self) -> ImageMeta {
        self.meta
    }

    /// The records, in increasing revision order.
    pub fn records(&self) -> &[(RevisionId, Record)] {
        &self.records
    }

    /// Every member's published attributes, by member id.
    pub fn members(&self) -> &BTreeMap<u64, MemberAttributes> {
        &self.members
    }

    /// Every lease, by id.
    pub fn leases(&self) -> &BTreeMap<LeaseId, Lease> {
        &self.leases
    }

    /// The image as a new cluster's starting state at `applied_index`: the same history,
    /// leases and alarms (as `etcdutl snapshot restore` keeps etcd's alarm bucket), without
    /// the old members' attributes (a restore's new members publish theirs).
    pub fn for_new_cluster(mut self, applied_index: u64) -> Image {
        self.meta.applied_index = applied_index;
        self.members.clear();
        self
    }

    /// The auth store.
    pub fn auth(&self) -> &AuthState {
        &self.auth
    }

    /// The raised alarms, or `None` for an image made before images carried them.
    pub fn alarms(&self) -> Option<&BTreeSet<AlarmMember>> {
        self.alarms.as_ref()
    }

    /// The records, the members' attributes and the leases.
    pub fn into_parts(self) -> ImageParts {
        (self.records, self.members, self.leases)
    }
}

/// Decodes and verifies a whole image.
pub fn decode(image: &[u8]) -> Result<Image, ImageError> {
    let mut records = Vec::new();
    let (meta, members, leases, auth, alarms) =
        parse(image, &mut |rev, record| records.push((rev, record)))?;
    Ok(Image { meta, records, members, leases, auth, alarms })
}

/// The header of an image, after verifying the whole image exactly as [`decode`] does (so an
/// image this accepts installs), without keeping its records.
pub fn decode_meta(image: &[u8]) -> Result<ImageMeta, ImageError> {
    parse(image, &mut |_, _| {}).map(|(meta, ..)| meta)
}

/// The applied index in an image's first bytes (at least 20), after checking its magic and
/// version: enough to tell which snapshot a file holds without reading it whole. Only
/// [`decode`] verifies the image.
pub fn peek_applied_index(prefix: &[u8]) -> Result<u64, ImageError> {
    let mut head = Cursor(prefix);
    if head.array::<8>()? != MAGIC {
        return Err(ImageError::WrongMagic);
    }
    let version = head.u32()?;
    if ![VERSION, VERSION_NO_AUTH, VERSION_NO_LEASES].contains(&version) {
        return Err(ImageError::UnknownVersion(version));
    }
    head.u64()
}

/// What `cairn snapshot status` shows of an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageSummary {
    pub meta: ImageMeta,
    /// Records (one per revision of a key) the image holds.
    pub records: u64,
    /// Distinct keys with a live (not deleted) latest record.
    pub live_keys: u64,
    /// The image's own checksum, crc32c over every byte before it.
    pub checksum: u32,
}

/// Verifies `image` exactly as [`decode`] does and summarises it, holding only its live keys'
/// names, not its records.
pub fn summarize(image: &[u8]) -> Result<ImageSummary, ImageError> {
    let mut records = 0u64;
    let mut live: HashSet<Bytes> = HashSet::new();
    let (meta, ..) = parse(image, &mut |_, record| {
        records += 1;
        if record.tombstone {
            live.remove(&record.key);
        } else {
            live.insert(record.key);
        }
    })?;
    let mut tail = Cursor(&image[image.len() - CHECKSUM_LEN..]);
    let checksum = tail.u32()?;
    Ok(ImageSummary { meta, records, live_keys: live.len() as u64, checksum })
}

/// Reads big-endian integers off the front of a slice, failing instead of panicking.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ImageError> {
        if self.0.len() < n {
            return Err(ImageError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ImageError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, ImageError> {
        self.array().map(u32::from_be_bytes)
    }

    fn u64(&mut self) -> Result<u64, ImageError> {
        self.array().map(u64::from_be_bytes)
    }

    fn i64(&mut self) -> Result<i64, ImageError> {
        self.array().map(i64::from_be_bytes)
    }
}

/// An image's header, members' attributes, leases, auth store and alarms.
type Parsed = (
    ImageMeta,
    BTreeMap<u64, MemberAttributes>,
    BTreeMap<LeaseId, Lease>,
    AuthState,
    Option<BTreeSet<AlarmMember>>,
);

/// Verifies `image` and hands each record to `visit`, in order; returns the header, the
/// members' attributes and the leases.
fn parse(image: &[u8], visit: &mut dyn FnMut(RevisionId, Record)) -> Result<Parsed, ImageError> {
    let mut head = Cursor(image);
    if head.array::<8>()? != MAGIC {
        return Err(ImageError::WrongMagic);
    }
    let version = head.u32()?;
    if ![VERSION, VERSION_NO_ALARMS, VERSION_NO_AUTH, VERSION_NO_LEASES].contains(&version) {
        return Err(ImageError::UnknownVersion(version));
    }
    let Some(body_len) = image.len().checked_sub(CHECKSUM_LEN).filter(|n| *n >= HEADER_LEN) else {
        return Err(ImageError::Truncated);
    };
    let (body, stored) = image.split_at(body_len);
    let stored = Cursor(stored).u32()?;
    let computed = crc32c::crc32c(body);
    if stored != computed {
        return Err(ImageError::ChecksumMismatch { stored, computed });
    }
    let mut cur = Cursor(body);
    cur.take(MAGIC.len() + 4)?;
    let meta = ImageMeta {
        applied_index: cur.u64()?,
        current: Revision(cur.i64()?),
        compacted: Revision(cur.i64()?),
    };
    check_header(&meta)?;
    let count = cur.u64()?;
    let mut retained = Retained::new(meta);
    for position in 0..count {
        let rev = RevisionId { main: Revision(cur.i64()?), sub: cur.u32()? };
        let len = usize::try_from(cur.u64()?).map_err(|_| ImageError::Truncated)?;
        let record = Record::decode(cur.take(len)?).map_err(|e| ImageError::BadRecord {
            position,
            reason: match e {
                BackendError::Corrupt(why) => why,
                _ => "undecodable",
            },
        })?;
        if record.key.is_empty() {
            return Err(ImageError::BadRecord { position, reason: "empty key" });
        }
        retained.check(rev, &record)?;
        visit(rev, record);
    }
    let members = parse_members(&mut cur)?;
    let leases =
        if version == VERSION_NO_LEASES { BTreeMap::new() } else { parse_leases(&mut cur)? };
    let (auth, alarms) = parse_auth_and_alarms(version, &mut cur)?;
    if !cur.0.is_empty() {
        return Err(ImageError::TrailingBytes);
    }
    Ok((meta, members, leases, auth, alarms))
}

/// The auth and alarm sections, as `version` has them: a new auth store before version 4, no
/// word of alarms before version 5.
fn parse_auth_and_alarms(
    version: u32,
    cur: &mut Cursor<'_>,
) -> Result<(AuthState, Option<BTreeSet<AlarmMember>>), ImageError> {
    let auth = if version >= VERSION_NO_ALARMS {
        let len = usize::try_from(cur.u64()?).map_err(|_| ImageError::Truncated)?;
        AuthState::decode(cur.take(len)?).map_err(|e| {
            ImageError::BadAuth(match e {
                BackendError::Corrupt(why) => why,
                _ => "undecodable",
            })
        })?
    } else {
        AuthState::default()
    };
    let alarms = if version == VERSION {
        let len = usize::try_from(cur.u64()?).map_err(|_| ImageError::Truncated)?;
        Some(decode_alarms(cur.take(len)?).map_err(|e| {
            ImageError::BadAlarms(match e {
                BackendError::Corrupt(why) => why,
                _ => "undecodable",
            })
        })?)
    } else {
        None
    };
    Ok((auth, alarms))
}

/// The lease section: a count, then each lease, in increasing id order.
fn parse_leases(cur: &mut Cursor<'_>) -> Result<BTreeMap<LeaseId, Lease>, ImageError> {
    let count = cur.u64()?;
    let mut leases = BTreeMap::new();
    let mut last = None;
    for position in 0..count {
        let lease = Lease { id: LeaseId(cur.i64()?), ttl: cur.i64()?, remaining_ttl: cur.i64()? };
        let bad = |reason| ImageError::BadLease { position, reason };
        if lease.id.0 == 0 || lease.ttl <= 0 || lease.remaining_ttl < 0 {
            return Err(bad("a lease id, TTL or remaining TTL out of range"));
        }
        if last.is_some_and(|l| lease.id <= l) {
            return Err(bad("lease ids out of order"));
        }
        last = Some(lease.id);
        leases.insert(lease.id, lease);
    }
    Ok(leases)
}

/// The member section: a count, then each member's id and attributes, in increasing id order.
fn parse_members(cur: &mut Cursor<'_>) -> Result<BTreeMap<u64, MemberAttributes>, ImageError> {
    let count = cur.u64()?;
    let mut members = BTreeMap::new();
    let mut last = None;
    for position in 0..count {
        let id = cur.u64()?;
        let len = usize::try_from(cur.u64()?).map_err(|_| ImageError::Truncated)?;
        let attributes =
            MemberAttributes::decode(cur.take(len)?).map_err(|e| ImageError::BadMember {
                position,
                reason: match e {
                    BackendError::Corrupt(why) => why,
                    _ => "undecodable",
                },
            })?;
        if last.is_some_and(|l| id <= l) {
            return Err(ImageError::BadMember { position, reason: "member ids out of order" });
        }
        last = Some(id);
        members.insert(id, attributes);
    }
    Ok(members)
}

fn check_header(meta: &ImageMeta) -> Result<(), ImageError> {
    if meta.current < Revision::INITIAL {
        return Err(ImageError::BadHeader("current revision below the initial one"));
    }
    if meta.compacted < Revision::NEVER_COMPACTED || meta.compacted > meta.current {
        return Err(ImageError::BadHeader("compacted revision outside -1..=current"));
    }
    Ok(())
}

/// Checks that records come in order, within the image's revisions, and that compaction at the
/// image's compacted revision keeps each (as [`crate::index::Index::compact`] decides).
struct Retained {
    meta: ImageMeta,
    last: Option<RevisionId>,
    /// Keys with a record at or below the compaction point: a second one supersedes the first.
    compacted_keys: HashSet<Bytes>,
}

impl Retained {
    fn new(meta: ImageMeta) -> Retained {
        Retained { meta, last: None, compacted_keys: HashSet::new() }
    }

    fn check(&mut self, rev: RevisionId, record: &Record) -> Result<(), ImageError> {
        if self.last.is_some_and(|l| rev <= l) {
            return Err(ImageError::OutOfOrder(rev));
        }
        self.last = Some(rev);
        if rev.main.0 < 1 || rev.main > self.meta.current {
            return Err(ImageError::RevisionOutOfRange(rev));
        }
        let at = self.meta.compacted;
        if rev.main <= at {
            let deleted_before = record.tombstone && rev.main < at;
            if deleted_before || !self.compacted_keys.insert(record.key.clone()) {
                return Err(ImageError::NotRetained(rev));
            }
        }
        Ok(())
    }
}
