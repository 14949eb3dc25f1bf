//! Dialing peers: one long-lived connection per peer for Raft messages, and one connection per
//! snapshot (streamed by `stream_out`).

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_raft::{Message, MessageBody, NodeId};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::Runtime;
use tokio::sync::mpsc;
use tokio::time::timeout;

use crate::codec::{self, DecodeError, Hello, StreamKind};
use crate::direct::{Direct, Wrote};
use crate::images::{InlineImage, OutgoingImages};
use crate::stream_out::{self, Outgoing, SnapshotStats};
use crate::{PeerAddr, Sink};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a peer has to answer our hello, or to take a snapshot once it has all of it.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// A dead peer is retried this often at most: within an election timeout of its return.
const MAX_BACKOFF: Duration = Duration::from_millis(500);
/// Messages taken from the queue for one write at most; enough to amortize the syscall.
const MAX_BATCH: usize = 256;
/// A frame is closed once it holds this much entry data, so that a burst of large appends
/// never makes a frame the receiver refuses (64 MiB by default): 256 appends of 1 MiB would.
const FRAME_DATA_TARGET: u64 = 4 << 20;

/// Encodes `msgs` as frames of at most about [`FRAME_DATA_TARGET`] of entry data each, counted
/// as the core counts entries for its byte limits (one message larger than that gets a frame
/// of its own).
fn encode_frames(msgs: &[Message], out: &mut Vec<u8>) {
    let mut start = 0;
    let mut data = 0u64;
    for (i, m) in msgs.iter().enumerate() {
        let size = match &m.body {
            MessageBody::Append { entries, .. } => entries.iter().map(|e| e.size_bytes()).sum(),
            _ => 0,
        };
        if i > start && data + size > FRAME_DATA_TARGET {
            codec::encode_batch(&msgs[start..i], out);
            (start, data) = (i, 0);
        }
        data += size;
    }
    codec::encode_batch(&msgs[start..], out);
}

/// What every outgoing connection needs to introduce itself and report.
#[derive(Clone)]
pub(crate) struct Link {
    pub(crate) cluster_id: u64,
    pub(crate) local: NodeId,
    pub(crate) sink: Arc<dyn Sink>,
    pub(crate) traffic: Arc<crate::PeerTraffic>,
    /// Looks peer host names up again at each dial; `None`: the system's resolver.
    pub(crate) resolver: Option<crate::Resolver>,
    /// How often each peer's round trip is timed ([`crate::probe`]); zero: never.
    pub(crate) probe_interval: Duration,
}

/// Why a connection to a peer failed.
#[derive(Debug)]
pub(crate) enum DialError {
    Io(std::io::Error),
    Timeout,
    /// The peer answered our hello with a refusal.
    Refused(String),
    Protocol(DecodeError),
    /// The TLS handshake failed (an untrusted certificate, a name it does not hold).
    Tls(std::io::Error),
    /// A round-trip probe was answered with another probe's number.
    WrongProbe {
        sent: u64,
        got: u64,
    },
}

impl fmt::Display for DialError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DialError::Io(e) => write!(f, "{e}"),
            DialError::Tls(e) => write!(f, "TLS handshake: {e}"),
            DialError::Timeout => f.write_str("timed out"),
            DialError::Refused(why) => write!(f, "refused by the peer: {why}"),
            DialError::Protocol(e) => write!(f, "peer broke the protocol: {e}"),
            DialError::WrongProbe { sent, got } => {
                write!(f, "peer answered probe {sent} with probe {got}")
            }
        }
    }
}

impl From<std::io::Error> for DialError {
    fn from(e: std::io::Error) -> DialError {
        DialError::Io(e)
    }
}

impl From<DecodeError> for DialError {
    fn from(e: DecodeError) -> DialError {
        DialError::Protocol(e)
    }
}

/// What the writer task writes: a message, or the rest of a batch the caller began writing
/// itself ([`crate::direct`]).
pub(crate) enum Item {
    Message(Message),
    Rest(Vec<u8>),
}

/// The sending side toward one peer: written directly while its queue is empty (see
/// [`crate::direct`]), otherwise a bounded queue drained by a writer task.
pub(crate) struct Peer {
    id: NodeId,
    /// The round-trip prober's task, stopped with the peer.
    prober: Option<tokio::task::AbortHandle>,
    tx: mpsc::Sender<Item>,
    direct: Arc<Direct>,
    sent: Arc<crate::PeerBytes>,
    /// Set once the peer was reported unreachable; cleared by the next successful write, so a
    /// peer that stays down is reported once, not for every dropped heartbeat.
    reported: Arc<AtomicBool>,
    sink: Arc<dyn Sink>,
}

