//! The snapshot file `Maintenance.Snapshot` streams and `cairn snapshot restore` reads: the
//! store's image (`cairn_kv::snapshot`) in a frame that etcd's tools accept.
//!
//! etcd's snapshot is its bbolt database file followed by the SHA-256 of that file, and
//! `etcdctl snapshot save` refuses a download whose length is not a multiple of 512 plus the 32
//! bytes of the digest. cairn's store is not bbolt, so its file carries cairn's own image, framed
//! to the same rule:
//!
//! ```text
//! offset  size  field (integers big-endian)
//!      0     8  magic "CAIRNSNP"
//!      8     4  file format version, u32 (1)
//!     12     4  zero (reserved)
//!     16     8  image length n, u64
//!     24     n  the image (see `cairn_kv::snapshot`), with its own crc32c
//!   24+n        zeros, up to the next multiple of 512
//! end-32    32  SHA-256 of every byte before it
//! ```
//!
//! The stream is made as the client reads it (see [`cairn_kv::ImageStream`]), so the server
//! never holds the file whole.

use std::fmt;

use bytes::{BufMut, Bytes};
use cairn_kv::backend::{BackendError, BackendView};
use cairn_kv::ImageStream;
use sha2::{Digest, Sha256};

const MAGIC: [u8; 8] = *b"CAIRNSNP";
const VERSION: u32 = 1;
const HEADER_LEN: usize = 24;
/// etcdctl checks that the bytes before the digest fill whole 512-byte sectors.
const SECTOR: u64 = 512;
/// The length of the SHA-256 digest that ends the file.
pub const DIGEST_LEN: usize = 32;

/// The snapshot file, streamed: every byte before the digest from
/// [`BackupStream::next_chunk`], then the digest from [`BackupStream::digest`].
#[derive(Debug)]
pub struct BackupStream<V> {
    image: ImageStream<V>,
    header: Option<[u8; HEADER_LEN]>,
    image_done: bool,
    padding: u64,
    len: u64,
    sha: Sha256,
}

/// The length of a file's bytes before the digest, for an image of `image_len` bytes.
fn framed_len(image_len: u64) -> u64 {
    (HEADER_LEN as u64 + image_len).div_ceil(SECTOR) * SECTOR
}

impl<V: BackendView> BackupStream<V> {
    /// Frames `image`.
    pub fn new(image: ImageStream<V>) -> BackupStream<V> {
        let mut header = [0u8; HEADER_LEN];
        let mut out = &mut header[..];
        out.put_slice(&MAGIC);
        out.put_u32(VERSION);
        out.put_u32(0);
        out.put_u64(image.len());
        let len = framed_len(image.len());
        let padding = len - HEADER_LEN as u64 - image.len();
        BackupStream {
            image,
            header: Some(header),
            image_done: false,
            padding,
            len,
            sha: Sha256::new(),
        }
    }

    /// The bytes [`BackupStream::next_chunk`] hands out in all (the digest not included).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Never empty: a file has at least a header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The store's revision the file holds.
    pub fn revision(&self) -> cairn_kv::Revision {
        self.image.meta().current
    }

    /// The next `max` bytes of the file before its digest (fewer only for the last piece), or
    /// `None` after the last.
    pub fn next_chunk(&mut self, max: usize) -> Result<Option<Bytes>, BackendError> {
        let max = max.max(1);
        let mut out = Vec::with_capacity(max);
        if let Some(header) = self.header.take() {
            out.extend_from_slice(&header);
        }
        while out.len() < max && !self.image_done {
            match self.image.next_chunk(max - out.len())? {
                Some(piece) => out.extend_from_slice(&piece),
                None => self.image_done = true,
            }
        }
        let zeros = self.padding.min((max.saturating_sub(out.len())) as u64);
        out.resize(out.len() + zeros as usize, 0);
        self.padding -= zeros;
        if out.is_empty() {
            return Ok(None);
        }
        self.sha.update(&out);
        Ok(Some(Bytes::from(out)))
    }

    /// The SHA-256 of every byte handed out: the file's last 32 bytes.
    pub fn digest(self) -> [u8; DIGEST_LEN] {
        self.sha.finalize().into()
    }
}

