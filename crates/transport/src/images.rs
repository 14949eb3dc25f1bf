//! The images that travel with snapshot messages, kept out of the messages themselves.
//!
//! The consensus core only ever sees a snapshot message whose data is small: on the sending
//! side a handle to an [`ImageSource`] registered in [`OutgoingImages`], which the transport
//! reads chunk by chunk as it streams; on the receiving side a handle to the file in the
//! snapshot directory that the chunks were written to ([`received_image`]), which the member
//! installs. Neither side holds the image whole in memory. A message whose data is not a
//! handle carries its image inline (an embedder's or a test's) and is streamed the same way.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bytes::Bytes;

/// An image to send, read piece by piece. Its calls may block (they may read a database): the
/// transport makes them on a thread that may block.
pub trait ImageSource: Send + 'static {
    /// The next at most `max` bytes (exactly `max` unless at the end), or `None` once every
    /// byte was handed out.
    fn next_chunk(&mut self, max: usize) -> Result<Option<Bytes>, String>;
    /// Starts over at the first byte of the same image.
    fn rewind(&mut self) -> Result<(), String>;
}

/// An image held in memory, for a message that carries its image inline.
pub(crate) struct InlineImage {
    data: Bytes,
    pos: usize,
}

impl InlineImage {
    pub(crate) fn new(data: Bytes) -> InlineImage {
        InlineImage { data, pos: 0 }
    }
}

impl ImageSource for InlineImage {
    fn next_chunk(&mut self, max: usize) -> Result<Option<Bytes>, String> {
        if self.pos >= self.data.len() {
            return Ok(None);
        }
        let end = self.data.len().min(self.pos + max.max(1));
        let chunk = self.data.slice(self.pos..end);
        self.pos = end;
        Ok(Some(chunk))
    }

    fn rewind(&mut self) -> Result<(), String> {
        self.pos = 0;
        Ok(())
    }
}

const SOURCE_MAGIC: &[u8; 8] = b"CAIRNIS1";
const FILE_MAGIC: &[u8; 8] = b"CAIRNIF1";

/// Images registered for sending, each under an id its message's data names. The transport
/// takes each one out when it sends the message; the id also names the image on the wire, so
/// a receiver can tell a resumed transfer of the same image from another image.
pub struct OutgoingImages {
    /// Ids of one process never repeat, and differ from another process's (a restarted
    /// leader's) but by chance: a receiver must not resume an image with another's bytes.
    next: AtomicU64,
    sources: Mutex<HashMap<u64, Box<dyn ImageSource>>>,
}

impl std::fmt::Debug for OutgoingImages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutgoingImages").finish_non_exhaustive()
    }
}

impl Default for OutgoingImages {
    fn default() -> OutgoingImages {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let start = now ^ (u64::from(std::process::id()) << 32);
        OutgoingImages { next: AtomicU64::new(start), sources: Mutex::default() }
    }
}

impl OutgoingImages {
    /// Registers `source`; returns the data to put in its snapshot message.
    pub fn register(&self, source: Box<dyn ImageSource>) -> Bytes {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.sources.lock().unwrap_or_else(|e| e.into_inner()).insert(id, source);
        let mut handle = Vec::with_capacity(16);
        handle.extend_from_slice(SOURCE_MAGIC);
        handle.extend_from_slice(&id.to_le_bytes());
        Bytes::from(handle)
    }

    /// The image a message's data names, taken out of the registry, with its id; `None` for
    /// data that is no handle, or names an image already taken.
    pub(crate) fn take(&self, data: &[u8]) -> Option<(u64, Box<dyn ImageSource>)> {
        let id = source_id(data)?;
        let source = self.sources.lock().unwrap_or_else(|e| e.into_inner()).remove(&id)?;
        Some((id, source))
    }

    /// Images registered and not yet taken.
    pub fn pending(&self) -> usize {
        self.sources.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// The id in an outgoing handle, if `data` is one.
fn source_id(data: &[u8]) -> Option<u64> {
    let id = data.strip_prefix(SOURCE_MAGIC.as_slice())?;
    Some(u64::from_le_bytes(id.try_into().ok()?))
}

/// Whether a message's data is a handle rather than an image (an image never starts so).
pub fn is_handle(data: &[u8]) -> bool {
    source_id(data).is_some() || received_image(data).is_some()
}

/// The data of a received snapshot message: the path of its image's file.
pub(crate) fn file_handle(path: &Path) -> Bytes {
    let mut handle = FILE_MAGIC.to_vec();
    handle.extend_from_slice(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()));
    Bytes::from(handle)
}

/// The file a received snapshot message's data names, if it names one. The file is complete
/// and its checksum verified; whoever takes the message removes it once done with it.
pub fn received_image(data: &[u8]) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let path = data.strip_prefix(FILE_MAGIC.as_slice())?;
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(path)))
}
