//! Round-trip probes over loopback sockets: each peer's round trips are timed and kept, a peer
//! that never answers gets none, a peer that leaves is no longer probed, and the probe stream
//! answers members only.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_raft::NodeId;
use cairn_transport::codec::{self, Hello, StreamKind};
use cairn_transport::{PeerTraffic, Transport, TransportConfig};

use crate::common::*;

const A: NodeId = NodeId(0xa);
const B: NodeId = NodeId(0xb);
const C: NodeId = NodeId(0xc);
/// Probes this often in these tests, instead of etcd's 4 s.
const EVERY: Duration = Duration::from_millis(20);

/// A transport for `local` accepting on `l` and probing `peer` at `addr` every [`EVERY`], and
/// where it keeps its round trips.
fn start(
    local: NodeId,
    l: TcpListener,
    peer: NodeId,
    addr: SocketAddr,
) -> (Transport, Receiver<Event>, Arc<PeerTraffic>) {
    let mut cfg = TransportConfig::new(7, local);
    cfg.listeners.push(l.into());
    cfg.peers = BTreeMap::from([(peer, vec![addr.into()])]);
    cfg.probe_interval = EVERY;
    let traffic = cfg.traffic.clone();
    let (t, rx) = start_with(cfg);
    (t, rx, traffic)
}

/// How many round trips to `peer` were kept.
fn probed(traffic: &PeerTraffic, peer: NodeId) -> u64 {
    let trips = traffic.round_trips();
    trips.iter().find(|(id, _)| *id == peer).map_or(0, |(_, h)| h.count)
}

#[test]
fn round_trips_to_each_peer_are_timed_and_kept_in_etcds_buckets() {
    let ((la, aa), (lb, ab)) = (listener(), listener());
    let (_ta, _ra, traffic_a) = start(A, la, B, ab);
    let (_tb, _rb, traffic_b) = start(B, lb, A, aa);
    wait_for("round trips both ways", || probed(&traffic_a, B) >= 3 && probed(&traffic_b, A) >= 3);
    let trips = traffic_a.round_trips();
    assert_eq!(trips.len(), 1, "{trips:?}");
    let (_, h) = &trips[0];
    assert_eq!(h.buckets.len(), 17, "16 bounds and one above");
    assert_eq!(h.buckets[0].0, 0.0001);
    assert_eq!(h.buckets.iter().map(|(_, n)| n).sum::<u64>(), h.count);
    // Loopback: each round trip is well under the probe's 5 s limit, and not nothing.
    assert!(h.sum_seconds > 0.0 && h.sum_seconds < h.count as f64, "{h:?}");
}

#[test]
fn a_peer_that_never_answers_gets_no_round_trip() {
    let (la, _) = listener();
    // Accepts connections (the kernel's backlog does) and never says a word.
    let (silent, at) = listener();
    let (_ta, _ra, traffic) = start(A, la, B, at);
    std::thread::sleep(EVERY * 15);
    assert_eq!(probed(&traffic, B), 0);
    assert!(traffic.round_trips().is_empty());
    drop(silent);
}

#[test]
fn a_peer_that_leaves_the_membership_is_no_longer_probed() {
    let ((la, aa), (lb, ab)) = (listener(), listener());
    let (mut ta, _ra, traffic) = start(A, la, B, ab);
    let (_tb, _rb, _) = start(B, lb, A, aa);
    wait_for("a round trip", || probed(&traffic, B) >= 1);
    ta.set_peers(BTreeMap::new());
    // One probe may have been on its way.
    let left = probed(&traffic, B) + 1;
    std::thread::sleep(EVERY * 10);
    assert!(probed(&traffic, B) <= left, "still probed after leaving");
}

/// Opens a probe stream to `addr` as `from`, and reads the answer to the hello.
fn probe_stream(addr: SocketAddr, from: NodeId) -> (TcpStream, Result<(), String>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    codec::encode_hello(&Hello { cluster_id: 7, from, to: B, kind: StreamKind::Probe }, &mut buf);
    s.write_all(&buf).unwrap();
    let (payload, crc) = read_frame(&mut s);
    let reply = codec::decode_reply(payload.into(), crc).expect("a reply");
    (s, reply)
}

fn read_frame(s: &mut TcpStream) -> (Vec<u8>, u32) {
    let mut header = [0u8; codec::FRAME_HEADER_LEN];
    s.read_exact(&mut header).unwrap();
    let (len, crc) = codec::parse_frame_header(&header, 4096).unwrap();
    let mut payload = vec![0; len as usize];
    s.read_exact(&mut payload).unwrap();
    (payload, crc)
}

#[test]
fn the_probe_stream_echoes_each_probe_to_members_only() {
    let ((_la, aa), (lb, ab)) = (listener(), listener());
    let (_tb, _rb, _) = start(B, lb, A, aa);
    let (mut s, reply) = probe_stream(ab, A);
    assert_eq!(reply, Ok(()));
    for seq in [1, 2, 300, u64::MAX] {
        let mut buf = Vec::new();
        codec::encode_probe(seq, &mut buf);
        s.write_all(&buf).unwrap();
        let (payload, crc) = read_frame(&mut s);
        assert_eq!(codec::decode_probe(payload.into(), crc), Ok(seq));
    }
    // A probe frame larger than a varint ends the stream instead of being read.
    s.write_all(&[64, 0, 0, 0, 0, 0, 0, 0]).unwrap();
    let mut rest = Vec::new();
    assert_eq!(s.read_to_end(&mut rest).map(|_| rest.len()).unwrap_or(0), 0);
    // A member the cluster does not know is refused before any probe.
    let (_, reply) = probe_stream(ab, C);
    let why = reply.expect_err("a stranger is refused");
    assert!(why.contains("is not in cluster"), "{why}");
}

/// Waits up to 10 s for `done`, failing the test with `what` if it never is.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "no {what} within 10 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}
