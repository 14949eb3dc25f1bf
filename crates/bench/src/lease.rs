//! Lease workloads: grant and revoke, and keepalives on streams.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_proto::etcdserverpb as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::report::Tally;
use crate::target::{status_err, Grpc};
use crate::{BenchArgs, Outcome};

/// The TTL of the leases granted (long enough that none expires during a run).
const TTL_SECS: i64 = 60;

/// Runs `client` for each of `--clients` clients and merges their tallies.
async fn clients<F, Fut>(conn: &Grpc, a: &BenchArgs, client: F) -> Outcome
where
    F: Fn(Grpc, usize, Arc<AtomicU64>, u64) -> Fut,
    Fut: std::future::Future<Output = Tally> + Send + 'static,
{
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..a.clients.max(1))
        .map(|c| tokio::spawn(client(conn.clone(), c, next.clone(), a.total)))
        .collect();
    let tally = crate::merge(tasks).await;
    Ok((tally, start.elapsed(), BTreeMap::new()))
}

/// Each client grants a lease and revokes it, one request in flight; a grant and its revoke
/// are one request (both are Raft writes). A failed grant counts as a failed request.
pub async fn grant_revoke(conn: &Grpc, a: &BenchArgs) -> Outcome {
    clients(conn, a, |conn, client, next, total| async move {
        let mut tally = Tally::new();
        let mut lease = pb::lease_client::LeaseClient::new(conn.channel(client));
        while next.fetch_add(1, Ordering::Relaxed) < total {
            let began = Instant::now();
            let grant = pb::LeaseGrantRequest { ttl: TTL_SECS, id: 0 };
            let r = match lease.lease_grant(grant).await {
                Ok(g) => {
                    let revoke = pb::LeaseRevokeRequest { id: g.into_inner().id };
                    lease.lease_revoke(revoke).await.map(|_| ()).map_err(status_err)
                }
                Err(s) => Err(status_err(s)),
            };
            tally.record(began.elapsed(), r);
        }
        tally
    })
    .await
}

/// Each client grants a lease and sends keepalives on one stream; one keepalive is one request.
pub async fn keepalive(conn: &Grpc, a: &BenchArgs) -> Outcome {
    clients(conn, a, |conn, client, next, total| async move {
        let mut tally = Tally::new();
        let mut lease = pb::lease_client::LeaseClient::new(conn.channel(client));
        let fail = |tally: &mut Tally, e: String| {
            // Every request not yet made fails with the same cause, at once: one at a time,
            // a large --total took minutes to fail after the server went away.
            let made = next.fetch_max(total, Ordering::Relaxed).min(total);
            *tally.errors.entry(e).or_default() += total - made;
        };
        let id = match lease.lease_grant(pb::LeaseGrantRequest { ttl: TTL_SECS, id: 0 }).await {
            Ok(r) => r.into_inner().id,
            Err(s) => {
                fail(&mut tally, status_err(s));
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
                tally.record(Duration::ZERO, Err(status_err(s.clone())));
                fail(&mut tally, status_err(s));
                return tally;
            }
        };
        // A gRPC stream ends at its first error: the request that met it fails, and so does
        // every request this client had still to make (each was counted twice, the send and
        // the answer, one at a time until --total).
        loop {
            let ended = match stream.next().await {
                Some(Ok(_)) => {
                    tally.record(began.elapsed(), Ok(()));
                    None
                }
                Some(Err(s)) => Some(status_err(s)),
                None => Some("keepalive stream closed".to_string()),
            };
            if let Some(e) = ended {
                tally.record(began.elapsed(), Err(e.clone()));
                fail(&mut tally, e);
                break;
            }
            if next.fetch_add(1, Ordering::Relaxed) >= total {
                break;
            }
            began = Instant::now();
            // A send fails only once the call is over; its error is then the stream's next item.
            let _ = tx.send(pb::LeaseKeepAliveRequest { id }).await;
        }
        tally
    })
    .await
}
