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
//!      8     4  format version, u32 (6; 5 had no lease grant indexes, 4 no alarm section, 3
//!               no auth section, 2 no lease section, 1 no member section)
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
//!                 id i64 | ttl i64 | remaining_ttl i64 | grant_index u64 (version 6)
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
//! section) as a new auth store, images before version 5 as saying nothing about alarms
//! (an installing member keeps its own), and leases of images before version 6 as granted at
//! index 0, as an older cairn's stored leases are read.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;

use bytes::{BufMut, Bytes};

use crate::auth::AuthState;
use crate::backend::{encode_alarms, BackendError, Record};
use crate::types::{AlarmMember, Lease, LeaseId, MemberAttributes, Revision, RevisionId};

mod read;

use read::{parse, Cursor, Input};

const MAGIC: [u8; 8] = *b"CAIRNKVI";
const VERSION: u32 = 6;
/// The version before leases carried their grant's index, still read.
const VERSION_NO_GRANT_INDEX: u32 = 5;
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

/// Why [`crate::Store::install`] failed. On `Corrupt` and `Unreadable` nothing changed; on
/// `Backend` the node must stop, as after any backend failure.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InstallError {
    Corrupt(ImageError),
    /// Reading a streamed image failed (the reader's error).
    Unreadable(String),
    Backend(BackendError),
}

impl From<ImageError> for InstallError {
    fn from(e: ImageError) -> InstallError {
        InstallError::Corrupt(e)
    }
}

impl fmt::Display for InstallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InstallError::Corrupt(e) => write!(f, "install: {e}"),
            InstallError::Unreadable(e) => write!(f, "install: cannot read the image: {e}"),
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
        buf.put_u64(lease.grant_index);
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
        // The indexes the leases were granted at belong to the old log; the new one starts
        // below them, and a grant there must never be taken for one of them.
        for lease in self.leases.values_mut() {
            lease.grant_index = 0;
        }
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

    /// Takes the records out, leaving none.
    pub fn take_records(&mut self) -> Vec<(RevisionId, Record)> {
        std::mem::take(&mut self.records)
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
    read::version(&mut head)?;
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

/// Where a streamed image comes from ([`read_stream`]): a file, in a node (this crate does no IO
/// of its own); a slice, in tests.
pub trait ImageReader {
    /// Fills `buf` whole, or fails with the reader's reason.
    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), String>;
}

impl ImageReader for &[u8] {
    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), String> {
        if self.len() < buf.len() {
            return Err("the image ends early".into());
        }
        let (head, rest) = self.split_at(buf.len());
        buf.copy_from_slice(head);
        *self = rest;
        Ok(())
    }
}

/// What [`read_stream`] hands each record to: its revision, the record, and its encoding.
pub type VisitRecord<'a, E> = dyn FnMut(RevisionId, Record, &[u8]) -> Result<(), E> + 'a;

/// Checks an image's magic, version and checksum only: a damaged image is refused for its
/// checksum, as [`decode`] refuses it, before anything reads its records.
pub fn check_checksum(image: &[u8]) -> Result<(), ImageError> {
    read::checked_body(image).map(|_| ())
}

/// Reads an image of `len` bytes from `r` piece by piece, so that it is never held whole: each
/// record goes to `visit` as it is read, decoded and as the bytes of its `Record::encode`; the
/// rest comes back as an [`Image`] without records. Every check of [`decode`] applies, but the
/// checksum can only be compared at the end: `visit` sees the records of an image that may yet
/// be refused, so what it does with them must be undone on an error. A failing `visit` stops the
/// read with its error.
pub fn read_stream(
    r: impl ImageReader,
    len: u64,
    visit: &mut VisitRecord<'_, InstallError>,
) -> Result<Image, InstallError> {
    let (meta, members, leases, auth, alarms) = read::stream(r, len, visit)?;
    Ok(Image { meta, records: Vec::new(), members, leases, auth, alarms })
}
