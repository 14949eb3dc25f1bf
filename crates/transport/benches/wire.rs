//! The peer transport's wire, measured: framed TCP (the real [`Transport`]) against gRPC
//! bidirectional streaming over tonic, on loopback, carrying the same encoded Raft messages.
//!
//! `cargo bench -p cairn-transport --bench wire [-- pingpong|stream|hol]`; `WIRE_ROUNDS=n`
//! (default 3) runs every measurement n times, alternating which transport goes first, and
//! prints each run and the medians.
//!
//! Both sides of both transports run on tokio runtimes of one worker thread each, as the real
//! transport does, in this one process. The gRPC side mirrors the real one: each member opens a
//! long-lived stream to each peer for its Raft messages (each stream message is one batch, as
//! many messages as were queued, encoded by [`codec::encode_batch`]: the same bytes the framed
//! transport writes), and a snapshot goes on a stream of its own, over the same HTTP/2
//! connection. Its HTTP/2 settings are tonic's defaults.
//!
//! 1. pingpong: A sends B an Append of one 256-byte entry, B answers with an AppendResp from
//!    its sink, A's sink hands it to the main thread, which sends the next; p50 and p99 of the
//!    round trip.
//! 2. stream: A streams 500,000 such Appends to B, at most 3,000 in flight (the queue toward a
//!    peer holds 4,096, and a full queue drops); messages per second, and CPU time of the whole
//!    process (both members and the main thread) per message.
//! 3. hol: A sends B a 16 MiB payload and a heartbeat right after it; how long the heartbeat
//!    takes to arrive (median and worst of 20 tries). "same stream" puts the payload in an
//!    Append on the message stream of both transports; "snapshot path" sends it as a Snapshot,
//!    which the framed transport puts on a TCP connection of its own and gRPC on a stream of
//!    its own in the same connection.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use cairn_raft::{
    ConfState, Entry, EntryPayload, HeartbeatSeq, LogIndex, Message, MessageBody, NodeId, Snapshot,
    SnapshotMeta, Term,
};
use cairn_transport::codec;
use cairn_transport::{Sink, Transport, TransportConfig};
use tokio::runtime::Runtime;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{http, BoxFuture};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Status, Streaming};

const A: NodeId = NodeId(0xa);
const B: NodeId = NodeId(0xb);
const ENTRY_BYTES: usize = 256;
const PINGS: usize = 20_000;
const PING_WARMUP: usize = 1_000;
const STREAM_MSGS: u64 = 500_000;
/// The receiver reports every CHUNK messages; the sender keeps IN_FLIGHT chunks outstanding.
const CHUNK: u64 = 1_000;
const IN_FLIGHT: u64 = 3;
const BIG: usize = 16 << 20;
const HOL_REPS: usize = 20;
/// As the real transport: its per-peer queue and its largest batch.
const QUEUE_LEN: usize = 4096;
const MAX_BATCH: usize = 256;
const MAX_GRPC_MESSAGE: usize = 64 << 20;
const PATH: &str = "/cairn.bench.Wire/Stream";
const WAIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// Messages.

fn append(from: NodeId, to: NodeId, index: u64, data: Bytes) -> Message {
    let entry =
        Entry { term: Term(1), index: LogIndex(index), payload: EntryPayload::Normal(data) };
    let body = MessageBody::Append {
        prev_index: LogIndex(index - 1),
        prev_term: Term(1),
        entries: vec![entry],
        commit: LogIndex(index - 1),
    };
    Message { from, to, term: Term(1), body }
}

fn heartbeat(from: NodeId, to: NodeId, seq: u64) -> Message {
    let body = MessageBody::Heartbeat { commit: LogIndex(seq), seq: HeartbeatSeq(seq) };
    Message { from, to, term: Term(1), body }
}

fn snapshot(from: NodeId, to: NodeId, data: Bytes) -> Message {
    let meta = SnapshotMeta {
        index: LogIndex(1),
        term: Term(1),
        conf_state: ConfState::with_voters([A, B]),
    };
    let body = MessageBody::Snapshot { snapshot: Snapshot { meta, data } };
    Message { from, to, term: Term(1), body }
}

