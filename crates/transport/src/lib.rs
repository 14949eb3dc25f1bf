//! The peer transport: carries Raft messages between the members of a cluster over TCP.
//!
//! Each member dials every peer once and keeps that connection for its Raft messages (votes,
//! appends, heartbeats, forwarded proposals and reads), writing whatever has queued up as one
//! frame per write: many messages per syscall under load, one at a time when idle. The messages
//! a round waits for may be written on the caller's thread instead ([`Transport::send_now`],
//! `direct.rs`), sparing them the hand-off to the transport's thread. A snapshot
//! goes over a connection of its own, so a large image never holds up a heartbeat behind it
//! (etcd keeps snapshots on a separate stream for the same reason), and its outcome is reported
//! back to the core.
//!
//! The queue toward each peer is bounded. When it is full, or the peer is down, messages are
//! dropped and the peer reported unreachable: Raft tolerates lost messages (the leader probes
//! and resends), while an unbounded queue toward a dead peer would grow without limit and
//! flood it with stale traffic when it came back. A dropped forwarded proposal is never resent,
//! so the transport delivers each proposal at most once; its caller times out.
//!
//! Every connection starts with a [`codec::Hello`] naming the cluster, the sender and the
//! receiver; a member refuses a peer of another cluster, one that has it confused with another
//! member, or one it does not know, and both ends log why.
//!
//! A listener or peer address may carry TLS ([`tls`]): the same frames then go through rustls,
//! and with `--peer-client-cert-auth` a caller without a certificate signed by the trusted CA
//! never gets as far as its hello. Plain connections are served by the same code
//! instantiated for a bare socket, so they pay nothing for it.
//!
//! The transport runs on a small tokio runtime of its own, so it serves the same whether the
//! engine is embedded in a program with or without a runtime.

pub mod codec;
mod direct;
mod frame_io;
pub mod histogram;
pub mod images;
mod inbound;
pub mod members;
mod outbound;
pub mod poll;
mod probe;
pub mod san;
mod stream_in;
mod stream_out;
pub mod tls;
mod tls_policy;
pub mod url;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use cairn_raft::{Message, MessageBody, NodeId};
pub use rustls_pki_types::ServerName;
use tokio::runtime::Runtime;

pub use images::{ImageSource, OutgoingImages};
pub use inbound::MAX_INBOUND_CONNS;
pub use poll::{MessagePoll, PollHandle};
pub use probe::PROBE_INTERVAL;
pub use stream_out::SnapshotStats;
pub use tls::{ClientTls, ServerTls, TlsError, TlsFiles, TlsPolicy, TlsVersion};

/// Where the transport hands what arrives and what happened. Called from the transport's
/// threads; implementations queue and return (they must not block).
pub trait Sink: Send + Sync + 'static {
    /// A message from a peer, for the core.
    fn message(&self, msg: Message);
    /// Sending a snapshot to `to` ended: delivered (`true`) or failed.
    fn snapshot_sent(&self, to: NodeId, delivered: bool);
    /// Messages to `to` were dropped: it is down, or its queue is full.
    fn unreachable(&self, to: NodeId);
    /// The membership, for a member asking to join ([`members`]); `None` refuses the query.
    fn members(&self) -> Option<members::RemoteCluster> {
        None
    }
    /// Whether `id` was removed from the cluster (its calls are then refused with
    /// [`REMOVED`], so it learns it even if it never applied its removal).
    fn is_removed(&self, id: NodeId) -> bool {
        let _ = id;
        false
    }
    /// Peer `by` refused this member as removed from the cluster.
    fn removed(&self, by: NodeId) {
        let _ = by;
    }
}

/// How a member refuses a call from a member removed from the cluster (etcd's words for
/// `ErrMemberRemoved`); the caller that reads it stops.
pub const REMOVED: &str = "the member has been permanently removed from the cluster";

/// A socket to accept peers on, with the TLS its URL asks for (`https://`).
#[derive(Debug)]
pub struct Listener {
    /// Already bound (so a test can bind port 0 and learn it).
    pub socket: std::net::TcpListener,
    /// `--peer-cert-file` and the rest, for an `https://` URL.
    pub tls: Option<Arc<ServerTls>>,
}

