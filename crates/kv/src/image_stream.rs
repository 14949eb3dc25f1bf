//! A snapshot image encoded piece by piece as a reader asks for it, from a consistent read view
//! of the store, without ever holding the whole image: the bytes equal [`crate::Store::image`]'s
//! for the same state.
//!
//! What it holds at once: the list of revisions to send (16 bytes each), the few records that
//! were not yet flushed to the backend when it was taken, the members' attributes and leases,
//! and at most one chunk plus one record of encoded bytes. The backend's read view keeps the
//! history as it was; writers go on beside it (LMDB readers do not block its writer, but pages
//! freed while the view is open are reused only after it closes).
//!
//! Its length is known before the first byte, as a stream's consumer may need it up front
//! (etcd's snapshot stream says how many bytes remain in every message): taking the stream reads
//! the length of every record once. A follower's snapshot does not need it (its end says how
//! long it was), so [`crate::Store::image_stream_unmeasured`] skips that pass, which would
//! otherwise read every record's length while the caller waits.
//!
//! A stream can start over ([`ImageStream::rewind`]) from the same read view: a transfer that
//! broke resumes at the receiver's offset by encoding again up to there, and sends only the rest.

use std::collections::{BTreeMap, HashMap};

use bytes::{BufMut, Bytes};

use crate::backend::{BackendError, BackendView, Record};
use crate::snapshot::{self, ImageMeta, CHECKSUM_LEN, HEADER_LEN};
use crate::types::{Lease, LeaseId, MemberAttributes, RevisionId};

/// A snapshot image, streamed. Take one with [`crate::Store::image_stream`]; read it with
/// [`ImageStream::next_chunk`] until that returns `None`.
#[derive(Debug)]
pub struct ImageStream<V> {
    view: V,
    /// The records of `revs` that were not yet in the backend when the stream was taken.
    overlay: HashMap<RevisionId, Record>,
    revs: Vec<RevisionId>,
    /// The next record of `revs` to encode.
    next_rev: usize,
    meta: ImageMeta,
    /// The member and lease sections, appended after the last record.
    tail: Vec<u8>,
    tail_done: bool,
    /// Encoded bytes not yet handed out.
    pending: Vec<u8>,
    /// crc32c of every byte encoded so far.
    crc: u32,
    /// The whole length; `None` for a stream taken unmeasured.
    len: Option<u64>,
    /// Bytes encoded so far.
    encoded: u64,
    finished: bool,
}

/// What a stream is made of, taken together under the store's lock.
pub(crate) struct StreamParts<V> {
    pub(crate) view: V,
    pub(crate) overlay: HashMap<RevisionId, Record>,
    pub(crate) revs: Vec<RevisionId>,
    pub(crate) meta: ImageMeta,
    pub(crate) members: BTreeMap<u64, MemberAttributes>,
    pub(crate) leases: BTreeMap<LeaseId, Lease>,
    pub(crate) auth: std::sync::Arc<crate::auth::AuthState>,
    pub(crate) alarms: std::collections::BTreeSet<crate::types::AlarmMember>,
}

impl<V: BackendView> ImageStream<V> {
    /// Measures the image and encodes its header.
    pub(crate) fn new(parts: StreamParts<V>) -> Result<ImageStream<V>, BackendError> {
        let mut stream = ImageStream::unmeasured(parts);
        let mut len = (HEADER_LEN + stream.tail.len() + CHECKSUM_LEN) as u64;
        for rev in &stream.revs {
            let encoded_len = match stream.overlay.get(rev) {
                Some(r) => r.encoded_len(),
                None => stream.view.encoded_len(*rev)?.ok_or(BackendError::MissingRecord(*rev))?,
            };
            len += snapshot::record_len(encoded_len) as u64;
        }
        stream.len = Some(len);
        Ok(stream)
    }

    /// Encodes the header, without measuring the image.
    pub(crate) fn unmeasured(parts: StreamParts<V>) -> ImageStream<V> {
        let StreamParts { view, overlay, revs, meta, members, leases, auth, alarms } = parts;
        let mut tail = Vec::new();
        let sections =
            snapshot::Tail { members: &members, leases: &leases, auth: &auth, alarms: &alarms };
        snapshot::put_tail(&mut tail, sections);
        let mut stream = ImageStream {
            view,
            overlay,
            revs,
            next_rev: 0,
            meta,
            tail,
            tail_done: false,
            pending: Vec::new(),
            crc: 0,
            len: None,
            encoded: 0,
            finished: false,
        };
        stream.rewind();
        stream
    }

    /// Starts over at the first byte, from the same read view: the bytes handed out next are
    /// the image's from its beginning again.
    pub fn rewind(&mut self) {
        self.pending.clear();
        snapshot::put_header(&mut self.pending, self.meta, self.revs.len() as u64);
        self.crc = crc32c::crc32c(&self.pending);
        self.encoded = self.pending.len() as u64;
        self.next_rev = 0;
        self.tail_done = false;
        self.finished = false;
    }

    /// The header of the image.
    pub fn meta(&self) -> ImageMeta {
        self.meta
    }

    /// The image's whole length in bytes; for a stream taken unmeasured, known only once
    /// every byte was handed out (0 until then).
    pub fn len(&self) -> u64 {
        self.len.unwrap_or(if self.finished { self.encoded } else { 0 })
    }

    /// Whether the image is empty: never, an image has at least a header and a checksum.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The next `max` bytes of the image (fewer only for the last piece), or `None` once every
    /// byte was handed out. `max` is at least 1.
    pub fn next_chunk(&mut self, max: usize) -> Result<Option<Bytes>, BackendError> {
        let max = max.max(1);
        while self.pending.len() < max && !self.finished {
            self.encode_more()?;
        }
        if self.pending.is_empty() {
            return Ok(None);
        }
        let rest = if self.pending.len() > max { self.pending.split_off(max) } else { Vec::new() };
        Ok(Some(Bytes::from(std::mem::replace(&mut self.pending, rest))))
    }

    /// Encodes the next record, or the sections after the last one, or the checksum.
    fn encode_more(&mut self) -> Result<(), BackendError> {
        let start = self.pending.len();
        if let Some(&rev) = self.revs.get(self.next_rev) {
            self.next_rev += 1;
            // Overlay records stay: a rewound stream encodes them again.
            match self.overlay.get(&rev) {
                Some(r) => snapshot::put_record(&mut self.pending, rev, r),
                None => {
                    let r = self.view.get(rev)?.ok_or(BackendError::MissingRecord(rev))?;
                    snapshot::put_record(&mut self.pending, rev, &r);
                }
            }
        } else if !self.tail_done {
            self.tail_done = true;
            self.pending.extend_from_slice(&self.tail);
        } else {
            self.finished = true;
            let total = self.encoded + CHECKSUM_LEN as u64;
            if self.len.is_some_and(|len| len != total) {
                // The view is fixed, so only a backend that changed under it gets here.
                return Err(BackendError::Corrupt("a record's length changed while streaming"));
            }
            self.pending.put_u32(self.crc);
            self.encoded = total;
            return Ok(());
        }
        let added = &self.pending[start..];
        self.crc = crc32c::crc32c_append(self.crc, added);
        self.encoded += added.len() as u64;
        Ok(())
    }
}
