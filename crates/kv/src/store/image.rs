//! Whole-store operations: the snapshot image of the executed state, installing one in place of
//! the whole state, and etcd's `HashKV`.
//!
//! Reading the whole state takes, under the read lock, the revisions to read, the records of
//! those still in the overlay, and a backend view; the records are then read without the lock.
//! That is as consistent as reading under the lock: the view is a snapshot that holds every
//! committed record the index referenced at that moment (records leave the overlay, and
//! compaction removes records, only after the index stopped needing them from there), and
//! writers are not held up for the length of an image.

use std::collections::HashMap;

use bytes::Bytes;

use super::{Inner, Store};
use crate::backend::{
    encode_lease, Backend, BackendError, BackendView, Meta, Record, Replacement, WriteBatch,
};
use crate::hash::{self, Hasher, KvHash};
use crate::image_stream::{ImageStream, StreamParts};
use crate::index::{Index, IndexEntry};
use crate::snapshot::{self, Encoder, ImageMeta, InstallError, Tail};
use crate::types::{Revision, RevisionId};
use crate::KvError;

/// Records to read, taken consistently under the read lock.
struct Capture<V> {
    view: V,
    /// The records of `revs` that were still in the overlay.
    overlay: HashMap<RevisionId, Record>,
    revs: Vec<RevisionId>,
}

impl<V: BackendView> Capture<V> {
    /// Visits the records in `revs` order.
    fn visit(mut self, mut visit: impl FnMut(RevisionId, &Record)) -> Result<(), BackendError> {
        for rev in std::mem::take(&mut self.revs) {
            let record = match self.overlay.remove(&rev) {
                Some(r) => r,
                None => self.view.get(rev)?.ok_or(BackendError::MissingRecord(rev))?,
            };
            visit(rev, &record);
        }
        Ok(())
    }
}