impl From<std::net::TcpListener> for Listener {
    fn from(socket: std::net::TcpListener) -> Listener {
        Listener { socket, tls: None }
    }
}

/// One address a peer's URLs resolve to, with the TLS an `https://` URL asks for.
#[derive(Clone, Debug)]
pub struct PeerAddr {
    /// Where to connect.
    pub addr: SocketAddr,
    /// The URL's `host:port` when its host is a name rather than an IP address: looked up again
    /// at every dial (as Go's dialer, and so etcd, does), so a peer whose name moves to another
    /// address (a rescheduled pod) is reached there; `addr`, resolved at start, is the fallback.
    pub host: Option<String>,
    /// The name the peer's certificate must hold (the URL's host) and the configuration to
    /// verify it with.
    pub tls: Option<(ServerName<'static>, Arc<ClientTls>)>,
}

impl From<SocketAddr> for PeerAddr {
    fn from(addr: SocketAddr) -> PeerAddr {
        PeerAddr { addr, host: None, tls: None }
    }
}

/// Looks a `host:port` up; the transport's default asks the system's resolver. A test gives
/// its own to move a peer's name.
#[derive(Clone)]
pub struct Resolver(pub Arc<ResolveFn>);

/// What a [`Resolver`] calls: `host:port` in, its addresses out.
pub type ResolveFn = dyn Fn(&str) -> std::io::Result<Vec<SocketAddr>> + Send + Sync;

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Resolver")
    }
}

/// How to run the transport.
#[derive(Debug)]
pub struct TransportConfig {
    pub cluster_id: u64,
    pub local: NodeId,
    /// Sockets to accept peers on.
    pub listeners: Vec<Listener>,
    /// Every other member and the addresses its peer URLs resolve to.
    pub peers: BTreeMap<NodeId, Vec<PeerAddr>>,
    /// Messages that may wait for one peer before more are dropped.
    pub queue_len: usize,
    /// Largest frame of Raft messages accepted from a peer.
    pub max_frame_bytes: u32,
    /// Largest snapshot accepted from a peer in one frame, or in memory when there is no
    /// snapshot directory.
    pub max_snapshot_bytes: u32,
    /// Where bytes to and from each peer are counted.
    pub traffic: Arc<PeerTraffic>,
    /// Where snapshots from peers are received, in files ([`images::received_image`]);
    /// `None` receives them in memory.
    pub snapshot_dir: Option<std::path::PathBuf>,
    /// Where the images of this member's snapshot messages are registered.
    pub images: Option<Arc<OutgoingImages>>,
    /// Bytes a second one snapshot transfer sends at most (`--snapshot-send-rate`); 0: as fast
    /// as the connection takes them.
    pub snapshot_send_rate: u64,
    /// Where snapshot transfers from this member are counted.
    pub snapshot_stats: Arc<SnapshotStats>,
    /// The peer TLS to dial `https://` peer URLs of members added at run time with
    /// ([`Transport::set_peer_urls`]); those named at start carry theirs in [`Self::peers`].
    pub client_tls: Option<Arc<ClientTls>>,
    /// How peer host names are looked up again at each dial; `None`: the system's resolver.
    pub resolver: Option<Resolver>,
    /// How often each peer's round trip is timed ([`PROBE_INTERVAL`], etcd's); zero: never.
    pub probe_interval: std::time::Duration,
    /// Accept a peer's client certificate from any address, not only from those its subject
    /// alternative names list ([`san`]; etcd's
    /// `--experimental-peer-skip-client-san-verification`).
    pub skip_client_san_verification: bool,
    /// Where plain message connections are handed once their caller is accepted, to be read by
    /// the thread that consumes their messages ([`poll`]); `None`: the transport's thread reads
    /// them and hands each message to the sink.
    pub poll: Option<PollHandle>,
}

