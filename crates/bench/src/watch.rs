//! Workloads on watch streams: latency, fan-out, and idle watchers.
//!
//! Watchers share streams as clients share them (etcd's clientv3 puts the watches of one
//! context on one stream): `--streams` streams, spread over the `--conns` connections, each
//! carrying its share of the watchers.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_proto::etcdserverpb as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::report::Tally;
use crate::target::{status_err, Grpc, Target};
use crate::{key, procfs, BenchArgs, Extra, Outcome};

/// The prefix the fan-out and latency watchers watch, and the writer writes under.
const PREFIX: &[u8] = b"bench-watch/";
/// Idle watchers each watch one key under this prefix; nothing writes there.
const IDLE_PREFIX: &[u8] = b"bench-idle/";
/// etcd's `clientv3.InvalidWatchID`: the id of a progress reply.
const PROGRESS_ID: i64 = -1;

type Requests = mpsc::Sender<pb::WatchRequest>;
type Responses = tonic::Streaming<pb::WatchResponse>;
type Arrivals = Arc<Mutex<Vec<Option<Instant>>>>;

fn watch_key(prefix: &[u8], i: u64, size: usize) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend(key(i, size));
    k
}

fn on_prefix(prefix: &[u8]) -> pb::WatchCreateRequest {
    pb::WatchCreateRequest {
        key: prefix.to_vec(),
        range_end: cairn_kv::range::prefix_end(prefix).to_vec(),
        ..Default::default()
    }
}

fn on_key(key: Vec<u8>) -> pb::WatchCreateRequest {
    pb::WatchCreateRequest { key, ..Default::default() }
}

fn create(c: pb::WatchCreateRequest) -> pb::WatchRequest {
    pb::WatchRequest { request_union: Some(pb::watch_request::RequestUnion::CreateRequest(c)) }
}

/// Splits `n` watchers over `streams` streams (0: one stream each); no stream is empty.
fn shares(n: usize, streams: usize) -> Vec<usize> {
    let s = if streams == 0 { n } else { streams.min(n) }.max(1);
    (0..s).map(|i| n / s + usize::from(i < n % s)).filter(|k| *k > 0).collect()
}

/// Opens one watch stream on connection `channel % conns` with the given watchers, created one
/// at a time as etcd's clientv3 creates them (it sends the next create once the last is
/// confirmed); returns it once the server confirmed every one, with the time each took.
async fn open_stream(
    conn: &Grpc,
    channel: usize,
    creates: Vec<pb::WatchCreateRequest>,
    timeout: Duration,
) -> Result<(Requests, Responses, Vec<Duration>), String> {
    let n = creates.len();
    let (tx, rx) = mpsc::channel(4);
    let mut creates = creates.into_iter();
    let mut began = Instant::now();
    // Queued before the call: a server may send its response headers only after a request.
    if let Some(c) = creates.next() {
        tx.try_send(create(c)).map_err(|e| e.to_string())?;
    }
    let mut w = pb::watch_client::WatchClient::new(conn.channel(channel));
    let mut stream = w.watch(ReceiverStream::new(rx)).await.map_err(status_err)?.into_inner();
    let deadline = Instant::now() + timeout;
    let mut took = Vec::with_capacity(n);
    while took.len() < n {
        match tokio::time::timeout_at(deadline.into(), stream.next()).await {
            Ok(Some(Ok(r))) if r.canceled => {
                return Err(format!("watch not created: {}", r.cancel_reason));
            }
            Ok(Some(Ok(r))) if r.created => {
                took.push(began.elapsed());
                if let Some(c) = creates.next() {
                    began = Instant::now();
                    tx.send(create(c)).await.map_err(|e| e.to_string())?;
                }
            }
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(s))) => return Err(status_err(s)),
            Ok(None) => return Err("watch stream closed".into()),
            Err(_) => return Err(format!("{} of {n} watchers created in {timeout:?}", took.len())),
        }
    }
    Ok((tx, stream, took))
}

