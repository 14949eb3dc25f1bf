//! The etcd Watch service: one task per gRPC stream, owning a [`WatchStream`] of the engine.
//!
//! The task takes the client's requests only when it has no replies waiting, and waits for the
//! client to take each reply before it reads more events, so a client that stops reading stops
//! its stream: it holds at most a few replies, and catches up from the store's history when it
//! reads again. Events are encoded once and the bytes shared by every watcher that sends them
//! (the `wire` Watch service declares events as bytes; same wire format).

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use cairn_kv::watch::group::WatchReply;
use cairn_kv::watch::{Event, EventKind, WatchSpec};
use cairn_kv::Revision;
use cairn_node::WatchStream;
use cairn_proto::mvccpb;
use cairn_proto::wire::etcdserverpb as wpb;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::convert::kv_pb;
use crate::errors::status;
use crate::services::Ctx;

/// Replies encoded ahead of the client: the rest waits in the engine as history, not here.
const SEND_AHEAD: usize = 4;

type WatchResponses = Pin<Box<dyn Stream<Item = Result<wpb::WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl wpb::watch_server::Watch for Ctx {
    type WatchStream = WatchResponses;

    async fn watch(
        &self,
        req: Request<Streaming<wpb::WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.check_leader(&req)?;
        let stream = self.engine.watch_stream().map_err(status)?;
        let (tx, rx) = mpsc::channel(SEND_AHEAD);
        tokio::spawn(serve(self.clone(), stream, req.into_inner(), Replies(tx)));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx).map(|r| *r))))
    }
}

/// The replies of one stream on their way to the client. Boxed in the queue, as requests are
/// (`streams::ReadAhead`): every idle stream holds its channel's first block of slots.
struct Replies(mpsc::Sender<Box<Result<wpb::WatchResponse, Status>>>);

impl Replies {
    async fn send(&self, r: Result<wpb::WatchResponse, Status>) -> Result<(), ()> {
        self.0.send(Box::new(r)).await.map_err(drop)
    }
}

/// Runs one client's stream until either side ends it.
async fn serve(ctx: Ctx, mut ws: WatchStream, requests: Streaming<wpb::WatchRequest>, tx: Replies) {
    let mut requests = crate::streams::read_ahead(requests);
    // A zero interval turns the notices off (tokio's interval refuses zero).
    let period = Some(ctx.watch_progress_interval)
        .filter(|d| !d.is_zero())
        .unwrap_or(Duration::from_secs(365 * 24 * 3600));
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let stopping = crate::streams::stopped(ctx.stopping.clone());
    tokio::pin!(stopping);
    loop {
        tokio::select! {
            biased;
            // The server is stopping: end the stream so the graceful shutdown need not wait for
            // a client that never leaves; with etcd's ErrStopped (Unavailable), which clients
            // take as a cue to resume elsewhere or later, as they do when etcd goes away.
            () = &mut stopping => {
                let stopped = Err(crate::errors::server_stopped());
                let _ = tokio::time::timeout(Duration::from_secs(1), tx.send(stopped)).await;
                return;
            }
            req = requests.recv(), if !ws.has_replies() => match req {
                Some(Ok(req)) => handle(&mut ws, req),
                // The client closed its side, or the connection failed: etcd ends the stream.
                None => return,
                Some(Err(e)) => {
                    // A request that does not decode fails the stream, as grpc-go fails etcd's.
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            },
            reply = ws.next() => match reply {
                Ok(reply) => {
                    for resp in encode(&ctx, reply) {
                        if tx.send(Ok(resp)).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(status(e))).await;
                    return;
                }
            },
            _ = ticker.tick(), if ws.wants_progress_ticks() => ws.progress_tick(),
        }
    }
}

fn handle(ws: &mut WatchStream, req: wpb::WatchRequest) {
    use wpb::watch_request::RequestUnion as R;
    match req.request_union {
        Some(R::CreateRequest(c)) => {
            // A refusal is a reply of its own (created and canceled, with etcd's reason).
            let _ = ws.create(spec(c));
        }
        Some(R::CancelRequest(c)) => ws.cancel(c.watch_id),
        Some(R::ProgressRequest(_)) => ws.request_progress(),
        // etcd ignores a request it does not know rather than ending the stream.
        None => {}
    }
}

fn spec(c: wpb::WatchCreateRequest) -> WatchSpec {
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
fn encode(ctx: &Ctx, r: WatchReply) -> Vec<wpb::WatchResponse> {
    let events: Vec<Bytes> = r.events.iter().map(|e| e.wire(r.prev_kv, encode_event)).collect();
    let h = ctx.header().at(r.revision).unwrap_or_default();
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
    let limit = ctx.engine.config().max_request_bytes + 512 * 1024;
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