/// Why a peer URL cannot be dialed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerUrlError {
    /// The URL is malformed or does not resolve.
    Url(url::UrlError),
    /// An `https://` URL, and no peer TLS to dial it with.
    TlsMissing(String),
}

impl std::fmt::Display for PeerUrlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerUrlError::Url(e) => write!(f, "{e}"),
            PeerUrlError::TlsMissing(url) => write!(
                f,
                "TLS key/cert (--peer-cert-file, --peer-key-file) must be provided for peer url {url} with HTTPS scheme"
            ),
        }
    }
}

impl std::error::Error for PeerUrlError {}

/// The addresses a peer URL resolves to, each with the TLS an `https://` URL asks for: the
/// peer's certificate must name the URL's host.
pub fn peer_addrs(
    peer_url: &str,
    tls: Option<&Arc<ClientTls>>,
) -> Result<Vec<PeerAddr>, PeerUrlError> {
    let tls = match (url::is_tls(peer_url), tls) {
        (false, _) => None,
        (true, None) => return Err(PeerUrlError::TlsMissing(peer_url.to_string())),
        (true, Some(tls)) => {
            let host = url::host(peer_url).map_err(PeerUrlError::Url)?;
            let name = ServerName::try_from(host.to_string())
                .map_err(|_| PeerUrlError::Url(url::UrlError::Malformed(peer_url.to_string())))?;
            Some((name, tls.clone()))
        }
    };
    let resolved = url::resolve(peer_url).map_err(PeerUrlError::Url)?;
    let host = url::host(peer_url).map_err(PeerUrlError::Url)?;
    let named = host.parse::<std::net::IpAddr>().is_err();
    let host = named.then(|| url::host_port(peer_url).map(str::to_string)).transpose();
    let host = host.map_err(PeerUrlError::Url)?;
    let addr = |addr| PeerAddr { addr, host: host.clone(), tls: tls.clone() };
    Ok(resolved.into_iter().map(addr).collect())
}

/// Bytes sent to and received from each peer, as frames are written and read (etcd's
/// `etcd_network_peer_sent_bytes_total` and `_received_bytes_total`), and the round trips of
/// probes to it (`etcd_network_peer_round_trip_time_seconds`). A connection looks its peer's
/// counters up once; each frame then costs an atomic add.
#[derive(Debug, Default)]
pub struct PeerTraffic {
    peers: std::sync::Mutex<BTreeMap<NodeId, Arc<PeerBytes>>>,
}

/// One peer's byte counts and round trips.
#[derive(Debug, Default)]
pub struct PeerBytes {
    pub sent: std::sync::atomic::AtomicU64,
    pub received: std::sync::atomic::AtomicU64,
    /// Each answered probe's round trip (see [`PROBE_INTERVAL`]).
    pub rtt: histogram::Histogram<histogram::RttBuckets>,
}

impl PeerBytes {
    pub(crate) fn add(counter: &std::sync::atomic::AtomicU64, n: usize) {
        counter.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    }
}

impl PeerTraffic {
    /// `id`'s counters, created at its first use.
    pub fn peer(&self, id: NodeId) -> Arc<PeerBytes> {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.entry(id).or_default().clone()
    }

    /// (peer, bytes sent, bytes received) for every peer seen.
    pub fn totals(&self) -> Vec<(NodeId, u64, u64)> {
        use std::sync::atomic::Ordering::Relaxed;
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.iter().map(|(id, b)| (*id, b.sent.load(Relaxed), b.received.load(Relaxed))).collect()
    }

    /// The round trips to every peer probed at least once (as etcd's series appear with the
    /// first observation).
    pub fn round_trips(&self) -> Vec<(NodeId, histogram::HistogramSnapshot)> {
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let probed = peers.iter().map(|(id, b)| (*id, b.rtt.snapshot()));
        probed.filter(|(_, h)| h.count > 0).collect()
    }
}

