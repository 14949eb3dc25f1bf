//! Round-trip probes: every few seconds a member sends each peer a tiny frame that the peer
//! answers at once, and times it (etcd's `etcd_network_peer_round_trip_time_seconds`, which
//! its dashboards plot beside the WAL's fsync to tell a slow network from a slow disk).
//!
//! Probes go over a connection of their own, as etcd's prober uses a request of its own: on the
//! message connection a probe would wait behind a burst of appends and time the queue, and its
//! answer would have to share the receiver's hand-over to the core. The time includes the
//! network and the peer's transport runtime, which is what a Raft message also crosses.
//!
//! A peer that cannot be dialed, or does not answer in time, gets no observation (etcd observes
//! nothing for a failed probe either); the message writer already logs a peer that is down. A
//! peer of an older version refuses the probe stream kind, and simply has no round trips.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_raft::NodeId;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::time::{timeout, MissedTickBehavior};

use crate::codec::{self, StreamKind};
use crate::outbound::{dial, hex, Conn, DialError, Link};
use crate::{PeerAddr, PeerBytes};

/// How often each peer is probed: etcd's `proberInterval` (its connection read timeout, 5 s,
/// less one second).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(4);
/// A probe not answered by then is given up, and its connection with it.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest probe frame accepted: a varint.
pub(crate) const MAX_PROBE_LEN: u32 = 10;

/// Probes `to` every `interval`, recording each answered probe's round trip in `stats`, until
/// the task is aborted (the peer left the membership or the transport stopped).
pub(crate) async fn run(
    link: Link,
    to: NodeId,
    addrs: Vec<PeerAddr>,
    interval: Duration,
    stats: Arc<PeerBytes>,
) {
    let mut ticker = tokio::time::interval(interval);
    // A stall (a paused process) is followed by one probe, not a burst of them.
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut conn: Option<Conn> = None;
    let mut seq = 0u64;
    loop {
        ticker.tick().await;
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match dial(&link, to, &addrs, StreamKind::Probe).await {
                Ok(c) => conn.insert(c),
                Err(e) => {
                    tracing::debug!(peer = %hex(to), "cannot probe peer: {e}");
                    continue;
                }
            },
        };
        seq += 1;
        let timed = match c {
            Conn::Plain(c) => probe(c, seq).await,
            Conn::Tls(c) => probe(&mut **c, seq).await,
        };
        match timed {
            Ok(rtt) => stats.rtt.observe(rtt),
            Err(e) => {
                tracing::debug!(peer = %hex(to), "probe of peer failed: {e}");
                conn = None;
            }
        }
    }
}

/// Sends probe `seq` and waits for its answer.
async fn probe<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut S,
    seq: u64,
) -> Result<Duration, DialError> {
    let mut buf = Vec::with_capacity(16);
    codec::encode_probe(seq, &mut buf);
    let started = Instant::now();
    conn.write_all(&buf).await?;
    // rustls may hold the record until flushed; a no-op on a bare socket.
    conn.flush().await?;
    let answer = timeout(ANSWER_TIMEOUT, read_probe(conn)).await.map_err(|_| DialError::Timeout)?;
    let rtt = started.elapsed();
    match answer? {
        Some(got) if got == seq => Ok(rtt),
        Some(got) => Err(DialError::WrongProbe { sent: seq, got }),
        None => Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into()),
    }
}

/// Reads one probe frame; `None` when the other end hung up between frames.
pub(crate) async fn read_probe<S: AsyncRead + Unpin>(
    conn: &mut S,
) -> Result<Option<u64>, DialError> {
    match crate::frame_io::read_payload::<_, DialError>(conn, MAX_PROBE_LEN).await? {
        Some((payload, crc)) => Ok(Some(codec::decode_probe(payload, crc)?)),
        None => Ok(None),
    }
}

/// Answers each probe on an accepted probe connection with the same frame, at once, until the
/// caller hangs up.
pub(crate) async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    mut conn: S,
) -> Result<(), DialError> {
    let mut buf = Vec::with_capacity(16);
    while let Some(seq) = read_probe(&mut conn).await? {
        buf.clear();
        codec::encode_probe(seq, &mut buf);
        conn.write_all(&buf).await?;
        conn.flush().await?;
    }
    Ok(())
}
