//! The etcd Watch service: one task per gRPC stream, owning a [`WatchStream`] of the engine.
//!
//! The task takes the client's requests only when it has no replies waiting, and waits for the
//! client to take each reply before it reads more events, so a client that stops reading stops
//! its stream: it holds at most a few replies, and catches up from the store's history when it
//! reads again. Events are encoded once and the bytes shared by every watcher that sends them
//! (the `wire` Watch service declares events as bytes; same wire format).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_kv::watch::group::WatchReply;
use cairn_kv::watch::{Event, EventKind, WatchSpec};
use cairn_kv::Revision;
use cairn_node::{Engine, WatchStream};
use cairn_proto::mvccpb;
use cairn_proto::wire::etcdserverpb as wpb;
use prost::Message;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Authn, Credentials};
use crate::convert::kv_pb;
use crate::errors::status;
use crate::metrics::{MethodStats, WatchStats, GRPC, WATCH};
use crate::pipe::{pipe, Sender};
use crate::services::Ctx;

/// Requests a stream reads ahead of handling them (see `read_requests`).
const READ_AHEAD: usize = 16 * 1024;

type WatchResponses = Pin<Box<dyn Stream<Item = Result<wpb::WatchResponse, Status>> + Send>>;
type Reply = Box<Result<wpb::WatchResponse, Status>>;

#[tonic::async_trait]
impl wpb::watch_server::Watch for Ctx {
    type WatchStream = WatchResponses;

    async fn watch(
        &self,
        req: Request<Streaming<wpb::WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.check_leader(&req)?;
        let ws = self.engine.watch_stream().map_err(status)?;
        // Replies encoded ahead of the client (`pipe::SLOTS` of them): the rest waits in the
        // engine as history, not here. Boxed, so the slots of an idle stream stay small.
        let (tx, rx) = pipe::<Reply>();
        let who = Box::new((self.authn.clone(), Credentials::of(&req)));
        let stream = Box::new(Served {
            engine: self.engine.clone(),
            who,
            ws,
            requests: req.into_inner(),
            read: VecDeque::new(),
            ended: None,
            outbox: Vec::new(),
            tx,
            watchers: 0,
        });
        let stopping = self.stopping.clone();
        tokio::spawn(stream.serve(self.watch_progress_interval, stopping));
        Ok(Response::new(Box::pin(rx.map(|r| *r))))
    }
}

/// What one turn of a stream's loop saw.
enum Turn {
    Stopping,
    Read(Result<Option<wpb::WatchRequest>, Status>),
    Ready(Result<(), crate::pipe::Closed>),
    Reply(Result<WatchReply, cairn_node::EngineError>),
    Tick,
}

/// How a stream ends, when it ends with a reply.
enum Last {
    Error(Status),
    Stopped,
}

/// One client's stream, served by one task. Everything here is per open stream, and a member
/// may hold thousands of idle ones, so it is kept to what serving needs: the queues are empty
/// (unallocated) while the stream is idle.
struct Served {
    engine: Arc<Engine>,
    /// How callers are identified, and what the stream was opened with (its token, its
    /// client certificate): each create is checked with them.
    who: Box<(Authn, Credentials)>,
    ws: WatchStream,
    requests: Streaming<wpb::WatchRequest>,
    /// Requests read but not yet handled.
    read: VecDeque<wpb::WatchRequest>,
    /// How the client's side ended, once it has: handled after the requests before it. Boxed:
    /// a `Status` is larger than the rest of an idle stream's state together.
    ended: Option<Box<Result<(), Status>>>,
    /// Responses encoded and waiting for room in the channel, last first.
    outbox: Vec<wpb::WatchResponse>,
    tx: Sender<Reply>,
    /// Watchers as last added to the process' gauge (`metrics::WATCH`).
    watchers: u32,
}