impl Peer {
    pub(crate) fn spawn(
        rt: &Runtime,
        link: &Link,
        id: NodeId,
        addrs: Vec<PeerAddr>,
        queue_len: usize,
    ) -> Peer {
        let (tx, rx) = mpsc::channel(queue_len.max(1));
        let reported = Arc::new(AtomicBool::new(false));
        let sent = link.traffic.peer(id);
        let prober = (!link.probe_interval.is_zero()).then(|| {
            let every = link.probe_interval;
            let probe = crate::probe::run(link.clone(), id, addrs.clone(), every, sent.clone());
            rt.spawn(probe).abort_handle()
        });
        let direct = Arc::new(Direct::default());
        let writer = Writer {
            link: link.clone(),
            to: id,
            addrs,
            rx,
            reported: reported.clone(),
            sent: sent.clone(),
            direct: direct.clone(),
        };
        rt.spawn(writer.run());
        Peer { id, prober, tx, direct, sent, reported, sink: link.sink.clone() }
    }

    /// Sends a batch of messages to this peer, in order after everything sent before: written
    /// at once on this thread if `now` and nothing is queued, otherwise queued.
    pub(crate) fn send(&self, msgs: Vec<Message>, now: bool) {
        if msgs.is_empty() {
            return;
        }
        if !now {
            self.queue(msgs);
            return;
        }
        let wrote = self.direct.write(
            |buf| encode_frames(&msgs, buf),
            // Queued under the direct lock: nothing can go before it.
            |rest| self.enqueue(Item::Rest(rest)),
        );
        match wrote {
            Wrote::Queue => self.queue(msgs),
            Wrote::All(n) | Wrote::Part(n) => delivered(&self.sent, &self.reported, n),
            Wrote::Failed(e) => {
                tracing::debug!(peer = %hex(self.id), "write to peer failed: {e}");
                report_unreachable(&self.reported, &*self.sink, self.id);
            }
        }
    }

    fn queue(&self, msgs: Vec<Message>) {
        for m in msgs {
            if !self.enqueue(Item::Message(m)) {
                report_unreachable(&self.reported, &*self.sink, self.id);
            }
        }
    }

    /// Queues an item for the writer task; false when the queue is full or closed.
    fn enqueue(&self, item: Item) -> bool {
        // Counted before it is queued: the writer may take and write it at once.
        self.direct.queued.fetch_add(1, Ordering::AcqRel);
        if self.tx.try_send(item).is_ok() {
            return true;
        }
        self.direct.queued.fetch_sub(1, Ordering::AcqRel);
        false
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Some(p) = &self.prober {
            p.abort();
        }
    }
}

/// `n` bytes reached the peer's socket (written directly or by the writer task): counted, and
/// the peer is reachable again, so that its next failure is reported.
fn delivered(sent: &crate::PeerBytes, reported: &AtomicBool, n: usize) {
    crate::PeerBytes::add(&sent.sent, n);
    reported.store(false, Ordering::Relaxed);
}

fn report_unreachable(reported: &AtomicBool, sink: &dyn Sink, id: NodeId) {
    if !reported.swap(true, Ordering::Relaxed) {
        sink.unreachable(id);
    }
}

struct Writer {
    link: Link,
    to: NodeId,
    addrs: Vec<PeerAddr>,
    rx: mpsc::Receiver<Item>,
    reported: Arc<AtomicBool>,
    sent: Arc<crate::PeerBytes>,
    direct: Arc<Direct>,
}

