//! Reading an image: from a slice ([`super::decode`] and the others) or streamed from a reader
//! ([`super::read_stream`]), with the same checks either way. Everything here is bounded by the
//! input: a length field larger than what is left is `Truncated`, never an allocation.

use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::{
    ImageError, ImageMeta, ImageReader, InstallError, VisitRecord, CHECKSUM_LEN, HEADER_LEN, MAGIC,
    VERSION, VERSION_NO_ALARMS, VERSION_NO_AUTH, VERSION_NO_GRANT_INDEX, VERSION_NO_LEASES,
};
use crate::auth::AuthState;
use crate::backend::{decode_alarms, BackendError, Record};
use crate::types::{AlarmMember, Lease, LeaseId, MemberAttributes, Revision, RevisionId};

/// Where an image's bytes come from.
pub(super) trait Input {
    /// The next `n` bytes.
    fn take(&mut self, n: usize) -> Result<&[u8], ImageError>;
    /// Whether the body (the image without its checksum) was read to its end.
    fn at_end(&self) -> bool;

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

    /// A length field, which must fit in what is left.
    fn len(&mut self) -> Result<usize, ImageError> {
        usize::try_from(self.u64()?).map_err(|_| ImageError::Truncated)
    }
}

/// Reads big-endian integers off the front of a slice, failing instead of panicking.
pub(super) struct Cursor<'a>(pub(super) &'a [u8]);

