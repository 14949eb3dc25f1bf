//! Receiving one snapshot in chunks into a file of the snapshot directory (in memory only when
//! the transport has no directory), verifying the whole image's checksum before anyone sees it.
//!
//! A partial image is kept, named by its sender and identity (`<from>-<index>-<term>-<image
//! id>.part`), so that a sender whose connection broke resumes where it stopped: its offer of
//! the same image is answered with the partial file's length. An offer of another image from
//! the same sender (a newer index: its snapshot changed meanwhile) removes the old partial
//! file and starts over. A complete image is renamed to `.snap` after its checksum was
//! verified and the file synced, and handed over as the message's data
//! ([`crate::images::received_image`]); the member removes it once installed or refused. A
//! `.snap` left by a crash is removed when the transport starts: the core has forgotten the
//! message it came with.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use cairn_raft::{Message, MessageBody, NodeId};

use crate::codec::{self, DecodeError, SnapFrame};
use crate::outbound::hex;
use crate::stream_out::CHUNK_BYTES;

/// Largest stream frame accepted: a chunk and its framing.
pub(crate) const MAX_STREAM_FRAME: u32 = (CHUNK_BYTES as u32) + 4096;
/// A sender silent for this long is dropped (a paced sender sends a chunk every quarter second).
pub(crate) const CHUNK_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a resumed transfer waits for the connection it replaces to let go of the file.
const TAKEOVER_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a received image was refused.
#[derive(Debug)]
pub(crate) enum ReceiveError {
    Io(std::io::Error),
    /// The stream broke its rules (a chunk out of place, an image over the limit).
    Protocol(String),
    Decode(DecodeError),
}

impl std::fmt::Display for ReceiveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReceiveError::Io(e) => write!(f, "{e}"),
            ReceiveError::Protocol(why) => f.write_str(why),
            ReceiveError::Decode(e) => write!(f, "{e}"),
        }
    }
}

impl From<std::io::Error> for ReceiveError {
    fn from(e: std::io::Error) -> ReceiveError {
        ReceiveError::Io(e)
    }
}

impl From<DecodeError> for ReceiveError {
    fn from(e: DecodeError) -> ReceiveError {
        ReceiveError::Decode(e)
    }
}

/// The snapshot directory and the partial files being written to.
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    pub(crate) dir: Option<PathBuf>,
    busy: Mutex<HashSet<PathBuf>>,
}

impl Inbox {
    pub(crate) fn new(dir: Option<PathBuf>) -> std::io::Result<Inbox> {
        if let Some(d) = &dir {
            std::fs::create_dir_all(d)?;
            for entry in std::fs::read_dir(d)? {
                let path = entry?.path();
                if path.extension().is_some_and(|e| e == "snap") {
                    std::fs::remove_file(&path)?;
                }
            }
        }
        Ok(Inbox { dir, busy: Mutex::default() })
    }
}

/// Where one image is received: its file (or memory), how much it holds and its crc32c so far.
pub(crate) struct Reception {
    inbox: Arc<Inbox>,
    /// The partial file's path, held in the inbox's busy set until this is dropped.
    path: Option<PathBuf>,
    file: Option<std::fs::File>,
    memory: Vec<u8>,
    max_memory: u64,
    pub(crate) len: u64,
    crc: u32,
}

impl Drop for Reception {
    fn drop(&mut self) {
        if let Some(path) = &self.path {
            self.inbox.busy.lock().unwrap_or_else(|e| e.into_inner()).remove(path);
        }
    }
}

fn stem(from: NodeId, msg: &Message, image_id: u64) -> String {
    let (index, term) = match &msg.body {
        MessageBody::Snapshot { snapshot } => (snapshot.meta.index.0, snapshot.meta.term.0),
        _ => (0, 0),
    };
    format!("{}-{index}-{term}-{image_id:x}", hex(from))
}