impl Writer {
    /// Connects, writes until the connection fails, and reconnects with backoff, until the
    /// transport is dropped.
    async fn run(mut self) {
        let mut backoff = MIN_BACKOFF;
        let mut down = false;
        loop {
            match dial(&self.link, self.to, &self.addrs, StreamKind::Messages).await {
                Ok(conn) => {
                    if down {
                        tracing::info!(peer = %hex(self.to), "peer reachable again");
                    }
                    down = false;
                    backoff = MIN_BACKOFF;
                    let pumped = match conn {
                        Conn::Plain(c) => {
                            self.direct.attach(&c);
                            self.pump(c).await
                        }
                        Conn::Tls(c) => self.pump(*c).await,
                    };
                    // Before the queue is emptied below: a batch begun on this connection
                    // must not be finished on the next.
                    self.direct.detach();
                    if let Err(e) = pumped {
                        tracing::warn!(peer = %hex(self.to), "lost connection to peer: {e}");
                    }
                }
                Err(e) => {
                    if matches!(&e, DialError::Refused(why) if why.starts_with(crate::REMOVED)) {
                        self.link.sink.removed(self.to);
                    }
                    if !down {
                        tracing::warn!(peer = %hex(self.to), "cannot reach peer: {e}");
                    }
                    down = true;
                }
            }
            if self.rx.is_closed() {
                return;
            }
            // What queued while the peer was away is stale (heartbeats of a past moment,
            // appends the leader will resend after probing): drop it rather than replay it.
            let mut dropped = false;
            while self.rx.try_recv().is_ok() {
                self.direct.queued.fetch_sub(1, Ordering::AcqRel);
                dropped = true;
            }
            if dropped || down {
                report_unreachable(&self.reported, &*self.link.sink, self.to);
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Writes everything queued, one frame per write, until the queue closes or a write fails.
    async fn pump<S: AsyncWrite + Unpin>(&mut self, mut conn: S) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(64 << 10);
        let mut batch = Vec::with_capacity(MAX_BATCH);
        loop {
            let Some(first) = self.rx.recv().await else { return Ok(()) };
            let mut items = 1;
            buf.clear();
            let mut next = Some(first);
            while let Some(item) = next.take() {
                match item {
                    Item::Message(m) => batch.push(m),
                    Item::Rest(rest) => {
                        // The rest of a batch begun directly (always first in the queue, as
                        // it is queued only when nothing else is).
                        if !batch.is_empty() {
                            encode_frames(&batch, &mut buf);
                            batch.clear();
                        }
                        buf.extend_from_slice(&rest);
                    }
                }
                if items < MAX_BATCH {
                    next = self.rx.try_recv().ok();
                    items += usize::from(next.is_some());
                }
            }
            if !batch.is_empty() {
                encode_frames(&batch, &mut buf);
                batch.clear();
            }
            let written = conn.write_all(&buf).await;
            // rustls may hold the last record until flushed; a no-op on a bare socket.
            let flushed = match written {
                Ok(()) => conn.flush().await,
                Err(e) => Err(e),
            };
            // Written (or lost with the connection): the caller may write directly again once
            // nothing else is queued.
            self.direct.queued.fetch_sub(items, Ordering::AcqRel);
            flushed?;
            delivered(&self.sent, &self.reported, buf.len());
            if buf.capacity() > 4 << 20 {
                // A burst of large appends should not pin its buffer for the connection's life.
                buf = Vec::with_capacity(64 << 10);
            }
        }
    }
}

/// A connection to a peer: a bare socket, or TLS over one for an `https://` URL. Each kind is
/// written by code of its own (see `Writer::pump`), so a plain connection pays nothing for TLS.
pub(crate) enum Conn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// Where to try, in order: for a peer URL that names a host, the addresses the name has now
/// (looked up once per dial), then the ones it had at start; each address once.
async fn candidates(link: &Link, addrs: &[PeerAddr]) -> Vec<PeerAddr> {
    let mut out: Vec<PeerAddr> = Vec::new();
    let mut looked_up: Vec<&str> = Vec::new();
    for peer in addrs {
        if let Some(host) = peer.host.as_deref().filter(|h| !looked_up.contains(h)) {
            looked_up.push(host);
            for addr in lookup(link, host).await {
                out.push(PeerAddr { addr, ..peer.clone() });
            }
        }
        out.push(peer.clone());
    }
    let mut seen = std::collections::BTreeSet::new();
    out.retain(|p| seen.insert(p.addr));
    out
}

/// `host:port`'s addresses now; none if the lookup fails or takes too long (the addresses from
/// start are tried then).
async fn lookup(link: &Link, host: &str) -> Vec<SocketAddr> {
    let found = match &link.resolver {
        Some(r) => (r.0)(host),
        None => match timeout(CONNECT_TIMEOUT, tokio::net::lookup_host(host)).await {
            Ok(found) => found.map(Iterator::collect),
            Err(_) => return Vec::new(),
        },
    };
    found.unwrap_or_else(|e| {
        tracing::debug!("looking up peer host {host}: {e}");
        Vec::new()
    })
}

/// Connects to the first address of `to` that answers and introduces this member.
pub(crate) async fn dial(
    link: &Link,
    to: NodeId,
    addrs: &[PeerAddr],
    kind: StreamKind,
) -> Result<Conn, DialError> {
    let mut last = DialError::Timeout;
    for peer in &candidates(link, addrs).await {
        let conn = match timeout(CONNECT_TIMEOUT, TcpStream::connect(peer.addr)).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                last = DialError::Io(e);
                continue;
            }
            Err(_) => {
                last = DialError::Timeout;
                continue;
            }
        };
        conn.set_nodelay(true)?;
        let h = Hello { cluster_id: link.cluster_id, from: link.local, to, kind };
        let Some((name, tls)) = &peer.tls else {
            let mut conn = conn;
            introduce(&mut conn, &h).await?;
            return Ok(Conn::Plain(conn));
        };
        let handshake = tls.connector().connect(name.clone(), conn);
        let mut conn = match timeout(REPLY_TIMEOUT, handshake).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                last = DialError::Tls(e);
                continue;
            }
            Err(_) => {
                last = DialError::Timeout;
                continue;
            }
        };
        let cert = conn.get_ref().1.peer_certificates().and_then(|c| c.first());
        if let Err(why) = tls.check_allowed(cert) {
            last = DialError::Tls(std::io::Error::other(why));
            continue;
        }
        introduce(&mut conn, &h).await?;
        return Ok(Conn::Tls(Box::new(conn)));
    }
    Err(last)
}

