//! Sending one snapshot in chunks: read from its [`ImageSource`] on a blocking thread, framed
//! with offsets and checksums, paced to the send rate, and resumed after a broken connection
//! from the offset the receiver says it holds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_raft::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::timeout;

use crate::codec::{self, SnapFrame, StreamKind};
use crate::images::ImageSource;
use crate::outbound::{dial, hex, read_reply, Conn, DialError, Link};
use crate::PeerAddr;

/// Image bytes per chunk at most: large enough that framing costs nothing, small enough that
/// neither side holds much.
pub const CHUNK_BYTES: usize = 1 << 20;
/// How long the receiver has to answer an offer, and to take the image once it has all of it
/// (it verifies the whole image's checksum and syncs the file).
const OFFER_TIMEOUT: Duration = Duration::from_secs(5);
const DONE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections tried for one snapshot before it is reported failed (the core then sends another,
/// of a newer image). Each attempt after the first resumes where the receiver stopped.
const ATTEMPTS: u32 = 5;
const RETRY_BACKOFF: Duration = Duration::from_millis(200);

/// Counts of snapshot transfers from this member, for metrics and tests.
#[derive(Debug, Default)]
pub struct SnapshotStats {
    /// Connections that carried (part of) a snapshot.
    pub attempts: AtomicU64,
    /// Image bytes sent in chunks, over every attempt.
    pub image_bytes_sent: AtomicU64,
    /// Attempts that resumed at an offset above zero, and the last such offset.
    pub resumed: AtomicU64,
    pub last_resume_offset: AtomicU64,
    /// Image bytes the latest attempt sent.
    pub last_attempt_bytes: AtomicU64,
    /// Snapshots delivered whole.
    pub delivered: AtomicU64,
}

/// One snapshot on its way: the message (its data emptied), the image and how far it was read.
pub(crate) struct Outgoing {
    pub(crate) msg: Message,
    pub(crate) image_id: u64,
    source: Option<Box<dyn ImageSource>>,
    /// Bytes the source handed out since it was last rewound, and their crc32c.
    pos: u64,
    crc: u32,
}

impl Outgoing {
    pub(crate) fn new(msg: Message, image_id: u64, source: Box<dyn ImageSource>) -> Outgoing {
        Outgoing { msg, image_id, source: Some(source), pos: 0, crc: 0 }
    }

    /// The image's bytes read so far (all of it, once sent).
    pub(crate) fn image_bytes(&self) -> u64 {
        self.pos
    }

    /// The next at most `max` bytes, read on a blocking thread.
    async fn next(&mut self, max: usize) -> Result<Option<Bytes>, DialError> {
        let mut source = self.source.take().ok_or_else(|| source_err("the image is gone"))?;
        let (source, read) = tokio::task::spawn_blocking(move || {
            let read = source.next_chunk(max);
            (source, read)
        })
        .await
        .map_err(|e| source_err(&e.to_string()))?;
        self.source = Some(source);
        let chunk = read.map_err(|e| source_err(&e))?;
        if let Some(c) = &chunk {
            self.pos += c.len() as u64;
            self.crc = crc32c::crc32c_append(self.crc, c);
        }
        Ok(chunk)
    }

    /// Positions the image at `offset`: what the receiver holds is encoded again (to carry the
    /// checksum over it) but not sent.
    async fn seek(&mut self, offset: u64) -> Result<(), DialError> {
        if self.pos == offset {
            return Ok(());
        }
        if let Some(s) = self.source.as_mut() {
            s.rewind().map_err(|e| source_err(&e))?;
        }
        (self.pos, self.crc) = (0, 0);
        while self.pos < offset {
            let want = usize::try_from(offset - self.pos).unwrap_or(usize::MAX).min(CHUNK_BYTES);
            if self.next(want).await?.is_none() {
                return Err(DialError::Refused(format!(
                    "the receiver holds {offset} bytes of an image of {}",
                    self.pos
                )));
            }
        }
        Ok(())
    }
}

fn source_err(why: &str) -> DialError {
    DialError::Io(std::io::Error::other(format!("reading the image: {why}")))
}

/// Paces writes to `rate` bytes a second (0: unpaced).
struct Pace {
    rate: u64,
    start: Instant,
    sent: u64,
}

impl Pace {
    async fn wrote(&mut self, n: usize) {
        if self.rate == 0 {
            return;
        }
        self.sent += n as u64;
        let due = self.start + Duration::from_secs_f64(self.sent as f64 / self.rate as f64);
        tokio::time::sleep_until(due.into()).await;
    }
}

/// The chunk size for a send rate: whole chunks, or a quarter second's worth when slower, so a
/// paced transfer flows rather than bursts.
fn chunk_for(rate: u64) -> usize {
    if rate == 0 {
        return CHUNK_BYTES;
    }
    usize::try_from(rate / 4).unwrap_or(CHUNK_BYTES).clamp(4 << 10, CHUNK_BYTES)
}

/// Sends `out` to `to`, over new connections while they break (up to [`ATTEMPTS`]), each one
/// resuming at the offset the receiver holds.
pub(crate) async fn send(
    link: &Link,
    addrs: &[PeerAddr],
    out: &mut Outgoing,
    rate: u64,
    stats: &SnapshotStats,
) -> Result<(), DialError> {
    let to = out.msg.to;
    let mut attempt = 1;
    loop {
        let result = match dial(link, to, addrs, StreamKind::SnapshotStream).await {
            Ok(Conn::Plain(c)) => stream(c, link, out, rate, stats).await,
            Ok(Conn::Tls(c)) => stream(*c, link, out, rate, stats).await,
            Err(e) => Err(e),
        };
        match result {
            Err(e @ (DialError::Io(_) | DialError::Timeout)) if attempt < ATTEMPTS => {
                tracing::info!(peer = %hex(to), attempt, "snapshot connection broke ({e}); resuming");
                tokio::time::sleep(RETRY_BACKOFF * attempt).await;
                attempt += 1;
            }
            Ok(()) => {
                stats.delivered.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            Err(e) => return Err(e),
        }
    }
}

async fn write_frame<S: AsyncWrite + Unpin>(
    conn: &mut S,
    f: &SnapFrame,
    buf: &mut Vec<u8>,
) -> std::io::Result<()> {
    buf.clear();
    codec::encode_snap_frame(f, buf);
    conn.write_all(buf).await
}

/// One connection's worth: offer, learn the receiver's offset, send the rest, then Done.
async fn stream<S: AsyncRead + AsyncWrite + Unpin>(
    mut conn: S,
    link: &Link,
    out: &mut Outgoing,
    rate: u64,
    stats: &SnapshotStats,
) -> Result<(), DialError> {
    stats.attempts.fetch_add(1, Ordering::Relaxed);
    stats.last_attempt_bytes.store(0, Ordering::Relaxed);
    let to = out.msg.to;
    let mut buf = Vec::with_capacity(CHUNK_BYTES + 64);
    let offer = SnapFrame::Offer { image_id: out.image_id, msg: out.msg.clone() };
    write_frame(&mut conn, &offer, &mut buf).await?;
    conn.flush().await?;
    let offset = read_resume(&mut conn).await?;
    if offset > 0 {
        stats.resumed.fetch_add(1, Ordering::Relaxed);
        stats.last_resume_offset.store(offset, Ordering::Relaxed);
        tracing::info!(peer = %hex(to), offset, "resuming a snapshot where the receiver stopped");
    }
    out.seek(offset).await?;
    let sent = link.traffic.peer(to);
    let mut pace = Pace { rate, start: Instant::now(), sent: 0 };
    let max = chunk_for(rate);
    loop {
        let offset = out.pos;
        let Some(data) = out.next(max).await? else { break };
        let n = data.len();
        write_frame(&mut conn, &SnapFrame::Chunk { offset, data }, &mut buf).await?;
        crate::PeerBytes::add(&sent.sent, buf.len());
        stats.image_bytes_sent.fetch_add(n as u64, Ordering::Relaxed);
        stats.last_attempt_bytes.fetch_add(n as u64, Ordering::Relaxed);
        pace.wrote(n).await;
    }
    write_frame(&mut conn, &SnapFrame::Done { len: out.pos, crc: out.crc }, &mut buf).await?;
    conn.flush().await?;
    read_reply(&mut conn, DONE_TIMEOUT).await?.map_err(DialError::Refused)
}

/// Reads the receiver's answer to an offer: where to resume, or its refusal.
async fn read_resume<S: AsyncRead + Unpin>(conn: &mut S) -> Result<u64, DialError> {
    let read = async {
        let mut header = [0u8; codec::FRAME_HEADER_LEN];
        conn.read_exact(&mut header).await?;
        let (len, crc) = codec::parse_frame_header(&header, 4096)?;
        let mut payload = vec![0u8; len as usize];
        conn.read_exact(&mut payload).await?;
        let payload = Bytes::from(payload);
        match codec::decode_snap_frame(payload.clone(), crc) {
            Ok(SnapFrame::Resume { offset }) => Ok(offset),
            // A refusal is a reply frame, which does not parse as a stream frame.
            _ => match codec::decode_reply(payload, crc)? {
                Err(why) => Err(DialError::Refused(why)),
                Ok(()) => Err(DialError::Refused("the receiver took no offset".into())),
            },
        }
    };
    timeout(OFFER_TIMEOUT, read).await.map_err(|_| DialError::Timeout)?
}
