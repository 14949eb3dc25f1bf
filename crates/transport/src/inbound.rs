//! Accepting peers: check who is calling, then hand every message it sends to the sink.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_raft::{Message, MessageBody, NodeId};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::timeout;

use crate::codec::{self, DecodeError, Hello, SnapFrame, StreamKind};
use crate::images;
use crate::outbound::hex;
use crate::stream_in::{self, Inbox, ReceiveError, Reception};
use crate::{ServerTls, Sink};

/// A caller that has not introduced itself by then is dropped (it holds a socket); the TLS
/// handshake, when there is one, has as long again.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Peer connections open at once, at most. Members need a few each (messages, snapshots, a
/// joining member's question); this leaves room for a large cluster while a stranger opening
/// connections by the thousand on the peer port cannot take the descriptors the WAL and the
/// database need (the server keeps a reserve for them and for these). A connection past the
/// cap is closed as soon as it is accepted.
pub const MAX_INBOUND_CONNS: usize = 64;
/// How often refusing peer connections is logged at most.
const REFUSED_LOG_EVERY: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub(crate) struct Acceptor {
    pub(crate) cluster_id: u64,
    pub(crate) local: NodeId,
    /// The members this one accepts calls from; changes with the membership.
    pub(crate) known: Arc<std::sync::RwLock<std::collections::BTreeSet<NodeId>>>,
    pub(crate) max_frame_bytes: u32,
    pub(crate) max_snapshot_bytes: u32,
    pub(crate) sink: Arc<dyn Sink>,
    pub(crate) traffic: Arc<crate::PeerTraffic>,
    /// Where chunked snapshots are written.
    pub(crate) inbox: Arc<Inbox>,
    /// Places for open peer connections ([`MAX_INBOUND_CONNS`]), shared by every listener.
    pub(crate) slots: Arc<tokio::sync::Semaphore>,
    /// Refuse a client certificate presented from an address it does not name
    /// ([`crate::san`]).
    pub(crate) check_san: bool,
    /// Where plain message connections go once accepted ([`crate::poll`]).
    pub(crate) poll: Option<crate::PollHandle>,
}

/// Why an incoming peer connection ended early.
#[derive(Debug)]
pub(crate) enum InboundError {
    Io(std::io::Error),
    Timeout,
    Protocol(DecodeError),
    /// We refused the caller, for this reason (also sent to it).
    Refused(String),
    /// The caller sent a message not from itself or not for us.
    Misaddressed {
        from: NodeId,
        to: NodeId,
    },
    /// A snapshot connection carried something else.
    NotASnapshot,
    /// A snapshot message whose data names a local file or image: only this member's own
    /// transport makes those, never a peer.
    Handle,
    /// A chunked snapshot was refused (also told to the sender).
    Stream(ReceiveError),
    /// The TLS handshake failed: no certificate, or one our CA did not sign.
    Tls(std::io::Error),
    /// A probe connection carried something else than probes.
    Probe(crate::outbound::DialError),
    /// The caller's certificate does not name the address it called from, or has none of the
    /// allowed names.
    San(String),
}

impl fmt::Display for InboundError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InboundError::Io(e) => write!(f, "{e}"),
            InboundError::Timeout => f.write_str("the caller did not introduce itself in time"),
            InboundError::Protocol(e) => write!(f, "{e}"),
            InboundError::Refused(why) => write!(f, "refused: {why}"),
            InboundError::Misaddressed { from, to } => write!(
                f,
                "the caller sent a message from {} to {}, not its own to us",
                hex(*from),
                hex(*to)
            ),
            InboundError::NotASnapshot => f.write_str("a snapshot connection carried no snapshot"),
            InboundError::Handle => f.write_str("a snapshot message carried a local handle"),
            InboundError::Stream(e) => write!(f, "receiving a snapshot: {e}"),
            InboundError::Tls(e) => write!(f, "TLS handshake: {e}"),
            InboundError::Probe(e) => write!(f, "answering probes: {e}"),
            InboundError::San(e) => write!(f, "rejected the caller's certificate: {e}"),
        }
    }
}