impl<B: Backend> Store<B> {
    /// Must be called under the read (or write) lock that `inner` comes from.
    fn capture(
        &self,
        inner: &Inner,
        revs: Vec<RevisionId>,
    ) -> Result<Capture<B::View<'_>>, BackendError> {
        let overlay = revs
            .iter()
            .filter_map(|r| inner.unflushed.get(r).map(|rec| (*r, rec.clone())))
            .collect();
        let view = self.backend.view()?;
        Ok(Capture { view, overlay, revs })
    }

    /// An image of the executed state (what reads see) at [`Store::executed_index`]: its current
    /// and compacted revisions, every record the index references once compaction is
    /// complete (so the image does not depend on how far compaction got), every member's
    /// published attributes and every lease.
    pub fn image(&self) -> Result<Bytes, BackendError> {
        let StreamParts { view, overlay, revs, meta, members, leases, auth, alarms } =
            self.parts()?;
        let mut encoder = Encoder::new(meta);
        Capture { view, overlay, revs }.visit(|rev, record| encoder.push(rev, record))?;
        let tail = Tail { members: &members, leases: &leases, auth: &auth, alarms: &alarms };
        Ok(encoder.finish_with(tail))
    }

    /// The same image as [`Store::image`], streamed: encoded piece by piece as the caller reads
    /// it, from a read view of the backend taken now, so the store never holds it whole and
    /// writers go on while it is read. The stream borrows the store; read it off the async
    /// runtime (each piece may read the backend).
    pub fn image_stream(&self) -> Result<ImageStream<B::View<'_>>, BackendError> {
        ImageStream::new(self.parts()?)
    }

    /// [`Store::image_stream`] without measuring the image first: taking it costs only the
    /// list of revisions and a read view, so a caller that must not wait (the replica, for a
    /// follower's snapshot) takes it at once; [`ImageStream::len`] is known at the end.
    pub fn image_stream_unmeasured(&self) -> Result<ImageStream<B::View<'_>>, BackendError> {
        Ok(ImageStream::unmeasured(self.parts()?))
    }

    /// What an image holds, taken together under the lock: its header, the records it keeps
    /// (read from the overlay or a view opened under the lock), members, leases and auth.
    fn parts(&self) -> Result<StreamParts<B::View<'_>>, BackendError> {
        let inner = self.read();
        let meta = ImageMeta {
            applied_index: inner.exec_applied,
            current: inner.exec_current,
            compacted: inner.exec_compacted,
        };
        let revs = inner.index.retained(inner.exec_compacted);
        let Capture { view, overlay, revs } = self.capture(&inner, revs)?;
        Ok(StreamParts {
            view,
            overlay,
            revs,
            meta,
            members: inner.members.clone(),
            leases: inner.leases.all().clone(),
            auth: inner.auth.clone(),
            alarms: inner.alarms.clone(),
        })
    }

    /// Replaces the whole state with `image`, durably, and returns its header. The image is
    /// verified whole before it replaces anything: if it is refused, nothing changes. Executions
    /// not yet committed are discarded (the image replaces what they built on), and so is any
    /// compaction in progress.
    pub fn install(&self, image: &[u8]) -> Result<ImageMeta, InstallError> {
        snapshot::check_checksum(image)?;
        self.install_from(image, image.len() as u64)
    }

    /// [`Store::install`] of an image of `len` bytes read from `r`, piece by piece: the image is
    /// never held whole (a follower installs a snapshot from the file it was received into). Its
    /// records go to the backend's replacement as they are read, aside from the state readers
    /// see, which the replacement takes the place of only once the whole image is verified.
    pub fn install_from(
        &self,
        r: impl snapshot::ImageReader,
        len: u64,
    ) -> Result<ImageMeta, InstallError> {
        self.install_recorded(r, len, None)
    }

    /// [`Store::install_from`], storing `origin` (what the image is a snapshot of, in the
    /// caller's encoding) in the same atomic write as the image: a store that holds the image
    /// says where it came from ([`Store::installed_from`]) even if the caller's own record of
    /// the install never happened.
    pub fn install_recorded(
        &self,
        r: impl snapshot::ImageReader,
        len: u64,
        origin: Option<Vec<u8>>,
    ) -> Result<ImageMeta, InstallError> {
        let mut replacement = self.backend.begin_replace().map_err(InstallError::Backend)?;
        let mut index = Index::default();
        let image = snapshot::read_stream(r, len, &mut |rev, record, raw| {
            replacement.put(rev, raw).map_err(InstallError::Backend)?;
            index.push(record.key.clone(), IndexEntry::of(rev, &record));
            Ok(())
        })?;
        self.swap_in(replacement, index, image, origin)
    }

    /// The origin stored by the last [`Store::install_recorded`], if the contents came from one
    /// (any later install without an origin clears it).
    pub fn installed_from(&self) -> Result<Option<Vec<u8>>, BackendError> {
        self.backend.view()?.installed_from()
    }

    /// [`Store::install`] of an image already decoded (and so verified).
    pub fn install_image(&self, mut image: snapshot::Image) -> Result<ImageMeta, InstallError> {
        let mut replacement = self.backend.begin_replace().map_err(InstallError::Backend)?;
        let mut index = Index::default();
        for (rev, record) in image.take_records() {
            replacement.put(rev, &record.encode()).map_err(InstallError::Backend)?;
            index.push(record.key.clone(), IndexEntry::of(rev, &record));
        }
        self.swap_in(replacement, index, image, None)
    }

    /// Completes an install: the image's other sections go to the replacement, which is then
    /// swapped in together with the index built from its records.
    fn swap_in(
        &self,
        mut replacement: Box<dyn Replacement + '_>,
        index: Index,
        image: snapshot::Image,
        installed_from: Option<Vec<u8>>,
    ) -> Result<ImageMeta, InstallError> {
        let header = image.meta();
        let meta = Meta {
            applied_index: header.applied_index,
            current: header.current,
            compacted: header.compacted,
            // The image holds only what compaction keeps.
            compacted_physically: header.compacted,
        };
        let auth = image.auth().clone();
        // An image made before images carried alarms says nothing of them: keep this member's.
        // (Installs run on the apply path, as every change of alarms does: none changes now.)
        let alarms = image.alarms().cloned().unwrap_or_else(|| self.read().alarms.clone());
        let (_, members, leases) = image.into_parts();
        let rest = WriteBatch {
            meta: Some(meta),
            auth: Some(auth.encode()),
            alarms: Some(crate::backend::encode_alarms(&alarms)),
            members: members.iter().map(|(id, a)| (*id, a.encode())).collect(),
            leases: leases.values().map(|l| (l.id, Some(encode_lease(l)))).collect(),
            installed_from,
            ..WriteBatch::default()
        };
        replacement.prepare(rest).map_err(InstallError::Backend)?;
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        {
            // Readers must not see the new history with the old index, or the reverse.
            let mut inner = self.write();
            let epoch = inner.epoch + 1;
            // Before the swap: a read that fills values without the lock checks it after.
            self.installs.store(epoch, std::sync::atomic::Ordering::SeqCst);
            if let Err(e) = replacement.swap() {
                self.installs.store(inner.epoch, std::sync::atomic::Ordering::SeqCst);
                return Err(InstallError::Backend(e));
            }
            let enabled = auth.enabled;
            let mut installed = Inner::new(index, members, leases, alarms, auth, meta, epoch);
            self.auth_enabled.store(enabled, std::sync::atomic::Ordering::Release);
            // The revisions between the old state and the image have no events here: watchers
            // read them from the image's history (or are canceled if it is compacted).
            installed.ring = crate::watch::EventRing::new(inner.ring.max_bytes());
            debug_assert!(installed.to_remove.is_empty(), "decode admits only kept records");
            *inner = installed;
        }
        // Durable before the caller records the install in its log. The state is already
        // visible, as a commit's is before its sync; a failure here stops the node.
        self.backend.sync().map_err(InstallError::Backend)?;
        Ok(header)
    }

    /// etcd's `HashKV` at `rev` (0: the current revision) over the executed state; see
    /// [`crate::hash`] for the definition and its one difference from etcd.
    pub fn hash_kv(&self, rev: Revision) -> Result<KvHash, KvError> {
        let (hashed, compacted, capture) = {
            let inner = self.read();
            let (current, compacted) = (inner.exec_current, inner.exec_compacted);
            if rev.0 > 0 && rev < compacted {
                return Err(KvError::Compacted);
            }
            if rev.0 > 0 && rev > current {
                return Err(KvError::FutureRev);
            }
            let hashed = if rev.0 == 0 { current } else { rev };
            let revs = hash::hashed_revisions(&inner.index, hashed, compacted);
            (hashed, compacted, self.capture(&inner, revs)?)
        };
        let mut hasher = Hasher::new();
        capture.visit(|rev, record| hasher.write(rev, record))?;
        Ok(KvHash { hash: hasher.finish(), revision: hashed, compact_revision: compacted })
    }

    /// cairn's `Maintenance.Hash`: a CRC-32C of every record the backend holds, as etcd's is
    /// of its whole backend. In order: each history record (its 12-byte revision key, then
    /// its encoding), each member's attributes (id, then encoding), each lease (id, then
    /// encoding) and the raised alarms; the meta record (applied index, revisions) is left out,
    /// as etcd leaves out its consistent index, since members commit at different moments.
    /// Returns the hash and the revision the backend holds.
    pub fn hash(&self) -> Result<(u32, Revision), BackendError> {
        let view = self.backend.view()?;
        let mut crc = 0u32;
        let mut buf = Vec::new();
        view.scan(RevisionId::default(), &mut |rev, record| {
            buf.clear();
            buf.extend_from_slice(&crate::backend::revision_key(rev));
            record.encode_into(&mut buf);
            crc = crc32c::crc32c_append(crc, &buf);
            true
        })?;
        for (id, a) in view.members()? {
            crc = crc32c::crc32c_append(crc, &id.to_be_bytes());
            crc = crc32c::crc32c_append(crc, &a.encode());
        }
        for (id, lease) in view.leases()? {
            crc = crc32c::crc32c_append(crc, &id.0.to_be_bytes());
            crc = crc32c::crc32c_append(crc, &encode_lease(&lease));
        }
        let alarms = crate::backend::encode_alarms(&view.alarms()?);
        crc = crc32c::crc32c_append(crc, &alarms);
        Ok((crc, view.meta()?.current))
    }

    /// Returns the backend's free space to the file system ([`Backend::defragment`]). Reads,
    /// executions and commits go on meanwhile.
    pub fn defragment(&self) -> Result<(), BackendError> {
        self.backend.defragment()
    }
}