impl Input for Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], ImageError> {
        if self.0.len() < n {
            return Err(ImageError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn at_end(&self) -> bool {
        self.0.is_empty()
    }
}

/// An image read from a reader, piece by piece, checksummed as it goes. Holds one piece (the
/// largest record so far) at a time.
struct Stream<R> {
    r: R,
    /// Bytes of the body not yet read.
    left: u64,
    buf: Vec<u8>,
    crc: u32,
    /// The reader's error, behind the `Truncated` that parsing saw.
    failed: Option<String>,
}

impl<R: ImageReader> Input for Stream<R> {
    fn take(&mut self, n: usize) -> Result<&[u8], ImageError> {
        if n as u64 > self.left {
            return Err(ImageError::Truncated);
        }
        if self.buf.len() < n {
            self.buf.resize(n, 0);
        }
        if let Err(e) = self.r.read_exact(&mut self.buf[..n]) {
            self.failed = Some(e);
            return Err(ImageError::Truncated);
        }
        self.crc = crc32c::crc32c_append(self.crc, &self.buf[..n]);
        self.left -= n as u64;
        Ok(&self.buf[..n])
    }

    fn at_end(&self) -> bool {
        self.left == 0
    }
}

/// An image's header, members' attributes, leases, auth store and alarms.
pub(super) type Parsed = (
    ImageMeta,
    BTreeMap<u64, MemberAttributes>,
    BTreeMap<LeaseId, Lease>,
    AuthState,
    Option<BTreeSet<AlarmMember>>,
);

/// Checks the magic and returns the format version, if this build reads it.
pub(super) fn version(head: &mut impl Input) -> Result<u32, ImageError> {
    if head.array::<8>()? != MAGIC {
        return Err(ImageError::WrongMagic);
    }
    let version = head.u32()?;
    let known =
        [VERSION, VERSION_NO_GRANT_INDEX, VERSION_NO_ALARMS, VERSION_NO_AUTH, VERSION_NO_LEASES];
    if !known.contains(&version) {
        return Err(ImageError::UnknownVersion(version));
    }
    Ok(version)
}

/// Checks the magic, the version and the checksum; returns the version and the body (the image
/// without its checksum).
pub(super) fn checked_body(image: &[u8]) -> Result<(u32, &[u8]), ImageError> {
    let version = version(&mut Cursor(image))?;
    let Some(body_len) = image.len().checked_sub(CHECKSUM_LEN).filter(|n| *n >= HEADER_LEN) else {
        return Err(ImageError::Truncated);
    };
    let (body, stored) = image.split_at(body_len);
    let stored = Cursor(stored).u32()?;
    let computed = crc32c::crc32c(body);
    if stored != computed {
        return Err(ImageError::ChecksumMismatch { stored, computed });
    }
    Ok((version, body))
}

/// Verifies `image` (its checksum first) and hands each record to `visit`, in order.
pub(super) fn parse(
    image: &[u8],
    visit: &mut dyn FnMut(RevisionId, Record),
) -> Result<Parsed, ImageError> {
    let (version, body) = checked_body(image)?;
    let mut cur = Cursor(body);
    cur.take(MAGIC.len() + 4)?;
    parse_body(version, &mut cur, &mut |rev, record, _| {
        visit(rev, record);
        Ok::<(), ImageError>(())
    })
}

/// Reads an image of `len` bytes from `r`; see [`super::read_stream`].
pub(super) fn stream(
    r: impl ImageReader,
    len: u64,
    visit: &mut VisitRecord<'_, InstallError>,
) -> Result<Parsed, InstallError> {
    let Some(body_len) = len.checked_sub(CHECKSUM_LEN as u64).filter(|n| *n >= HEADER_LEN as u64)
    else {
        return Err(InstallError::Corrupt(ImageError::Truncated));
    };
    let mut s = Stream { r, left: body_len, buf: Vec::new(), crc: 0, failed: None };
    let unreadable = |s: &mut Stream<_>, e: InstallError| match s.failed.take() {
        Some(why) => InstallError::Unreadable(why),
        None => e,
    };
    let parsed = version(&mut s)
        .map_err(InstallError::Corrupt)
        .and_then(|version| parse_body(version, &mut s, visit))
        .map_err(|e| unreadable(&mut s, e))?;
    let mut stored = [0u8; CHECKSUM_LEN];
    s.r.read_exact(&mut stored).map_err(InstallError::Unreadable)?;
    let stored = u32::from_be_bytes(stored);
    if stored != s.crc {
        return Err(InstallError::Corrupt(ImageError::ChecksumMismatch {
            stored,
            computed: s.crc,
        }));
    }
    Ok(parsed)
}

/// Everything after the magic and version: the header's revisions, the records (each handed to
/// `visit` decoded and as its bytes) and the sections after them, up to the checksum.
fn parse_body<E: From<ImageError>>(
    version: u32,
    cur: &mut impl Input,
    visit: &mut VisitRecord<'_, E>,
) -> Result<Parsed, E> {
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
        let len = cur.len()?;
        let raw = cur.take(len)?;
        let record = Record::decode(raw).map_err(|e| ImageError::BadRecord {
            position,
            reason: match e {
                BackendError::Corrupt(why) => why,
                _ => "undecodable",
            },
        })?;
        if record.key.is_empty() {
            return Err(ImageError::BadRecord { position, reason: "empty key" }.into());
        }
        retained.check(rev, &record)?;
        visit(rev, record, raw)?;
    }
    let members = parse_members(cur)?;
    let leases =
        if version == VERSION_NO_LEASES { BTreeMap::new() } else { parse_leases(version, cur)? };
    let (auth, alarms) = parse_auth_and_alarms(version, cur)?;
    if !cur.at_end() {
        return Err(ImageError::TrailingBytes.into());
    }
    Ok((meta, members, leases, auth, alarms))
}

/// The auth and alarm sections, as `version` has them: a new auth store before version 4, no
/// word of alarms before version 5.
fn parse_auth_and_alarms(
    version: u32,
    cur: &mut impl Input,
) -> Result<(AuthState, Option<BTreeSet<AlarmMember>>), ImageError> {
    let auth = if version >= VERSION_NO_ALARMS {
        let len = cur.len()?;
        AuthState::decode(cur.take(len)?).map_err(|e| {
            ImageError::BadAuth(match e {
                BackendError::Corrupt(why) => why,
                _ => "undecodable",
            })
        })?
    } else {
        AuthState::default()
    };
    let alarms = if version >= VERSION_NO_GRANT_INDEX {
        let len = cur.len()?;
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

/// The lease section: a count, then each lease, in increasing id order (granted at index 0
/// before version 6).
fn parse_leases(
    version: u32,
    cur: &mut impl Input,
) -> Result<BTreeMap<LeaseId, Lease>, ImageError> {
    let count = cur.u64()?;
    let mut leases = BTreeMap::new();
    let mut last = None;
    for position in 0..count {
        let (id, ttl, remaining_ttl) = (LeaseId(cur.i64()?), cur.i64()?, cur.i64()?);
        let grant_index = if version > VERSION_NO_GRANT_INDEX { cur.u64()? } else { 0 };
        let lease = Lease { id, ttl, remaining_ttl, grant_index };
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
fn parse_members(cur: &mut impl Input) -> Result<BTreeMap<u64, MemberAttributes>, ImageError> {
    let count = cur.u64()?;
    let mut members = BTreeMap::new();
    let mut last = None;
    for position in 0..count {
        let id = cur.u64()?;
        let len = cur.len()?;
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
