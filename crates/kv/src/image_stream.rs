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
//! the length of every record once.

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
    revs: std::vec::IntoIter<RevisionId>,
    meta: ImageMeta,
    /// The member and lease sections, until they are appended after the last record.
    tail: Option<Vec<u8>>,
    /// Encoded bytes not yet handed out.
    pending: Vec<u8>,
    /// crc32c of every byte encoded so far.
    crc: u32,
    len: u64,
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
        let StreamParts { view, overlay, revs, meta, members, leases, auth, alarms } = parts;
        let mut tail = Vec::new();
        let sections =
            snapshot::Tail { members: &members, leases: &leases, auth: &auth, alarms: &alarms };
        snapshot::put_tail(&mut tail, sections);
        let mut len = (HEADER_LEN + tail.len() + CHECKSUM_LEN) as u64;
        for rev in &revs {
            let encoded_len = match overlay.get(rev) {
                Some(r) => r.encoded_len(),
                None => view.encoded_len(*rev)?.ok_or(BackendError::MissingRecord(*rev))?,
            };
            len += snapshot::record_len(encoded_len) as u64;
        }
        let mut pending = Vec::with_capacity(HEADER_LEN);
        snapshot::put_header(&mut pending, meta, revs.len() as u64);
        let crc = crc32c::crc32c(&pending);
        let encoded = pending.len() as u64;
        Ok(ImageStream {
            view,
            overlay,
            revs: revs.into_iter(),
            meta,
            tail: Some(tail),
            pending,
            crc,
            len,
            encoded,
            finished: false,
        })
    }

    /// The header of the image.
    pub fn meta(&self) -> ImageMeta {
        self.meta
    }

    /// The image's whole length in bytes.
    pub fn len(&self) -> u64 {
        self.len
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
        if let Some(rev) = self.revs.next() {
            let record = match self.overlay.remove(&rev) {
                Some(r) => r,
                None => self.view.get(rev)?.ok_or(BackendError::MissingRecord(rev))?,
            };
            snapshot::put_record(&mut self.pending, rev, &record);
        } else if let Some(tail) = self.tail.take() {
            self.pending.extend_from_slice(&tail);
        } else {
            self.finished = true;
            let total = self.encoded + CHECKSUM_LEN as u64;
            if total != self.len {
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