/// Sends our hello and waits for the peer to accept it.
async fn introduce<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut S,
    h: &Hello,
) -> Result<(), DialError> {
    let mut hello = Vec::with_capacity(codec::HELLO_LEN);
    codec::encode_hello(h, &mut hello);
    conn.write_all(&hello).await?;
    conn.flush().await?;
    read_reply(conn, REPLY_TIMEOUT).await?.map_err(DialError::Refused)
}

/// Reads one reply frame: the peer's acceptance or its reason for refusing.
pub(crate) async fn read_reply<S: AsyncRead + Unpin>(
    conn: &mut S,
    limit: Duration,
) -> Result<Result<(), String>, DialError> {
    let read = async {
        // A reply is a short reason at most.
        let frame = crate::frame_io::read_payload::<_, DialError>(conn, 4096).await?;
        let (payload, crc) =
            frame.ok_or(std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        Ok::<_, DialError>(codec::decode_reply(payload, crc)?)
    };
    timeout(limit, read).await.map_err(|_| DialError::Timeout)?
}

/// Sends snapshots, each on a connection of its own (and its own task, so a slow or paced
/// transfer holds up nothing else), and reports how each ended.
pub(crate) struct Snapshots {
    link: Link,
    pub(crate) addrs: BTreeMap<NodeId, Vec<PeerAddr>>,
    /// Where the images of outgoing snapshot messages wait to be taken.
    pub(crate) images: Option<Arc<OutgoingImages>>,
    /// Bytes a second per transfer at most; 0: unpaced.
    pub(crate) rate: u64,
    pub(crate) stats: Arc<SnapshotStats>,
}

impl Snapshots {
    pub(crate) fn new(link: Link, addrs: BTreeMap<NodeId, Vec<PeerAddr>>) -> Snapshots {
        Snapshots { link, addrs, images: None, rate: 0, stats: Arc::default() }
    }

    pub(crate) fn send(&self, rt: &Runtime, mut msg: Message) {
        let to = msg.to;
        let MessageBody::Snapshot { snapshot } = &mut msg.body else { return };
        let index = snapshot.meta.index.0;
        let data = std::mem::take(&mut snapshot.data);
        // Taken out of the registry whatever happens next, so an image is never left behind
        // (holding its read view open) for a peer that went away.
        let (image_id, source) = match self.images.as_ref().and_then(|i| i.take(&data)) {
            Some(taken) => taken,
            None => (crc32c::crc32c(&data).into(), Box::new(InlineImage::new(data)) as _),
        };
        let Some(addrs) = self.addrs.get(&to).cloned() else { return };
        let (link, rate, stats) = (self.link.clone(), self.rate, self.stats.clone());
        rt.spawn(async move {
            let started = std::time::Instant::now();
            let mut out = Outgoing::new(msg, image_id, source);
            let delivered = match stream_out::send(&link, &addrs, &mut out, rate, &stats).await {
                Ok(()) => {
                    let (took, bytes) = (started.elapsed(), out.image_bytes());
                    tracing::info!(peer = %hex(to), index, bytes, ?took, "sent a snapshot");
                    true
                }
                Err(e) => {
                    tracing::warn!(peer = %hex(to), "sending a snapshot failed: {e}");
                    false
                }
            };
            // The image (and the read view under it) is let go before the core hears.
            drop(out);
            link.sink.snapshot_sent(to, delivered);
        });
    }
}

/// Member ids are shown in hex, as etcd shows them.
pub(crate) fn hex(id: NodeId) -> String {
    format!("{:x}", id.0)
}