impl Reception {
    /// Opens the reception of `image_id` from `from`: its partial file if one is kept (waiting
    /// for a connection still writing it to let go), else a new one; other partial files from
    /// `from` are removed.
    pub(crate) async fn open(
        inbox: &Arc<Inbox>,
        from: NodeId,
        msg: &Message,
        image_id: u64,
        max_memory: u64,
    ) -> Result<Reception, ReceiveError> {
        let mut r = Reception {
            inbox: inbox.clone(),
            path: None,
            file: None,
            memory: Vec::new(),
            max_memory,
            len: 0,
            crc: 0,
        };
        let Some(dir) = &inbox.dir else { return Ok(r) };
        let stem = stem(from, msg, image_id);
        let path = dir.join(format!("{stem}.part"));
        let deadline = tokio::time::Instant::now() + TAKEOVER_TIMEOUT;
        while !inbox.busy.lock().unwrap_or_else(|e| e.into_inner()).insert(path.clone()) {
            if tokio::time::Instant::now() > deadline {
                return Err(ReceiveError::Protocol(format!("{stem} is being received already")));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        r.path = Some(path.clone());
        let (dir, prefix) = (dir.clone(), format!("{}-", hex(from)));
        let (file, len, crc) = blocking(move || open_part(&dir, &prefix, &path)).await?;
        (r.file, r.len, r.crc) = (Some(file), len, crc);
        Ok(r)
    }

    /// Appends a chunk that must start where the image so far ends.
    pub(crate) async fn write(&mut self, offset: u64, data: Bytes) -> Result<(), ReceiveError> {
        if offset != self.len {
            return Err(ReceiveError::Protocol(format!(
                "a chunk at offset {offset}, where the image so far ends at {}",
                self.len
            )));
        }
        self.len += data.len() as u64;
        self.crc = crc32c::crc32c_append(self.crc, &data);
        let Some(mut file) = self.file.take() else {
            if self.len > self.max_memory {
                return Err(ReceiveError::Protocol(format!(
                    "a snapshot over the limit of {} bytes",
                    self.max_memory
                )));
            }
            self.memory.extend_from_slice(&data);
            return Ok(());
        };
        let file = blocking(move || file.write_all(&data).map(|()| file)).await?;
        self.file = Some(file);
        Ok(())
    }

    /// Checks the sender's length and checksum against what arrived; on success returns the
    /// message's data: the image, or a handle to its file, synced and renamed to `.snap`.
    pub(crate) async fn finish(mut self, len: u64, crc: u32) -> Result<Bytes, ReceiveError> {
        if (len, crc) != (self.len, self.crc) {
            if let Some(path) = &self.path {
                // Bytes that do not add up to the image are of no use to a resumed transfer.
                let _ = std::fs::remove_file(path);
            }
            return Err(ReceiveError::Decode(DecodeError::ChecksumMismatch {
                expected: crc,
                actual: self.crc,
            }));
        }
        let (Some(file), Some(path)) = (self.file.take(), self.path.clone()) else {
            return Ok(Bytes::from(std::mem::take(&mut self.memory)));
        };
        let done = path.with_extension("snap");
        let to = done.clone();
        blocking(move || {
            file.sync_all()?;
            std::fs::rename(&path, &to)?;
            sync_dir(&to)
        })
        .await?;
        Ok(crate::images::file_handle(&done))
    }
}

fn sync_dir(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// Opens `path` for appending, removing other partial files whose names start with `prefix`;
/// returns the file, its length and the crc32c of what it holds.
fn open_part(dir: &Path, prefix: &str, path: &Path) -> std::io::Result<(std::fs::File, u64, u32)> {
    for entry in std::fs::read_dir(dir)? {
        let other = entry?.path();
        let name = other.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if other != path && name.starts_with(prefix) && name.ends_with(".part") {
            std::fs::remove_file(&other)?;
        }
    }
    let mut file = std::fs::OpenOptions::new().create(true).read(true).append(true).open(path)?;
    let (mut len, mut crc) = (0u64, 0u32);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        len += n as u64;
    }
    Ok((file, len, crc))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, ReceiveError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?
        .map_err(ReceiveError::Io)
}

/// Reads one stream frame within [`CHUNK_TIMEOUT`]; `None` when the sender hung up.
pub(crate) async fn read_frame<S: tokio::io::AsyncRead + Unpin>(
    conn: &mut S,
) -> Result<Option<SnapFrame>, ReceiveError> {
    let read = async {
        let frame =
            crate::frame_io::read_payload::<_, ReceiveError>(conn, MAX_STREAM_FRAME).await?;
        let Some((payload, crc)) = frame else { return Ok(None) };
        codec::decode_snap_frame(payload, crc).map(Some).map_err(ReceiveError::Decode)
    };
    tokio::time::timeout(CHUNK_TIMEOUT, read)
        .await
        .map_err(|_| ReceiveError::Protocol("the sender went silent".into()))?
}