/// Counts events on a stream until `want` arrive or the deadline passes; records arrival
/// times per key number if `arrivals` is given. Returns the count and when the last arrived.
async fn count_events(
    mut stream: Responses,
    want: u64,
    deadline: Instant,
    arrivals: Option<Arrivals>,
) -> (u64, Option<Instant>) {
    let (mut seen, mut last) = (0, None);
    // One timer for the whole count: a timeout per response registers and clears a timer
    // entry for every event, client work that the fan-out row would count against the server.
    let expiry = tokio::time::sleep_until(deadline.into());
    tokio::pin!(expiry);
    while seen < want {
        let resp = tokio::select! {
            biased;
            r = stream.next() => r,
            () = &mut expiry => None,
        };
        let Some(Ok(resp)) = resp else {
            break;
        };
        let now = Instant::now();
        if !resp.events.is_empty() {
            last = Some(now);
        }
        for ev in resp.events {
            seen += 1;
            if let (Some(arr), Some(kv)) = (&arrivals, ev.kv) {
                let n = std::str::from_utf8(&kv.key[PREFIX.len()..])
                    .ok()
                    .and_then(|s| s.trim_start_matches('0').parse::<usize>().ok())
                    .unwrap_or(0);
                if let Some(slot) = arr.lock().unwrap_or_else(|e| e.into_inner()).get_mut(n) {
                    *slot = Some(now);
                }
            }
        }
    }
    (seen, last)
}

/// N watchers on one prefix over `streams` streams, one writer making sequential puts: every
/// watcher must see every put. Reports events delivered per second, from the first put to the
/// last event received.
pub async fn fan_out(conn: &Grpc, a: &BenchArgs, watchers: usize, streams: usize) -> Outcome {
    let mut tally = Tally::new();
    let timeout = Duration::from_secs(a.timeout_secs.max(1));
    let mut opened = Vec::new();
    for (s, k) in shares(watchers, streams).into_iter().enumerate() {
        match open_stream(conn, s, vec![on_prefix(PREFIX); k], timeout).await {
            Ok((tx, stream, _)) => opened.push((tx, stream, k as u64)),
            Err(e) => tally.record(Duration::ZERO, Err(format!("opening watchers: {e}"))),
        }
    }
    let (open_streams, open_watchers) = (opened.len(), opened.iter().map(|o| o.2).sum::<u64>());
    let deadline = Instant::now() + timeout * 6;
    let total = a.total;
    let counters: Vec<_> = opened
        .into_iter()
        .map(|(tx, stream, k)| {
            tokio::spawn(async move {
                let _keep = tx;
                count_events(stream, total * k, deadline, None).await
            })
        })
        .collect();
    let start = Instant::now();
    // The writer is a task on the runtime, as each client of the put rows is (`drive`), not
    // this future, which runs on the thread that called `block_on`: every acknowledgement
    // would cross threads to reach it, and the row would measure that beside the server.
    let (value, key_size, writer) = (vec![b'v'; a.value_size], a.key_size, conn.clone());
    let puts = tokio::spawn(async move {
        let mut tally = Tally::new();
        for i in 0..total {
            let began = Instant::now();
            let r = writer.put(0, watch_key(PREFIX, i, key_size), value.clone()).await;
            tally.record(began.elapsed(), r);
        }
        tally
    });
    tally.merge(crate::merge(vec![puts]).await);
    let elapsed = start.elapsed();
    let expected = total * open_watchers;
    let (mut delivered, mut last) = (0, start);
    let settle = Instant::now() + timeout;
    for c in counters {
        let remaining = settle.saturating_duration_since(Instant::now());
        if let Ok(Ok((n, at))) =
            tokio::time::timeout(remaining.max(Duration::from_millis(1)), c).await
        {
            delivered += n;
            last = last.max(at.unwrap_or(start));
        }
    }
    let delivered = delivered.min(expected);
    if delivered < expected {
        *tally.errors.entry("watch events missing".into()).or_default() += expected - delivered;
    }
    let delivery = last.duration_since(start).as_secs_f64().max(1e-9);
    let extra = Extra::from([
        ("watchers", open_watchers),
        ("streams", open_streams as u64),
        ("events_expected", expected),
        ("events_delivered", delivered),
        ("events_per_sec", (delivered as f64 / delivery) as u64),
        ("delivery_ms", (delivery * 1000.0) as u64),
    ]);
    Ok((tally, elapsed, extra))
}

