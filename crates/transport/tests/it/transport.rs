//! The transport over real loopback sockets: delivery in order, refusal of strangers, garbage on
//! the peer port, a peer that goes away and comes back, and snapshots with their outcome.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use cairn_raft::{LogIndex, Message, MessageBody, NodeId, Snapshot, Term};
use cairn_transport::{Transport, TransportConfig};

use crate::common::*;

const A: NodeId = NodeId(0xa);
const B: NodeId = NodeId(0xb);

/// A transport for `local` in `cluster`, accepting on `l`, knowing `peer` at `addr`.
fn start(
    cluster: u64,
    local: NodeId,
    l: TcpListener,
    peer: NodeId,
    addr: SocketAddr,
) -> (Transport, Receiver<Event>) {
    start_with(config(cluster, local, l, peer, addr))
}

#[test]
fn messages_arrive_in_order_both_ways() {
    let ((la, aa), (lb, ab)) = (listener(), listener());
    let (ta, ra) = start(7, A, la, B, ab);
    let (tb, rb) = start(7, B, lb, A, aa);
    ta.send((1..=500).map(|i| heartbeat(A, B, i)));
    for i in 1..=500 {
        assert_eq!(next_message(&rb), heartbeat(A, B, i));
    }
    tb.send([heartbeat(B, A, 9)]);
    assert_eq!(next_message(&ra), heartbeat(B, A, 9));
}

/// A sends to B, connected (a first heartbeat went through); B's events.
fn connected() -> (Transport, Transport, Receiver<Event>) {
    let ((la, aa), (lb, ab)) = (listener(), listener());
    let (ta, _ra) = start(7, A, la, B, ab);
    let (tb, rb) = start(7, B, lb, A, aa);
    ta.send([heartbeat(A, B, 0)]);
    assert_eq!(next_message(&rb), heartbeat(A, B, 0));
    (ta, tb, rb)
}

/// 300 groups of 1 to 3 `mixed` messages, each group sent by `send` (given its number): all
/// arrive once, whole and in order.
fn bursts(send: impl Fn(&Transport, Vec<Message>, u64)) {
    let (ta, _tb, rb) = connected();
    let mut i = 1;
    for group in 0..300u64 {
        let n = 1 + group % 3;
        send(&ta, (i..i + n).map(|j| mixed(A, B, j)).collect(), group);
        i += n;
    }
    for j in 1..i {
        assert_eq!(next_message(&rb), mixed(A, B, j), "message {j} out of order or lost");
    }
}

#[test]
fn bursts_of_large_appends_arrive_whole_and_in_order() {
    bursts(|t, batch, _| t.send(batch));
}

#[test]
fn a_member_of_another_cluster_is_refused() {
    let ((la, aa), (lb, ab)) = (listener(), listener());
    let (ta, _ra) = start(7, A, la, B, ab);
    let (_tb, rb) = start(8, B, lb, A, aa);
    for i in 0..20 {
        ta.send([heartbeat(A, B, i)]);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(rb.try_iter().all(|e| !matches!(e, Event::Message(_))), "nothing crosses clusters");
}

#[test]
fn garbage_on_the_peer_port_is_dropped_and_peers_still_get_through() {
    let ((la, aa), (lb, ab)) = (listener(), listener());
    let (_tb, rb) = start(7, B, lb, A, aa);
    // Not a cairn peer: an HTTP request, then a frame with a huge length after a valid hello.
    let mut s = TcpStream::connect(ab).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n........").unwrap();
    let mut buf = [0u8; 64];
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.read(&mut buf); // the refusal, or the close
    let mut s = TcpStream::connect(ab).unwrap();
    let mut hello = Vec::new();
    let h = cairn_transport::codec::Hello {
        cluster_id: 7,
        from: A,
        to: B,
        kind: cairn_transport::codec::StreamKind::Messages,
    };
    cairn_transport::codec::encode_hello(&h, &mut hello);
    s.write_all(&hello).unwrap();
    s.write_all(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]).unwrap();
    let _ = s.read(&mut buf);
    // A real peer is served all the same.
    let (ta, _ra) = start(7, A, la, B, ab);
    ta.send([heartbeat(A, B, 1)]);
    assert_eq!(next_message(&rb), heartbeat(A, B, 1));
}