impl TransportConfig {
    pub fn new(cluster_id: u64, local: NodeId) -> TransportConfig {
        TransportConfig {
            cluster_id,
            local,
            listeners: Vec::new(),
            peers: BTreeMap::new(),
            // etcd's per-peer stream buffer.
            queue_len: 4096,
            max_frame_bytes: 64 << 20,
            max_snapshot_bytes: u32::MAX,
            traffic: Arc::default(),
            snapshot_dir: None,
            images: None,
            snapshot_send_rate: 0,
            snapshot_stats: Arc::default(),
            client_tls: None,
            resolver: None,
            probe_interval: PROBE_INTERVAL,
            skip_client_san_verification: false,
            poll: None,
        }
    }
}

/// The running transport. Dropping it closes every connection.
pub struct Transport {
    runtime: Option<Runtime>,
    peers: BTreeMap<NodeId, outbound::Peer>,
    /// Where each peer was dialed, to tell a moved peer from an unchanged one.
    addrs: BTreeMap<NodeId, Vec<PeerAddr>>,
    snapshots: outbound::Snapshots,
    known: Arc<RwLock<BTreeSet<NodeId>>>,
    link: outbound::Link,
    queue_len: usize,
    client_tls: Option<Arc<ClientTls>>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport").field("peers", &self.peers.keys()).finish_non_exhaustive()
    }
}