/// Why a file is not a snapshot cairn can restore. The messages are etcdutl's where it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileError {
    /// The file does not begin as a cairn snapshot file does.
    NotCairn,
    /// A file format version this build does not know.
    UnknownVersion(u32),
    /// The file ends before its header says it does.
    Truncated {
        /// The file's length.
        len: u64,
        /// The length its header gives it.
        expected: u64,
    },
    /// Bytes after where the header says the file ends.
    TrailingBytes {
        /// The file's length.
        len: u64,
        /// The length its header gives it.
        expected: u64,
    },
    /// The file has no digest (`--skip-hash-check` accepts that).
    MissingHash,
    /// The digest does not match the file.
    HashMismatch {
        /// The digest the file ends with, in hex.
        stored: String,
        /// The digest of the file's bytes, in hex.
        computed: String,
    },
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileError::NotCairn => f.write_str(
                "not a cairn snapshot file (etcd's bbolt snapshots cannot be restored into cairn)",
            ),
            FileError::UnknownVersion(v) => write!(f, "unknown snapshot file version {v}"),
            FileError::Truncated { len, expected } => {
                write!(f, "snapshot file truncated: {len} bytes, expected {expected}")
            }
            FileError::TrailingBytes { len, expected } => {
                write!(f, "snapshot file has {len} bytes, expected {expected}")
            }
            FileError::MissingHash => {
                f.write_str("snapshot missing hash but --skip-hash-check=false")
            }
            FileError::HashMismatch { stored, computed } => {
                write!(f, "expected sha256 {stored}, got {computed}")
            }
        }
    }
}

impl std::error::Error for FileError {}

/// A snapshot file's parts, once its frame (and digest, unless skipped) checked out.
#[derive(Clone, Copy, Debug)]
pub struct SnapshotFile<'a> {
    /// The image the file carries (its own checksum not yet verified).
    pub image: &'a [u8],
    /// The file's SHA-256 as stored, if it has one.
    pub digest: Option<[u8; DIGEST_LEN]>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks a snapshot file's frame and, unless `skip_hash_check`, its digest. A file without
/// its digest (the bytes before it alone) is accepted only with `skip_hash_check`, as etcdutl
/// accepts a database copied out of a data directory.
pub fn open_file(file: &[u8], skip_hash_check: bool) -> Result<SnapshotFile<'_>, FileError> {
    if file.len() < HEADER_LEN || file[..8] != MAGIC {
        return Err(FileError::NotCairn);
    }
    let word = |at: usize| u32::from_be_bytes(file[at..at + 4].try_into().unwrap_or_default());
    if word(8) != VERSION {
        return Err(FileError::UnknownVersion(word(8)));
    }
    let image_len = u64::from_be_bytes(file[16..24].try_into().unwrap_or_default());
    let len = file.len() as u64;
    let framed = match image_len.checked_add(HEADER_LEN as u64) {
        Some(f) if f <= len => f,
        _ => {
            let expected = image_len.saturating_add(HEADER_LEN as u64);
            return Err(FileError::Truncated { len, expected });
        }
    };
    let body = framed_len(image_len);
    let with_hash = body + DIGEST_LEN as u64;
    if len < body || (len > body && len < with_hash) {
        return Err(FileError::Truncated { len, expected: with_hash });
    }
    if len > with_hash {
        return Err(FileError::TrailingBytes { len, expected: with_hash });
    }
    let image = &file[HEADER_LEN..framed as usize];
    if len == body {
        if !skip_hash_check {
            return Err(FileError::MissingHash);
        }
        return Ok(SnapshotFile { image, digest: None });
    }
    let (data, stored) = file.split_at(body as usize);
    let mut digest = [0u8; DIGEST_LEN];
    digest.copy_from_slice(stored);
    if !skip_hash_check {
        let computed: [u8; DIGEST_LEN] = Sha256::digest(data).into();
        if computed != digest {
            return Err(FileError::HashMismatch { stored: hex(&digest), computed: hex(&computed) });
        }
    }
    Ok(SnapshotFile { image, digest: Some(digest) })
}