impl Served {
    /// Runs the stream until either side ends it.
    ///
    /// Requests are read whenever they arrive, even while the client is not taking replies:
    /// hyper's HTTP/2 closes the whole connection (GOAWAY, ENHANCE_YOUR_CALM) once the small
    /// DATA frames it holds unread exceed half its connection window (`listen.rs` sizes it),
    /// which a client creating thousands of watches at once would reach. They are handled
    /// only while no replies wait, so a client that never reads holds at most `READ_AHEAD`
    /// requests and a few replies.
    async fn serve(
        mut self: Box<Self>,
        interval: Duration,
        mut stopping: tokio::sync::watch::Receiver<bool>,
    ) {
        // Progress notices need a timer only once a watcher asks for them; a zero interval
        // turns them off.
        let mut ticker: Option<tokio::time::Interval> = None;
        WatchStats::add(&WATCH.streams, 1);
        let counts = GRPC.of("etcdserverpb.Watch", "Watch");
        // The loop only decides; the last reply is sent after it, so that the future does not
        // hold the send's state beside the loop's (an idle stream's task is mostly this state).
        let last = loop {
            // Checked here and waited for in the select, rather than pinned as one future for
            // the stream's life: that future was a quarter of an idle stream's task.
            if *stopping.borrow_and_update() {
                break Some(Last::Stopped);
            }
            if let Err(end) = self.handle_read() {
                break end.map(Last::Error);
            }
            if ticker.is_none() && !interval.is_zero() && self.ws.wants_progress_ticks() {
                ticker = Some(progress_ticker(interval).await);
            }
            let has_outbox = !self.outbox.is_empty();
            let reading = self.ended.is_none() && self.read.len() < READ_AHEAD;
            let turn = tokio::select! {
                biased;
                // A closed channel means the server is gone: stop as well.
                changed = stopping.changed() => match changed {
                    Ok(()) => continue,
                    Err(_) => Turn::Stopping,
                },
                msg = self.requests.message(), if reading => Turn::Read(msg),
                ready = self.tx.ready(), if has_outbox => Turn::Ready(ready),
                reply = self.ws.next(), if !has_outbox => Turn::Reply(reply),
                _ = tick(&mut ticker), if self.ws.wants_progress_ticks() => Turn::Tick,
            };
            match turn {
                Turn::Stopping => break Some(Last::Stopped),
                Turn::Read(Ok(Some(req))) => {
                    counts.received();
                    self.read.push_back(req)
                }
                Turn::Read(Ok(None)) => self.ended = Some(Box::new(Ok(()))),
                Turn::Read(Err(e)) => self.ended = Some(Box::new(Err(e))),
                Turn::Ready(ready) => {
                    if ready.and_then(|()| self.hand_over(counts)).is_err() {
                        break None;
                    }
                }
                Turn::Reply(Ok(reply)) => {
                    WATCH.events_sent.fetch_add(reply.events.len() as u64, Ordering::Relaxed);
                    // A reply may cancel watchers (compaction, a refused create).
                    self.recount_watchers();
                    // Replaced, not extended: an idle stream keeps no spare capacity.
                    self.outbox = encode(&self.engine, reply);
                    self.outbox.reverse();
                    // What fits goes now: a turn of the loop only to learn that the pipe has
                    // room would cost a select per reply, with every watcher's event (fan-out).
                    if self.hand_over(counts).is_err() {
                        break None;
                    }
                }
                Turn::Reply(Err(e)) => break Some(Last::Error(status(e))),
                Turn::Tick => self.ws.progress_tick(),
            }
        };
        WatchStats::add(&WATCH.streams, -1);
        WatchStats::add(&WATCH.watchers, -i64::from(self.watchers));
        match last {
            None => {}
            Some(Last::Error(e)) => {
                let _ = self.tx.send(Box::new(Err(e))).await;
            }
            // The server is stopping: end the stream so the graceful shutdown need not wait
            // for a client that never leaves; with etcd's ErrStopped (Unavailable), which
            // clients take as a cue to resume elsewhere or later, as they do when etcd goes
            // away.
            Some(Last::Stopped) => {
                let stopped = Box::new(Err(crate::errors::server_stopped()));
                let _ = tokio::time::timeout(Duration::from_secs(1), self.tx.send(stopped)).await;
            }
        }
    }

    /// Moves replies from the outbox to the pipe while it has room, counting each as sent.
    fn hand_over(&mut self, counts: &MethodStats) -> Result<(), crate::pipe::Closed> {
        let room = self.tx.room()?.min(self.outbox.len());
        for _ in 0..room {
            let reply = self.outbox.pop().expect("counted");
            self.tx.push(Box::new(Ok(reply)))?;
            counts.sent();
        }
        if self.outbox.is_empty() {
            // Replaced, not kept: an idle stream holds no spare capacity.
            self.outbox = Vec::new();
        }
        Ok(())
    }

    /// Brings the process' watcher gauge up to this stream's count.
    fn recount_watchers(&mut self) {
        let now = u32::try_from(self.ws.len()).unwrap_or(u32::MAX);
        if now != self.watchers {
            WatchStats::add(&WATCH.watchers, i64::from(now) - i64::from(self.watchers));
            self.watchers = now;
        }
    }

    /// Handles the next request read, if no replies wait. `Err` once the stream must end:
    /// with the status to send, if the client's side failed.
    fn handle_read(&mut self) -> Result<(), Option<Status>> {
        if self.ws.has_replies() || !self.outbox.is_empty() {
            return Ok(());
        }
        if let Some(req) = self.read.pop_front() {
            handle(&mut self.ws, req, &self.engine, &self.who);
            self.recount_watchers();
            if self.read.is_empty() {
                // An idle stream keeps no queue (requests are rare next to replies).
                self.read = VecDeque::new();
            }
            return Ok(());
        }
        match self.ended.take().map(|e| *e) {
            None => Ok(()),
            // The client closed its side, or the connection failed: etcd ends the stream.
            Some(Ok(())) => Err(None),
            // A request that does not decode fails the stream, as grpc-go fails etcd's.
            Some(Err(e)) => Err(Some(e)),
        }
    }
}