/// One watcher, one writer making sequential puts: the latency of each is the time from the
/// put's acknowledgement to the watcher receiving its event (0 when the event came first;
/// `events_before_ack` counts those). The time from sending the put, which etcd's own
/// `benchmark watch-latency` measures, is reported beside it.
pub async fn latency(conn: &Grpc, a: &BenchArgs) -> Outcome {
    let timeout = Duration::from_secs(a.timeout_secs.max(1));
    let (tx, stream) = match open_stream(conn, 1, vec![on_prefix(PREFIX)], timeout).await {
        Ok((tx, stream, _)) => (tx, stream),
        Err(e) => {
            let mut tally = Tally::new();
            tally.record(Duration::ZERO, Err(e));
            return Ok((tally, Duration::ZERO, Extra::new()));
        }
    };
    let arrivals = Arc::new(Mutex::new(vec![None; a.total as usize]));
    let deadline = Instant::now() + timeout * 6;
    let counter = tokio::spawn(count_events(stream, a.total, deadline, Some(arrivals.clone())));
    let start = Instant::now();
    let value = vec![b'v'; a.value_size];
    let mut puts = Vec::with_capacity(a.total as usize);
    for i in 0..a.total {
        let sent = Instant::now();
        let r = conn.put(0, watch_key(PREFIX, i, 20), value.clone()).await;
        puts.push((sent, r.map(|()| Instant::now())));
    }
    let _ = counter.await;
    drop(tx);
    let elapsed = start.elapsed();
    let arrivals = arrivals.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let (tally, extra) = latency_tally(puts, arrivals);
    Ok((tally, elapsed, extra))
}

type Put = (Instant, Result<Instant, String>);

fn latency_tally(puts: Vec<Put>, arrivals: Vec<Option<Instant>>) -> (Tally, Extra) {
    let (mut tally, mut from_sent, mut early) = (Tally::new(), Tally::new(), 0);
    for ((sent, ack), arrived) in puts.into_iter().zip(arrivals) {
        match (ack, arrived) {
            (Ok(acked), Some(at)) => {
                early += u64::from(at < acked);
                tally.record(at.saturating_duration_since(acked), Ok(()));
                from_sent.record(at.saturating_duration_since(sent), Ok(()));
            }
            (Err(e), _) => tally.record(Duration::ZERO, Err(e)),
            (Ok(_), None) => tally.record(Duration::ZERO, Err("watch event missing".into())),
        }
    }
    let h = &from_sent.latency_us;
    let extra = Extra::from([
        ("events_before_ack", early),
        ("put_to_event_p50_us", h.value_at_quantile(0.5)),
        ("put_to_event_p99_us", h.value_at_quantile(0.99)),
    ]);
    (tally, extra)
}