impl Transport {
    /// Starts accepting peers on the configured listeners and dialing every peer.
    pub fn start(cfg: TransportConfig, sink: Arc<dyn Sink>) -> std::io::Result<Transport> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("cairn-peer-{:x}", cfg.local.0))
            .enable_all()
            .build()?;
        let known = Arc::new(RwLock::new(cfg.peers.keys().copied().collect()));
        let accept = inbound::Acceptor {
            cluster_id: cfg.cluster_id,
            local: cfg.local,
            known: known.clone(),
            max_frame_bytes: cfg.max_frame_bytes,
            max_snapshot_bytes: cfg.max_snapshot_bytes,
            sink: sink.clone(),
            traffic: cfg.traffic.clone(),
            inbox: Arc::new(stream_in::Inbox::new(cfg.snapshot_dir.clone())?),
            slots: Arc::new(tokio::sync::Semaphore::new(inbound::MAX_INBOUND_CONNS)),
            check_san: !cfg.skip_client_san_verification,
            poll: cfg.poll.clone(),
        };
        let _guard = runtime.enter();
        let accept = Arc::new(accept);
        for l in cfg.listeners {
            l.socket.set_nonblocking(true)?;
            let socket = tokio::net::TcpListener::from_std(l.socket)?;
            runtime.spawn(accept.clone().serve(socket, l.tls));
        }
        let link = outbound::Link {
            cluster_id: cfg.cluster_id,
            local: cfg.local,
            sink,
            traffic: cfg.traffic.clone(),
            resolver: cfg.resolver.clone(),
            probe_interval: cfg.probe_interval,
        };
        let mut peers = BTreeMap::new();
        for (id, addrs) in &cfg.peers {
            let peer = outbound::Peer::spawn(&runtime, &link, *id, addrs.clone(), cfg.queue_len);
            peers.insert(*id, peer);
        }
        let mut snapshots = outbound::Snapshots::new(link.clone(), cfg.peers.clone());
        snapshots.images = cfg.images.clone();
        snapshots.rate = cfg.snapshot_send_rate;
        snapshots.stats = cfg.snapshot_stats.clone();
        let (queue_len, client_tls) = (cfg.queue_len, cfg.client_tls);
        let addrs = cfg.peers;
        let runtime = Some(runtime);
        Ok(Transport { runtime, peers, addrs, snapshots, known, link, queue_len, client_tls })
    }

    /// The membership changed: dial members added (or moved to other URLs) at their peer URLs,
    /// through TLS for `https://` ones, drop those removed, and accept calls only from the
    /// members in `peers`. A URL that cannot be dialed is logged and skipped.
    pub fn set_peer_urls(&mut self, peers: BTreeMap<NodeId, Vec<String>>) {
        let mut dialed = BTreeMap::new();
        for (id, urls) in peers {
            let mut addrs = Vec::new();
            for u in &urls {
                match peer_addrs(u, self.client_tls.as_ref()) {
                    Ok(a) => addrs.extend(a),
                    Err(e) => tracing::warn!(peer = %outbound::hex(id), "peer URL {u}: {e}"),
                }
            }
            dialed.insert(id, addrs);
        }
        self.set_peers(dialed);
    }

    /// [`Transport::set_peer_urls`] with the addresses already resolved.
    pub fn set_peers(&mut self, peers: BTreeMap<NodeId, Vec<PeerAddr>>) {
        let Some(rt) = &self.runtime else { return };
        let same = |a: Option<&Vec<PeerAddr>>, b: Option<&Vec<PeerAddr>>| match (a, b) {
            (Some(a), Some(b)) => a.iter().map(dial_key).eq(b.iter().map(dial_key)),
            _ => false,
        };
        self.peers.retain(|id, _| same(peers.get(id), self.addrs.get(id)));
        self.snapshots.addrs.retain(|id, _| same(peers.get(id), self.addrs.get(id)));
        for (id, addrs) in &peers {
            if !self.peers.contains_key(id) {
                let at: Vec<_> = addrs.iter().map(dial_key).collect();
                tracing::info!(peer = %outbound::hex(*id), ?at, "dialing a new or moved peer");
                self.snapshots.addrs.insert(*id, addrs.clone());
                let peer =
                    outbound::Peer::spawn(rt, &self.link, *id, addrs.clone(), self.queue_len);
                self.peers.insert(*id, peer);
            }
        }
        *self.known.write().unwrap_or_else(|e| e.into_inner()) = peers.keys().copied().collect();
        self.addrs = peers;
    }

    /// Queues messages for their peers, in order per peer, for the transport's thread to
    /// write. Never blocks.
    pub fn send(&self, msgs: impl IntoIterator<Item = Message>) {
        self.dispatch(msgs, false);
    }

    /// As [`Transport::send`], but a peer's batch is written on the caller's thread when
    /// nothing is queued for that peer (see `direct.rs`): no hand-off to the transport's thread
    /// on the way out, for the messages a round waits for. The write never blocks; what the
    /// socket does not take at once is queued.
    pub fn send_now(&self, msgs: impl IntoIterator<Item = Message>) {
        self.dispatch(msgs, true);
    }

    fn dispatch(&self, msgs: impl IntoIterator<Item = Message>, now: bool) {
        let Some(rt) = &self.runtime else { return };
        // Gathered per peer, so that each peer's share goes out in one write.
        let mut batches: Vec<(NodeId, Vec<Message>)> = Vec::new();
        for msg in msgs {
            if matches!(msg.body, MessageBody::Snapshot { .. }) {
                self.snapshots.send(rt, msg);
            } else if let Some((_, b)) = batches.iter_mut().find(|(to, _)| *to == msg.to) {
                b.push(msg);
            } else {
                batches.push((msg.to, vec![msg]));
            }
        }
        for (to, batch) in batches {
            if let Some(peer) = self.peers.get(&to) {
                peer.send(batch, now);
            }
        }
    }
}

/// What tells one way of dialing a peer from another: the address, and the name its
/// certificate must hold (none for plain TCP).
fn dial_key(p: &PeerAddr) -> (SocketAddr, Option<String>) {
    (p.addr, p.tls.as_ref().map(|(name, _)| name.to_str().into_owned()))
}

impl Drop for Transport {
    fn drop(&mut self) {
        let Some(rt) = self.runtime.take() else { return };
        if tokio::runtime::Handle::try_current().is_ok() {
            // Waiting is not allowed inside an async context; dropping the runtime would panic.
            rt.shutdown_background();
        } else {
            // The engine's driver thread drops its transport when it stops: waiting here for
            // the tasks to be dropped releases what they hold (the engine's shared state, and
            // with it the store's LMDB environment) before `Engine::stop` returns, so the same
            // directory can be opened again at once. A task stuck in a blocking call is not
            // waited for past the bound.
            rt.shutdown_timeout(std::time::Duration::from_secs(5));
        }
    }
}