async fn progress_ticker(period: Duration) -> tokio::time::Interval {
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    ticker
}

async fn tick(ticker: &mut Option<tokio::time::Interval>) {
    match ticker {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

fn handle(
    ws: &mut WatchStream,
    req: wpb::WatchRequest,
    engine: &Engine,
    who: &(Authn, Credentials),
) {
    use wpb::watch_request::RequestUnion as R;
    match req.request_union {
        Some(R::CreateRequest(c)) => {
            // etcd checks read on the watched keys at each create, refusing with its error text.
            let allowed = who.0.caller_for(engine, &who.1).and_then(|caller| {
                let Some(caller) = caller else { return Ok(()) };
                let state = engine.auth_state();
                state.check(&caller, &c.key, &c.range_end, cairn_kv::auth::PermType::Read)
            });
            if let Err(e) = allowed {
                ws.refuse(crate::auth::watch_cancel_reason(e));
                return;
            }
            // A refusal is a reply of its own (created and canceled, with etcd's reason).
            let _ = ws.create(spec(c));
        }
        Some(R::CancelRequest(c)) => ws.cancel(c.watch_id),
        Some(R::ProgressRequest(_)) => ws.request_progress(),
        // etcd ignores a request it does not know rather than ending the stream.
        None => {}
    }
}

pub(crate) fn spec(c: wpb::WatchCreateRequest) -> WatchSpec {
    use wpb::watch_create_request::FilterType;
    let has = |f: FilterType| c.filters.contains(&(f as i32));
    WatchSpec {
        no_put: has(FilterType::Noput),
        no_delete: has(FilterType::Nodelete),
        key: Bytes::from(c.key),
        range_end: Bytes::from(c.range_end),
        start_revision: Revision(c.start_revision),
        prev_kv: c.prev_kv,
        progress_notify: c.progress_notify,
        fragment: c.fragment,
        watch_id: c.watch_id,
    }
}

fn encode_event(e: &Event, with_prev: bool) -> Bytes {
    let ev = mvccpb::Event {
        r#type: match e.kind {
            EventKind::Put => mvccpb::event::EventType::Put as i32,
            EventKind::Delete => mvccpb::event::EventType::Delete as i32,
        },
        kv: Some(kv_pb(e.kv.clone())),
        // etcd never sends a prev_kv with a creation.
        prev_kv: if with_prev && !e.is_create() { e.prev_kv.clone().map(kv_pb) } else { None },
    };
    Bytes::from(ev.encode_to_vec())
}

/// One reply as responses: several when it asked for fragments and is larger than the request
/// limit (etcd's `sendFragments`).
fn encode(engine: &Engine, r: WatchReply) -> Vec<wpb::WatchResponse> {
    let events: Vec<Bytes> = r.events.iter().map(|e| e.wire(r.prev_kv, encode_event)).collect();
    let h = crate::services::header(engine).at(r.revision).unwrap_or_default();
    let base = wpb::WatchResponse {
        header: Some(wpb::ResponseHeader {
            cluster_id: h.cluster_id,
            member_id: h.member_id,
            revision: h.revision,
            raft_term: h.raft_term,
        }),
        watch_id: r.watch_id,
        created: r.created,
        canceled: r.canceled,
        compact_revision: r.compact_revision.0,
        cancel_reason: r.cancel_reason.to_string(),
        fragment: false,
        events: Vec::new(),
    };
    // etcd's threshold: the request limit plus gRPC's overhead allowance (v3rpc's
    // `grpcOverheadBytes`), the most a client accepts by default.
    let limit = engine.config().max_request_bytes + 512 * 1024;
    let field = |e: &Bytes| 1 + prost::length_delimiter_len(e.len()) + e.len();
    let total = base.encoded_len() + events.iter().map(field).sum::<usize>();
    if !r.fragment || total < limit || events.len() < 2 {
        return vec![wpb::WatchResponse { events, ..base }];
    }
    // Fragments: as many events as fit under the limit, at least one each.
    let mut out = Vec::new();
    let mut cur: Vec<Bytes> = Vec::new();
    let mut size = base.encoded_len() + 2;
    for e in events {
        if !cur.is_empty() && size + field(&e) >= limit {
            out.push(wpb::WatchResponse {
                events: std::mem::take(&mut cur),
                fragment: true,
                ..base.clone()
            });
            size = base.encoded_len() + 2;
        }
        size += field(&e);
        cur.push(e);
    }
    out.push(wpb::WatchResponse { events: cur, fragment: false, ..base });
    out
}

/// Parses a Go duration as etcd's flags take them ("10m", "500ms", "1m30s").
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?}: not a duration (examples: 10m, 5s, 500ms)");
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = s;
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let n: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let secs = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += Duration::try_from_secs_f64(n * secs).map_err(|_| bad())?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}
