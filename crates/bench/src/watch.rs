//! Workloads on streams: watch fan-out, watch latency, lease keepalive.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_proto::etcdserverpb as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::report::Tally;
use crate::target::{Grpc, Target};
use crate::{key, BenchArgs};

type Outcome = Result<(Tally, Duration, BTreeMap<&'static str, u64>), String>;

const PREFIX: &[u8] = b"bench-watch/";

fn watch_key(i: u64, size: usize) -> Vec<u8> {
    let mut k = PREFIX.to_vec();
    k.extend(key(i, size));
    k
}

/// Opens a watch on the bench prefix; returns the event stream once the server confirms it.
async fn open_watch(
    conn: &Grpc,
    client: usize,
) -> Result<(mpsc::Sender<pb::WatchRequest>, tonic::Streaming<pb::WatchResponse>), String> {
    let (tx, rx) = mpsc::channel(4);
    let create = pb::WatchCreateRequest {
        key: PREFIX.to_vec(),
        range_end: cairn_kv::range::prefix_end(PREFIX).to_vec(),
        ..Default::default()
    };
    tx.send(pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)),
    })
    .await
    .map_err(|e| e.to_string())?;
    let mut w = pb::watch_client::WatchClient::new(conn.channel(client));
    let mut stream = w
        .watch(ReceiverStream::new(rx))
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    match stream.next().await {
        Some(Ok(r)) if r.created => Ok((tx, stream)),
        Some(Ok(r)) => Err(format!("watch not created: {}", r.cancel_reason)),
        Some(Err(s)) => Err(format!("{:?}: {}", s.code(), s.message())),
        None => Err("watch stream closed".into()),
    }
}

/// Counts PUT events on a stream until `want` arrive or the deadline passes; records arrival
/// times per key number if `arrivals` is given.
async fn count_events(
    mut stream: tonic::Streaming<pb::WatchResponse>,
    want: u64,
    deadline: Instant,
    arrivals: Option<Arc<Mutex<Vec<Option<Instant>>>>>,
) -> u64 {
    let mut seen = 0;
    while seen < want {
        let Ok(Some(Ok(resp))) = tokio::time::timeout_at(deadline.into(), stream.next()).await
        else {
            break;
        };
        for ev in resp.events {
            seen += 1;
            if let (Some(arr), Some(kv)) = (&arrivals, ev.kv) {
                let n = std::str::from_utf8(&kv.key[PREFIX.len()..])
                    .ok()
                    .and_then(|s| s.trim_start_matches('0').parse::<usize>().ok())
                    .unwrap_or(0);
                if let Some(slot) = arr.lock().unwrap_or_else(|e| e.into_inner()).get_mut(n) {
                    *slot = Some(Instant::now());
                }
            }
        }
    }
    seen
}