impl From<std::io::Error> for InboundError {
    fn from(e: std::io::Error) -> InboundError {
        InboundError::Io(e)
    }
}

impl From<DecodeError> for InboundError {
    fn from(e: DecodeError) -> InboundError {
        InboundError::Protocol(e)
    }
}

impl Acceptor {
    pub(crate) async fn serve(self: Arc<Self>, listener: TcpListener, tls: Option<Arc<ServerTls>>) {
        let mut logged: Option<tokio::time::Instant> = None;
        loop {
            match listener.accept().await {
                Ok((conn, addr)) => {
                    let Ok(slot) = self.slots.clone().try_acquire_owned() else {
                        if logged.is_none_or(|at| at.elapsed() >= REFUSED_LOG_EVERY) {
                            logged = Some(tokio::time::Instant::now());
                            tracing::warn!(%addr, "refusing peer connections: {MAX_INBOUND_CONNS} are open, the most allowed");
                        }
                        drop(conn);
                        continue;
                    };
                    let me = self.clone();
                    let tls = tls.clone();
                    tokio::spawn(async move { me.serve_conn(conn, addr, tls, slot).await });
                }
                Err(e) => {
                    // Out of file descriptors, most likely: back off instead of spinning.
                    tracing::warn!("accepting a peer connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Serves one connection, holding its `slot` until it ends (or is handed over with it).
    async fn serve_conn(
        &self,
        conn: TcpStream,
        addr: SocketAddr,
        tls: Option<Arc<ServerTls>>,
        slot: OwnedSemaphorePermit,
    ) {
        let served = match tls {
            None => self.plain_conn(conn, slot).await,
            Some(tls) => self.tls_conn(conn, addr, &tls).await,
        };
        match served {
            Ok(()) | Err(InboundError::Io(_)) => {}
            Err(e) => tracing::warn!(%addr, "closed a peer connection: {e}"),
        }
    }

    /// A plain connection's message stream goes to the thread that consumes the messages, if
    /// there is one ([`crate::poll`]), with the connection's slot.
    async fn plain_conn(
        &self,
        conn: TcpStream,
        slot: OwnedSemaphorePermit,
    ) -> Result<(), InboundError> {
        conn.set_nodelay(true)?;
        let Some((conn, from)) = self.conn(conn).await? else { return Ok(()) };
        let Some(poll) = &self.poll else { return self.messages(conn, from).await };
        poll.adopt(crate::poll::Adopted {
            sock: conn.into_std()?,
            from,
            local: self.local,
            max_frame_bytes: self.max_frame_bytes,
            received: self.traffic.peer(from),
            slot,
        });
        Ok(())
    }

    async fn tls_conn(
        &self,
        conn: TcpStream,
        addr: SocketAddr,
        tls: &ServerTls,
    ) -> Result<(), InboundError> {
        conn.set_nodelay(true)?;
        let conn = timeout(HELLO_TIMEOUT, tls.acceptor().accept(conn))
            .await
            .map_err(|_| InboundError::Timeout)?
            .map_err(InboundError::Tls)?;
        let cert = conn.get_ref().1.peer_certificates().and_then(|c| c.first());
        tls.check_allowed(cert).map_err(InboundError::San)?;
        if let (true, Some(cert)) = (self.check_san, cert) {
            crate::san::check(cert, addr.ip()).await.map_err(InboundError::San)?;
        }
        match self.conn(conn).await? {
            Some((conn, from)) => self.messages(conn, from).await,
            None => Ok(()),
        }
    }

    /// Checks who calls and serves what it asks, except a message stream: that is returned,
    /// with the caller, for the caller of this to read.
    async fn conn<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        mut conn: S,
    ) -> Result<Option<(S, NodeId)>, InboundError> {
        let mut raw = [0u8; codec::HELLO_LEN];
        timeout(HELLO_TIMEOUT, conn.read_exact(&mut raw))
            .await
            .map_err(|_| InboundError::Timeout)??;
        let hello = match codec::decode_hello(&raw) {
            Ok(h) => h,
            Err(e) => {
                // Tell a cairn of another version why; anything else ignores it.
                let _ = reply(&mut conn, Err(&e.to_string())).await;
                return Err(e.into());
            }
        };
        // A joining member knows neither its id nor the cluster's yet: that is what it asks.
        if hello.kind == StreamKind::Members {
            crate::members::serve(&mut conn, &*self.sink).await?;
            return Ok(None);
        }
        if let Err(why) = self.check(&hello) {
            let _ = reply(&mut conn, Err(&why)).await;
            return Err(InboundError::Refused(why));
        }
        reply(&mut conn, Ok(())).await?;
        match hello.kind {
            StreamKind::Messages => return Ok(Some((conn, hello.from))),
            StreamKind::Snapshot => self.snapshot(conn, hello.from).await?,
            StreamKind::SnapshotStream => self.snapshot_stream(conn, hello.from).await?,
            StreamKind::Probe => crate::probe::answer(conn).await.map_err(|e| match e {
                crate::outbound::DialError::Io(e) => InboundError::Io(e),
                e => InboundError::Probe(e),
            })?,
            StreamKind::Members => {}
        }
        Ok(None)
    }

    fn check(&self, h: &Hello) -> Result<(), String> {
        let (ours, local) = (self.cluster_id, self.local);
        if h.cluster_id != ours {
            return Err(format!(
                "member {} of cluster {:x} was called by member {} of cluster {:x}: the clusters differ (check --initial-cluster-token and --initial-cluster)",
                hex(local), ours, hex(h.from), h.cluster_id
            ));
        }
        if h.to != local {
            return Err(format!(
                "this is member {}, not member {} (a peer URL points at the wrong member)",
                hex(local),
                hex(h.to)
            ));
        }
        if !self.known.read().unwrap_or_else(|e| e.into_inner()).contains(&h.from) {
            if self.sink.is_removed(h.from) {
                let from = hex(h.from);
                return Err(format!("{}: member {from} of cluster {ours:x}", crate::REMOVED));
            }
            return Err(format!("member {} is not in cluster {ours:x}", hex(h.from)));
        }
        Ok(())
    }

    /// Reads frames until the caller hangs up, handing their messages over in order.
    async fn messages<S: AsyncRead + Unpin>(
        &self,
        mut conn: S,
        from: NodeId,
    ) -> Result<(), InboundError> {
        let received = self.traffic.peer(from);
        loop {
            let Some((payload, bytes)) = read_frame(&mut conn, self.max_frame_bytes).await? else {
                return Ok(());
            };
            crate::PeerBytes::add(&received.received, bytes);
            for msg in payload? {
                check_message(&msg, from, self.local)?;
                self.sink.message(msg);
            }
        }
    }

    /// Reads one snapshot, hands it over, and says so.
    async fn snapshot<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        mut conn: S,
        from: NodeId,
    ) -> Result<(), InboundError> {
        let Some((msgs, bytes)) = read_frame(&mut conn, self.max_snapshot_bytes).await? else {
            return Ok(());
        };
        crate::PeerBytes::add(&self.traffic.peer(from).received, bytes);
        let mut msgs = msgs?;
        let msg = match (msgs.pop(), msgs.is_empty()) {
            (Some(m), true) if matches!(m.body, MessageBody::Snapshot { .. }) => m,
            _ => return Err(InboundError::NotASnapshot),
        };
        check_message(&msg, from, self.local)?;
        self.sink.message(msg);
        reply(&mut conn, Ok(())).await?;
        Ok(())
    }

    /// Receives one chunked snapshot ([`codec::SnapFrame`]): answers the offer with the offset
    /// already held of that image, writes the chunks, verifies the whole, hands the message
    /// over with its image and says so.
    async fn snapshot_stream<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        mut conn: S,
        from: NodeId,
    ) -> Result<(), InboundError> {
        let stream = |e| InboundError::Stream(e);
        let (image_id, mut msg) = match stream_in::read_frame(&mut conn).await.map_err(stream)? {
            Some(SnapFrame::Offer { image_id, msg }) => (image_id, msg),
            None => return Ok(()),
            Some(_) => return Err(InboundError::NotASnapshot),
        };
        if !matches!(&msg.body, MessageBody::Snapshot { snapshot } if snapshot.data.is_empty()) {
            return Err(InboundError::NotASnapshot);
        }
        check_message(&msg, from, self.local)?;
        let max = u64::from(self.max_snapshot_bytes);
        let mut rx = match Reception::open(&self.inbox, from, &msg, image_id, max).await {
            Ok(r) => r,
            Err(e) => return refuse(&mut conn, e).await,
        };
        let mut buf = Vec::new();
        codec::encode_snap_frame(&SnapFrame::Resume { offset: rx.len }, &mut buf);
        conn.write_all(&buf).await?;
        conn.flush().await?;
        let received = self.traffic.peer(from);
        let data = loop {
            let got = match stream_in::read_frame(&mut conn).await.map_err(stream)? {
                Some(SnapFrame::Chunk { offset, data }) => {
                    crate::PeerBytes::add(&received.received, data.len());
                    rx.write(offset, data).await
                }
                Some(SnapFrame::Done { len, crc }) => break rx.finish(len, crc).await,
                // The sender hung up halfway: the partial file waits for it to resume.
                None => return Ok(()),
                Some(_) => Err(ReceiveError::Protocol("an offer in the middle of a stream".into())),
            };
            if let Err(e) = got {
                return refuse(&mut conn, e).await;
            }
        };
        let data = match data {
            Ok(d) => d,
            Err(e) => return refuse(&mut conn, e).await,
        };
        if let MessageBody::Snapshot { snapshot } = &mut msg.body {
            snapshot.data = data;
        }
        self.sink.message(msg);
        reply(&mut conn, Ok(())).await?;
        Ok(())
    }
}

/// Tells the sender why its snapshot was refused, and ends the connection for it.
async fn refuse<S: AsyncWrite + Unpin>(conn: &mut S, e: ReceiveError) -> Result<(), InboundError> {
    let _ = reply(conn, Err(&e.to_string())).await;
    Err(InboundError::Stream(e))
}

/// A message must come from the caller, be meant for us, and carry no local handle.
pub(crate) fn check_message(
    msg: &Message,
    from: NodeId,
    local: NodeId,
) -> Result<(), InboundError> {
    if msg.from != from || msg.to != local {
        return Err(InboundError::Misaddressed { from: msg.from, to: msg.to });
    }
    match &msg.body {
        MessageBody::Snapshot { snapshot } if images::is_handle(&snapshot.data) => {
            Err(InboundError::Handle)
        }
        _ => Ok(()),
    }
}

type Batch = Result<Vec<cairn_raft::Message>, DecodeError>;

/// Reads one frame and decodes it, with the bytes it took; `None` when the caller hung up
/// between frames. Memory grows with the bytes that actually arrive, never with what a header
/// claims.
async fn read_frame<S: AsyncRead + Unpin>(
    conn: &mut S,
    max: u32,
) -> Result<Option<(Batch, usize)>, InboundError> {
    let Some((len, crc)) = crate::frame_io::read_header::<S, InboundError>(conn, max).await? else {
        return Ok(None);
    };
    let mut payload = Vec::with_capacity((len as usize).min(1 << 20));
    let got = (&mut *conn).take(u64::from(len)).read_to_end(&mut payload).await?;
    if got != len as usize {
        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
    }
    Ok(Some((codec::decode_batch(Bytes::from(payload), crc), codec::FRAME_HEADER_LEN + got)))
}

async fn reply<S: AsyncWrite + Unpin>(
    conn: &mut S,
    result: Result<(), &str>,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    codec::encode_reply(result, &mut buf);
    conn.write_all(&buf).await?;
    // rustls may hold the record until flushed; a no-op on a bare socket.
    conn.flush().await
}