// ---------------------------------------------------------------------------------------------
// Sinks: what the members do with what arrives. The same for both transports.

/// Messages the transport dropped (a full queue, a peer down): must stay 0 for a fair run.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Hands every message, stamped with its arrival, to the main thread.
struct Events(std_mpsc::Sender<(Instant, Message)>);

impl Sink for Events {
    fn message(&self, msg: Message) {
        let _ = self.0.send((Instant::now(), msg));
    }
    fn snapshot_sent(&self, _to: NodeId, _delivered: bool) {}
    fn unreachable(&self, _to: NodeId) {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Answers every Append with an AppendResp, from the transport's thread.
#[derive(Default)]
struct Echo(OnceLock<Weak<dyn Net>>);

impl Sink for Echo {
    fn message(&self, msg: Message) {
        let MessageBody::Append { entries, .. } = &msg.body else { return };
        let index = entries.last().map_or(LogIndex(0), |e| e.index);
        if let Some(net) = self.0.get().and_then(Weak::upgrade) {
            let body = MessageBody::AppendResp { index, reject: None };
            net.send(Message { from: msg.to, to: msg.from, term: msg.term, body });
        }
    }
    fn snapshot_sent(&self, _to: NodeId, _delivered: bool) {}
    fn unreachable(&self, _to: NodeId) {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts messages and tells the main thread of every CHUNK.
struct Counter {
    count: AtomicU64,
    tick: std_mpsc::Sender<()>,
}

impl Sink for Counter {
    fn message(&self, _msg: Message) {
        if (self.count.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(CHUNK) {
            let _ = self.tick.send(());
        }
    }
    fn snapshot_sent(&self, _to: NodeId, _delivered: bool) {}
    fn unreachable(&self, _to: NodeId) {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------------------------
// The two transports behind one face.

/// One member's sending side. Never blocks; routes snapshots as the real transport does.
trait Net: Send + Sync {
    fn send(&self, msg: Message);
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Framed,
    Grpc,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Framed => "framed TCP",
            Kind::Grpc => "gRPC",
        }
    }

    /// Members A and B, connected to each other, handing what they receive to their sinks.
    fn pair(self, sink_a: Arc<dyn Sink>, sink_b: Arc<dyn Sink>) -> (Arc<dyn Net>, Arc<dyn Net>) {
        let (la, addr_a) = listener();
        let (lb, addr_b) = listener();
        match self {
            Kind::Framed => {
                let start = |local, l: TcpListener, peer, addr: SocketAddr, sink| {
                    let mut cfg = TransportConfig::new(1, local);
                    cfg.listeners.push(l.into());
                    cfg.peers = BTreeMap::from([(peer, vec![addr.into()])]);
                    cfg.queue_len = QUEUE_LEN;
                    Arc::new(Framed(Transport::start(cfg, sink).expect("transport starts")))
                };
                (start(A, la, B, addr_b, sink_a), start(B, lb, A, addr_a, sink_b))
            }
            Kind::Grpc => {
                // Both servers first, so neither handshake waits on a server not yet running.
                let a = GrpcNode::serve(A, B, la, sink_a);
                let b = GrpcNode::serve(B, A, lb, sink_b);
                a.connect(addr_b);
                b.connect(addr_a);
                (Arc::new(a), Arc::new(b))
            }
        }
    }
}

fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let addr = l.local_addr().expect("local address");
    (l, addr)
}

struct Framed(Transport);

impl Net for Framed {
    fn send(&self, msg: Message) {
        self.0.send([msg]);
    }
}

/// A member speaking gRPC: a server for what peers send it, and a client stream to its peer.
struct GrpcNode {
    runtime: Option<Runtime>,
    peer: NodeId,
    sink: Arc<dyn Sink>,
    tx: mpsc::Sender<Message>,
    rx: Mutex<Option<mpsc::Receiver<Message>>>,
    channel: Mutex<Option<Channel>>,
}

impl GrpcNode {
    fn serve(local: NodeId, peer: NodeId, l: TcpListener, sink: Arc<dyn Sink>) -> GrpcNode {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("grpc-peer-{:x}", local.0))
            .enable_all()
            .build()
            .expect("runtime");
        l.set_nonblocking(true).expect("nonblocking listener");
        let incoming = {
            let _guard = runtime.enter();
            let l = tokio::net::TcpListener::from_std(l).expect("tokio listener");
            TcpIncoming::from(l).with_nodelay(Some(true))
        };
        let service = WireService { sink: sink.clone() };
        runtime.spawn(Server::builder().add_service(service).serve_with_incoming(incoming));
        let (tx, rx) = mpsc::channel(QUEUE_LEN);
        GrpcNode {
            runtime: Some(runtime),
            peer,
            sink,
            tx,
            rx: Mutex::new(Some(rx)),
            channel: Mutex::new(None),
        }
    }

    /// Dials the peer and opens the long-lived stream for Raft messages.
    fn connect(&self, addr: SocketAddr) {
        let rt = self.runtime.as_ref().expect("running");
        let endpoint = Endpoint::from_shared(format!("http://{addr}")).expect("endpoint");
        let channel = rt.block_on(endpoint.tcp_nodelay(true).connect()).expect("gRPC connect");
        *self.channel.lock().unwrap() = Some(channel.clone());
        let rx = self.rx.lock().unwrap().take().expect("connect once");
        let batches = Batcher { rx, batch: Vec::with_capacity(MAX_BATCH) };
        // It ends when a member is dropped; a failure mid-run shows as a missing delivery.
        rt.spawn(async move {
            let _ = call(channel, batches).await;
        });
    }
}

impl Net for GrpcNode {
    fn send(&self, msg: Message) {
        let Some(rt) = &self.runtime else { return };
        if matches!(msg.body, MessageBody::Snapshot { .. }) {
            let channel = self.channel.lock().unwrap().clone().expect("connected");
            let sink = self.sink.clone();
            let to = msg.to;
            rt.spawn(async move {
                let delivered = call(channel, tokio_stream::once(vec![msg])).await.is_ok();
                sink.snapshot_sent(to, delivered);
            });
        } else if self.tx.try_send(msg).is_err() {
            self.sink.unreachable(self.peer);
        }
    }
}

impl Drop for GrpcNode {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Opens a stream on `channel`, sends `batches` on it, and waits for the peer to end it.
async fn call<S>(channel: Channel, batches: S) -> Result<(), Status>
where
    S: Stream<Item = Vec<Message>> + Send + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_GRPC_MESSAGE);
    grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    let path = http::uri::PathAndQuery::from_static(PATH);
    let mut replies =
        grpc.streaming(tonic::Request::new(batches), path, BatchCodec).await?.into_inner();
    while replies.message().await?.is_some() {}
    Ok(())
}

/// The gRPC writer: whatever is queued (up to MAX_BATCH messages) becomes one stream message,
/// as the framed writer makes it one frame.
struct Batcher {
    rx: mpsc::Receiver<Message>,
    batch: Vec<Message>,
}

impl Stream for Batcher {
    type Item = Vec<Message>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Vec<Message>>> {
        let this = self.get_mut();
        let Some(first) = ready!(this.rx.poll_recv(cx)) else { return Poll::Ready(None) };
        this.batch.push(first);
        while this.batch.len() < MAX_BATCH {
            match this.rx.try_recv() {
                Ok(m) => this.batch.push(m),
                Err(_) => break,
            }
        }
        Poll::Ready(Some(std::mem::replace(&mut this.batch, Vec::with_capacity(MAX_BATCH))))
    }
}

/// A gRPC codec without protobuf: a batch of messages goes out as the framed transport's frame
/// (header, crc32c, payload); a frame comes in as raw bytes, decoded by [`deliver`].
#[derive(Clone, Copy, Debug, Default)]
struct BatchCodec;

impl Codec for BatchCodec {
    type Encode = Vec<Message>;
    type Decode = Bytes;
    type Encoder = BatchEncoder;
    type Decoder = FrameDecoder;

    fn encoder(&mut self) -> BatchEncoder {
        BatchEncoder(Vec::with_capacity(64 << 10))
    }
    fn decoder(&mut self) -> FrameDecoder {
        FrameDecoder
    }
}

struct BatchEncoder(Vec<u8>);

impl Encoder for BatchEncoder {
    type Item = Vec<Message>;
    type Error = Status;

    fn encode(&mut self, batch: Vec<Message>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        self.0.clear();
        codec::encode_batch(&batch, &mut self.0);
        dst.put_slice(&self.0);
        if self.0.capacity() > 4 << 20 {
            self.0 = Vec::with_capacity(64 << 10);
        }
        Ok(())
    }
}

struct FrameDecoder;

impl Decoder for FrameDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// Decodes one frame as the framed transport's reader does, and hands its messages over.
fn deliver(sink: &dyn Sink, frame: &Bytes) -> Result<(), Status> {
    let bad = |e: codec::DecodeError| Status::invalid_argument(e.to_string());
    let header: [u8; codec::FRAME_HEADER_LEN] = frame
        .get(..codec::FRAME_HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(|| Status::invalid_argument("short frame"))?;
    let (_len, crc) = codec::parse_frame_header(&header, u32::MAX).map_err(bad)?;
    for msg in codec::decode_batch(frame.slice(codec::FRAME_HEADER_LEN..), crc).map_err(bad)? {
        sink.message(msg);
    }
    Ok(())
}

/// The server side: one method, a bidirectional stream of frames. What a hand-written tonic
/// service looks like without protoc (tonic-build generates the same).
#[derive(Clone)]
struct WireService {
    sink: Arc<dyn Sink>,
}

impl tonic::server::NamedService for WireService {
    const NAME: &'static str = "cairn.bench.Wire";
}

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for WireService {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        // One method only: every path is the stream.
        let method = StreamMethod { sink: self.sink.clone() };
        Box::pin(async move {
            let mut grpc =
                tonic::server::Grpc::new(BatchCodec).max_decoding_message_size(MAX_GRPC_MESSAGE);
            Ok(grpc.streaming(method, req).await)
        })
    }
}

struct StreamMethod {
    sink: Arc<dyn Sink>,
}

impl tonic::server::StreamingService<Bytes> for StreamMethod {
    type Response = Vec<Message>;
    type ResponseStream = ReceiverStream<Result<Vec<Message>, Status>>;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, Status>;

    fn call(&mut self, req: tonic::Request<Streaming<Bytes>>) -> Self::Future {
        let sink = self.sink.clone();
        Box::pin(async move {
            let mut inbound = req.into_inner();
            // The answer stream carries nothing; it ends when the caller's stream does.
            let (end, replies) = mpsc::channel(1);
            tokio::spawn(async move {
                while let Ok(Some(frame)) = inbound.message().await {
                    if let Err(e) = deliver(&*sink, &frame) {
                        let _ = end.send(Err(e)).await;
                        return;
                    }
                }
            });
            Ok(tonic::Response::new(ReceiverStream::new(replies)))
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Measurements.

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// User and system CPU time of the whole process so far.
#[allow(unsafe_code)]
fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct it is given, which is plain data.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(rc, 0, "getrusage");
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Round-trip latency: (p50, p99) in microseconds.
fn pingpong(kind: Kind) -> (f64, f64) {
    let (tx, rx) = std_mpsc::channel();
    let echo = Arc::new(Echo::default());
    let (a, b) = kind.pair(Arc::new(Events(tx)), echo.clone());
    assert!(echo.0.set(Arc::downgrade(&b)).is_ok());
    let data = Bytes::from(vec![7u8; ENTRY_BYTES]);
    let mut rtts = Vec::with_capacity(PINGS);
    for i in 0..PING_WARMUP + PINGS {
        let t0 = Instant::now();
        a.send(append(A, B, i as u64 + 1, data.clone()));
        let (_, reply) = rx.recv_timeout(WAIT).expect("an answer");
        let rtt = t0.elapsed();
        assert!(matches!(reply.body, MessageBody::AppendResp { .. }));
        if i >= PING_WARMUP {
            rtts.push(rtt);
        }
    }
    drop((a, b));
    rtts.sort();
    (micros(percentile(&rtts, 0.50)), micros(percentile(&rtts, 0.99)))
}

/// Pipelined appends: (messages per second, CPU microseconds per message).
fn stream(kind: Kind) -> (f64, f64) {
    let (tx, ticks) = std_mpsc::channel();
    let counter = Arc::new(Counter { count: AtomicU64::new(0), tick: tx });
    let (quiet, _events) = std_mpsc::channel();
    let (a, b) = kind.pair(Arc::new(Events(quiet)), counter.clone());
    let data = Bytes::from(vec![7u8; ENTRY_BYTES]);
    let mut index = 0u64;
    let mut send_chunk = |net: &dyn Net| {
        for _ in 0..CHUNK {
            index += 1;
            net.send(append(A, B, index, data.clone()));
        }
    };
    // Warm up: connections made, buffers grown.
    send_chunk(&*a);
    ticks.recv_timeout(WAIT).expect("warm-up delivered");

    let chunks = STREAM_MSGS / CHUNK;
    let (cpu0, t0) = (cpu_time(), Instant::now());
    let (mut sent, mut done) = (0, 0);
    while done < chunks {
        while sent < chunks && sent - done < IN_FLIGHT {
            send_chunk(&*a);
            sent += 1;
        }
        ticks.recv_timeout(WAIT).expect("progress");
        done += 1;
    }
    let (elapsed, cpu) = (t0.elapsed(), cpu_time() - cpu0);
    assert_eq!(counter.count.load(Ordering::Relaxed), (chunks + 1) * CHUNK);
    drop((a, b));
    let n = (chunks * CHUNK) as f64;
    (n / elapsed.as_secs_f64(), micros(cpu) / n)
}

/// Head-of-line, in milliseconds: heartbeat wait (median, max) and median 16 MiB delivery.
fn hol(kind: Kind, snapshot_path: bool) -> (f64, f64, f64) {
    let (tx, rx) = std_mpsc::channel();
    let (quiet, _events) = std_mpsc::channel();
    let (a, b) = kind.pair(Arc::new(Events(quiet)), Arc::new(Events(tx)));
    a.send(heartbeat(A, B, 0));
    rx.recv_timeout(WAIT).expect("warm-up heartbeat");
    let data = Bytes::from(vec![7u8; BIG]);
    let (mut waits, mut bigs) = (Vec::new(), Vec::new());
    for rep in 1..=HOL_REPS as u64 {
        let big = if snapshot_path {
            snapshot(A, B, data.clone())
        } else {
            append(A, B, rep, data.clone())
        };
        let t_big = Instant::now();
        a.send(big);
        let t_hb = Instant::now();
        a.send(heartbeat(A, B, rep));
        let (mut hb_at, mut big_at) = (None, None);
        while hb_at.is_none() || big_at.is_none() {
            let (at, m) = rx.recv_timeout(WAIT).expect("delivery");
            match m.body {
                MessageBody::Heartbeat { .. } => hb_at = Some(at),
                _ => big_at = Some(at),
            }
        }
        waits.push(micros(hb_at.unwrap() - t_hb) / 1e3);
        bigs.push(micros(big_at.unwrap() - t_big) / 1e3);
        // Let the snapshot's answer come back and the buffers drain.
        std::thread::sleep(Duration::from_millis(50));
    }
    drop((a, b));
    if std::env::var_os("WIRE_VERBOSE").is_some() {
        println!("    heartbeat waits (ms): {waits:.2?}\n    16 MiB deliveries (ms): {bigs:.2?}");
    }
    let worst = waits.iter().copied().fold(0.0, f64::max);
    (median(waits), worst, median(bigs))
}

#[derive(Default)]
struct Results {
    p50: Vec<f64>,
    p99: Vec<f64>,
    rate: Vec<f64>,
    cpu: Vec<f64>,
    hol_same: Vec<f64>,
    hol_same_max: Vec<f64>,
    hol_same_big: Vec<f64>,
    hol_snap: Vec<f64>,
    hol_snap_max: Vec<f64>,
    hol_snap_big: Vec<f64>,
}

fn main() {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let rounds: usize =
        std::env::var("WIRE_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3).max(1);
    let mut results = [Results::default(), Results::default()];
    println!("loopback, {rounds} rounds; load {}", load());
    for round in 0..rounds {
        // Alternate which transport goes first.
        let order =
            if round % 2 == 0 { [Kind::Framed, Kind::Grpc] } else { [Kind::Grpc, Kind::Framed] };
        println!("round {} (load {})", round + 1, load());
        for kind in order {
            let r = &mut results[kind as usize];
            if wanted("pingpong") {
                let (p50, p99) = pingpong(kind);
                println!("  pingpong {:10}  p50 {p50:7.1} us  p99 {p99:7.1} us", kind.name());
                r.p50.push(p50);
                r.p99.push(p99);
            }
        }
        for kind in order {
            let r = &mut results[kind as usize];
            if wanted("stream") {
                let (rate, cpu) = stream(kind);
                println!("  stream   {:10}  {:9.0} msg/s  {cpu:5.2} us CPU/msg", kind.name(), rate);
                r.rate.push(rate);
                r.cpu.push(cpu);
            }
        }
        for kind in order {
            let r = &mut results[kind as usize];
            if wanted("hol") {
                for (snapshot_path, what) in [(false, "same stream:  "), (true, "snapshot path:")] {
                    let (wait, worst, big) = hol(kind, snapshot_path);
                    println!(
                        "  hol      {:10}  {what} heartbeat waits {wait:7.2} ms (max {worst:6.2}; \
                         16 MiB in {big:6.2} ms)",
                        kind.name()
                    );
                    let [w, m, b] = if snapshot_path {
                        [&mut r.hol_snap, &mut r.hol_snap_max, &mut r.hol_snap_big]
                    } else {
                        [&mut r.hol_same, &mut r.hol_same_max, &mut r.hol_same_big]
                    };
                    w.push(wait);
                    m.push(worst);
                    b.push(big);
                }
            }
        }
    }
    println!("load {}; messages dropped: {}", load(), DROPPED.load(Ordering::Relaxed));
    summary(&results, rounds);
}

/// Prints the medians of every round, framed TCP beside gRPC.
fn summary(results: &[Results; 2], rounds: usize) {
    println!("\nmedians of {rounds} rounds        {:>14} {:>14}", "framed TCP", "gRPC");
    let row = |what: &str, f: &dyn Fn(&Results) -> &Vec<f64>, prec: usize| {
        let [fr, gr] = results;
        if f(fr).is_empty() {
            return;
        }
        let (x, y) = (median(f(fr).clone()), median(f(gr).clone()));
        println!("{what:32} {x:>14.prec$} {y:>14.prec$}");
    };
    row("pingpong p50 (us)", &|r| &r.p50, 1);
    row("pingpong p99 (us)", &|r| &r.p99, 1);
    row("stream (msg/s)", &|r| &r.rate, 0);
    row("stream CPU per message (us)", &|r| &r.cpu, 2);
    row("hol same stream: hb wait (ms)", &|r| &r.hol_same, 2);
    row("hol same stream: hb max (ms)", &|r| &r.hol_same_max, 2);
    row("hol same stream: 16 MiB (ms)", &|r| &r.hol_same_big, 2);
    row("hol snapshot path: hb wait (ms)", &|r| &r.hol_snap, 2);
    row("hol snapshot path: hb max (ms)", &|r| &r.hol_snap_max, 2);
    row("hol snapshot path: 16 MiB (ms)", &|r| &r.hol_snap_big, 2);
}