#[test]
fn connections_past_the_cap_on_the_peer_port_are_closed_at_once() {
    let ((_la, aa), (lb, ab)) = (listener(), listener());
    let (_tb, _rb) = start(7, B, lb, A, aa);
    // Strangers that connect and say nothing: each holds its place until the hello timeout.
    let extra = 8;
    let conns: Vec<TcpStream> = (0..cairn_transport::MAX_INBOUND_CONNS + extra)
        .map(|_| TcpStream::connect(ab).unwrap())
        .collect();
    // Those past the cap are closed as soon as they are accepted (EOF); the others stay open
    // until the hello timeout (seconds away), so a look at each after a moment tells them apart.
    std::thread::sleep(Duration::from_millis(500));
    let mut closed = 0;
    for mut c in conns.iter() {
        c.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 8];
        match c.read(&mut buf) {
            Ok(0) => closed += 1,
            Ok(n) => panic!("a stranger was sent {n} bytes"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}"),
        }
    }
    assert_eq!(closed, extra, "exactly the connections past the cap were closed");
    drop(conns);
}

#[test]
fn a_peer_named_by_host_is_looked_up_again_at_each_dial() {
    let ((la, _aa), (lb, ab)) = (listener(), listener());
    let (_tb, rb) = start(7, B, lb, A, la.local_addr().unwrap());
    // At start the name pointed somewhere nothing listens (the peer has since moved); now it
    // names B. Dialing the address from start alone would never reach B.
    let gone = listener().1;
    let mut cfg = cairn_transport::TransportConfig::new(7, A);
    cfg.listeners.push(la.into());
    let old =
        cairn_transport::PeerAddr { addr: gone, host: Some("peer-b.test:2380".into()), tls: None };
    cfg.peers = BTreeMap::from([(B, vec![old])]);
    let asked = Arc::new(Mutex::new(Vec::new()));
    let log = asked.clone();
    cfg.resolver = Some(cairn_transport::Resolver(Arc::new(move |host: &str| {
        log.lock().unwrap().push(host.to_string());
        Ok(vec![ab])
    })));
    let (tx, _ra) = channel();
    let ta = Transport::start(cfg, Arc::new(Collect(Mutex::new(tx)))).unwrap();
    ta.send([heartbeat(A, B, 1)]);
    assert_eq!(next_message(&rb), heartbeat(A, B, 1));
    assert!(asked.lock().unwrap().iter().all(|h| h == "peer-b.test:2380"), "{asked:?}");
}

/// Batches written on the caller's thread (`send_now`) and batches queued for the transport's
/// thread (`send`), interleaved: all arrive once, whole and in order.
#[test]
fn direct_and_queued_batches_keep_their_order() {
    bursts(|t, batch, group| if group % 5 < 3 { t.send_now(batch) } else { t.send(batch) });
}

/// A batch written directly that is larger than the socket takes at once: its rest goes to the
/// transport's thread, and what is sent after it waits its turn.
#[test]
fn the_rest_of_a_large_direct_batch_goes_first() {
    let (ta, _tb, rb) = connected();
    for g in 0..8u64 {
        let i = 1 + g * 4;
        let batch = [append(A, B, i, 8), heartbeat(A, B, i + 1), append(A, B, i + 2, 8)];
        ta.send_now(batch.clone());
        ta.send_now([heartbeat(A, B, i + 3)]);
        for m in batch.into_iter().chain([heartbeat(A, B, i + 3)]) {
            assert_eq!(next_message(&rb), m, "group {g}: out of order or lost");
        }
    }
}

#[test]
fn a_peer_that_goes_away_is_reported_and_reached_again_when_back() {
    goes_away_and_comes_back(|t, m| t.send([m]));
}

#[test]
fn a_peer_written_directly_that_goes_away_is_reported_and_reached_again_when_back() {
    goes_away_and_comes_back(|t, m| t.send_now([m]));
}