/// Idle watchers: `watchers` watchers, each on a key of its own that nothing writes, over
/// `streams` streams. One request is one watcher created (its latency: from sending its create
/// to its confirmation). After `hold_secs` every stream must still answer a
/// progress request; with `--server-pid` the server's RSS growth per watcher is reported,
/// from before the first watcher (connections open) to the end of the hold.
pub async fn idle(
    conn: &Grpc,
    a: &BenchArgs,
    watchers: usize,
    streams: usize,
    hold_secs: u64,
) -> Outcome {
    let timeout = Duration::from_secs(a.timeout_secs.max(1));
    let before = a.server_pid.and_then(procfs::rss_kib);
    let mut tally = Tally::new();
    let start = Instant::now();
    let mut opened = Vec::new();
    for (s, k, creates) in idle_streams(a, watchers, streams) {
        match open_stream(conn, s, creates, timeout).await {
            Ok((tx, stream, took)) => {
                took.into_iter().for_each(|d| tally.record(d, Ok(())));
                opened.push((tx, stream));
            }
            Err(e) => (0..k).for_each(|_| tally.record(Duration::ZERO, Err(e.clone()))),
        }
    }
    let elapsed = start.elapsed();
    tokio::time::sleep(Duration::from_secs(hold_secs)).await;
    let after = a.server_pid.and_then(procfs::rss_kib);
    for (tx, stream) in &mut opened {
        if let Err(e) = progress(tx, stream, timeout).await {
            *tally.errors.entry(format!("after the hold: {e}")).or_default() += 1;
        }
    }
    let mut extra = Extra::from([("watchers", tally.ok), ("streams", opened.len() as u64)]);
    if let (Some(b), Some(f)) = (before, after) {
        extra.insert("idle_rss_before_kib", b);
        extra.insert("idle_rss_after_kib", f);
        extra.insert("bytes_per_watcher", f.saturating_sub(b) * 1024 / tally.ok.max(1));
    }
    Ok((tally, elapsed, extra))
}

/// Watchers per stream for `--idle-watchers`.
pub const IDLE_PER_STREAM: usize = 100;

/// The streams of `watchers` idle watchers over `streams` streams: (stream number, watchers,
/// their creates), each on a key of its own under [`IDLE_PREFIX`].
fn idle_streams(
    a: &BenchArgs,
    watchers: usize,
    streams: usize,
) -> Vec<(usize, usize, Vec<pb::WatchCreateRequest>)> {
    let mut next_key = 0;
    let mut out = Vec::new();
    for (s, k) in shares(watchers, streams).into_iter().enumerate() {
        let creates = (next_key..next_key + k as u64)
            .map(|i| on_key(watch_key(IDLE_PREFIX, i, a.key_size)))
            .collect();
        next_key += k as u64;
        out.push((s, k, creates));
    }
    out
}

/// Opens `watchers` idle watchers over `streams` streams and returns them open (dropping them
/// closes them); an error if any could not be created.
pub async fn open_idle(
    conn: &Grpc,
    a: &BenchArgs,
    watchers: usize,
    streams: usize,
) -> Result<Vec<(Requests, Responses)>, String> {
    let timeout = Duration::from_secs(a.timeout_secs.max(1));
    let mut opened = Vec::new();
    for (s, _, creates) in idle_streams(a, watchers, streams) {
        let (tx, stream, _) = open_stream(conn, s, creates, timeout).await?;
        opened.push((tx, stream));
    }
    Ok(opened)
}

/// Asks a stream for progress and waits for the answer: the stream is still served.
async fn progress(tx: &Requests, stream: &mut Responses, timeout: Duration) -> Result<(), String> {
    let req = pb::watch_request::RequestUnion::ProgressRequest(pb::WatchProgressRequest {});
    tx.send(pb::WatchRequest { request_union: Some(req) }).await.map_err(|e| e.to_string())?;
    let deadline = Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline.into(), stream.next()).await {
            Ok(Some(Ok(r))) if r.watch_id == PROGRESS_ID && !r.created && !r.canceled => {
                return Ok(())
            }
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(s))) => return Err(status_err(s)),
            Ok(None) => return Err("watch stream closed".into()),
            Err(_) => return Err(format!("no progress reply in {timeout:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::shares;

    #[test]
    fn watchers_spread_evenly_over_streams() {
        assert_eq!(shares(10, 0), vec![1; 10]);
        assert_eq!(shares(10, 3), vec![4, 3, 3]);
        assert_eq!(shares(2, 5), vec![1, 1]);
        assert!(shares(0, 5).is_empty());
    }
}