/// N watchers on one prefix, one writer: every watcher must see every put.
pub async fn fan_out(conn: &Grpc, a: &BenchArgs, watchers: usize) -> Outcome {
    let mut tally = Tally::new();
    let mut streams = Vec::new();
    for w in 0..watchers {
        match open_watch(conn, w).await {
            Ok(s) => streams.push(s),
            Err(e) => {
                tally.record(Duration::ZERO, Err(e));
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(a.timeout_secs.max(1) * 6);
    let total = a.total;
    let counters: Vec<_> = streams
        .into_iter()
        .map(|(tx, s)| {
            tokio::spawn(async move {
                let _keep = tx;
                count_events(s, total, deadline, None).await
            })
        })
        .collect();
    let start = Instant::now();
    let value = vec![b'v'; a.value_size];
    for i in 0..a.total {
        let began = Instant::now();
        let r = conn.put(0, watch_key(i, a.key_size), value.clone()).await;
        tally.record(began.elapsed(), r);
    }
    let elapsed = start.elapsed();
    let expected = a.total * counters.len() as u64;
    let mut delivered = 0;
    let settle = Instant::now() + Duration::from_secs(a.timeout_secs.max(1));
    for c in counters {
        let remaining = settle.saturating_duration_since(Instant::now());
        if let Ok(Ok(n)) = tokio::time::timeout(remaining.max(Duration::from_millis(1)), c).await {
            delivered += n;
        }
    }
    let delivered = delivered.min(expected);
    if delivered < expected {
        *tally.errors.entry("watch events missing".into()).or_default() += expected - delivered;
    }
    let extra = BTreeMap::from([
        ("watchers", watchers as u64),
        ("events_expected", expected),
        ("events_delivered", delivered),
    ]);
    Ok((tally, elapsed, extra))
}

/// Time from a put's acknowledgement to the watcher receiving its event.
pub async fn latency(conn: &Grpc, a: &BenchArgs) -> Outcome {
    let mut tally = Tally::new();
    let (tx, stream) = match open_watch(conn, 1).await {
        Ok(s) => s,
        Err(e) => {
            tally.record(Duration::ZERO, Err(e));
            return Ok((tally, Duration::ZERO, BTreeMap::new()));
        }
    };
    let arrivals = Arc::new(Mutex::new(vec![None; a.total as usize]));
    let deadline = Instant::now() + Duration::from_secs(a.timeout_secs.max(1) * 6);
    let counter = tokio::spawn(count_events(stream, a.total, deadline, Some(arrivals.clone())));
    let start = Instant::now();
    let value = vec![b'v'; a.value_size];
    let mut acks = Vec::with_capacity(a.total as usize);
    for i in 0..a.total {
        let r = conn.put(0, watch_key(i, 20), value.clone()).await;
        acks.push(r.map(|()| Instant::now()));
    }
    let _ = counter.await;
    drop(tx);
    let elapsed = start.elapsed();
    let arrivals = arrivals.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for (ack, arrived) in acks.into_iter().zip(arrivals) {
        let result = match (ack, arrived) {
            (Ok(acked), Some(at)) => {
                tally.record(at.saturating_duration_since(acked), Ok(()));
                continue;
            }
            (Err(e), _) => Err(e),
            (Ok(_), None) => Err("watch event missing".to_string()),
        };
        tally.record(Duration::ZERO, result);
    }
    Ok((tally, elapsed, BTreeMap::new()))
}

/// Each client grants a lease and sends keepalives on one stream; one keepalive is one request.
pub async fn lease_keepalive(conn: &Grpc, a: &BenchArgs) -> Outcome {
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..a.clients.max(1) {
        let (conn, next, total) = (conn.clone(), next.clone(), a.total);
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::new();
            let mut lease = pb::lease_client::LeaseClient::new(conn.channel(client));
            let fail = |tally: &mut Tally, e: String| {
                // Every request this client would have made fails with the same cause.
                while next.fetch_add(1, Ordering::Relaxed) < total {
                    tally.record(Duration::ZERO, Err(e.clone()));
                }
            };
            let id = match lease.lease_grant(pb::LeaseGrantRequest { ttl: 60, id: 0 }).await {
                Ok(r) => r.into_inner().id,
                Err(s) => {
                    fail(&mut tally, format!("{:?}: {}", s.code(), s.message()));
                    return tally;
                }
            };
            // A server may send its response headers only after the first request, so that one
            // must be queued before the call.
            let (tx, rx) = mpsc::channel(1);
            if next.fetch_add(1, Ordering::Relaxed) >= total {
                return tally;
            }
            let mut began = Instant::now();
            let _ = tx.send(pb::LeaseKeepAliveRequest { id }).await;
            let mut stream = match lease.lease_keep_alive(ReceiverStream::new(rx)).await {
                Ok(s) => s.into_inner(),
                Err(s) => {
                    tally.record(Duration::ZERO, Err(format!("{:?}: {}", s.code(), s.message())));
                    fail(&mut tally, format!("{:?}: {}", s.code(), s.message()));
                    return tally;
                }
            };
            loop {
                let r = match stream.next().await {
                    Some(Ok(_)) => Ok(()),
                    Some(Err(s)) => Err(format!("{:?}: {}", s.code(), s.message())),
                    None => Err("keepalive stream closed".into()),
                };
                tally.record(began.elapsed(), r);
                if next.fetch_add(1, Ordering::Relaxed) >= total {
                    break;
                }
                began = Instant::now();
                if let Err(e) = tx.send(pb::LeaseKeepAliveRequest { id }).await {
                    tally.record(Duration::ZERO, Err(e.to_string()));
                }
            }
            tally
        }));
    }
    let mut tally = Tally::new();
    for t in tasks {
        if let Ok(part) = t.await {
            tally.merge(part);
        }
    }
    Ok((tally, start.elapsed(), BTreeMap::new()))
}