fn goes_away_and_comes_back(send: impl Fn(&Transport, Message)) {
    let ((la, aa), (lb, ab)) = (listener(), listener());
    let (ta, ra) = start(7, A, la, B, ab);
    let (tb, rb) = start(7, B, lb, A, aa);
    send(&ta, heartbeat(A, B, 1));
    assert_eq!(next_message(&rb), heartbeat(A, B, 1));
    drop(tb);
    drop(rb);
    // Sends toward the dead peer fail; the transport says so (once) instead of queueing.
    let mut reported = false;
    for i in 0..100 {
        send(&ta, heartbeat(A, B, 100 + i));
        std::thread::sleep(Duration::from_millis(20));
        if ra.try_iter().any(|e| e == Event::Unreachable(B)) {
            reported = true;
            break;
        }
    }
    assert!(reported, "the dead peer was reported unreachable");
    // B comes back on the same address; A reconnects and delivers new messages.
    // The dropped runtime releases the port in the background.
    let lb = (0..100)
        .find_map(|_| {
            TcpListener::bind(ab).ok().or_else(|| {
                std::thread::sleep(Duration::from_millis(20));
                None
            })
        })
        .expect("the old port is free again");
    let (_tb, rb) = start(7, B, lb, A, aa);
    let mut got = None;
    for i in 0..250 {
        send(&ta, heartbeat(A, B, 1000 + i));
        if let Ok(Event::Message(m)) = rb.recv_timeout(Duration::from_millis(20)) {
            got = Some(m);
            break;
        }
    }
    let m = got.expect("delivered after the peer came back");
    assert!(matches!(m.body, MessageBody::Heartbeat { seq, .. } if seq.0 >= 1000));
}

#[test]
fn snapshots_go_on_their_own_connection_and_report_their_outcome() {
    let ((la, aa), (lb, ab)) = (listener(), listener());
    let (ta, ra) = start(7, A, la, B, ab);
    let (_tb, rb) = start(7, B, lb, A, aa);
    let mut snapshot = Snapshot::default();
    snapshot.meta.index = LogIndex(42);
    snapshot.data = Bytes::from(vec![7u8; 3 << 20]);
    let msg = Message { from: A, to: B, term: Term(2), body: MessageBody::Snapshot { snapshot } };
    ta.send([msg.clone(), heartbeat(A, B, 1)]);
    let mut got = Vec::new();
    while got.len() < 2 {
        got.push(next_message(&rb));
    }
    assert!(got.contains(&msg) && got.contains(&heartbeat(A, B, 1)));
    loop {
        match next(&ra) {
            Event::SnapshotSent(to, ok) => {
                assert_eq!((to, ok), (B, true));
                break;
            }
            Event::Unreachable(_) => {}
            e => panic!("unexpected {e:?}"),
        }
    }
    // Toward a peer nobody listens for, the snapshot fails and says so.
    let (lc, _) = listener();
    let (_, dead) = listener();
    let (tc, rc) = start(7, A, lc, B, dead);
    tc.send([msg]);
    loop {
        match next(&rc) {
            Event::SnapshotSent(to, ok) => {
                assert_eq!((to, ok), (B, false));
                break;
            }
            Event::Unreachable(_) => {}
            e => panic!("unexpected {e:?}"),
        }
    }
}

#[test]
fn a_transport_dropped_outside_async_code_has_released_its_sink_when_the_drop_returns() {
    // An engine's driver thread drops its transport when it stops. What the transport's tasks
    // hold (the sink, and through it the engine's store) must be released by then, or the
    // same data directory cannot be opened again at once (LMDB: already open in this process).
    let ((la, aa), (lb, ab)) = (listener(), listener());
    let (tx, _ra) = channel();
    let sink = Arc::new(Collect(Mutex::new(tx)));
    let mut cfg = TransportConfig::new(7, A);
    cfg.listeners.push(la.into());
    cfg.peers = BTreeMap::from([(B, vec![ab.into()])]);
    let ta = Transport::start(cfg, sink.clone()).expect("transport starts");
    let (_tb, rb) = start(7, B, lb, A, aa);
    // Connections both ways, each with tasks of its own.
    ta.send([heartbeat(A, B, 1)]);
    assert_eq!(next_message(&rb), heartbeat(A, B, 1));
    assert!(Arc::strong_count(&sink) > 1, "the transport holds the sink");
    drop(ta);
    assert_eq!(Arc::strong_count(&sink), 1, "the transport's tasks still hold the sink");
}
