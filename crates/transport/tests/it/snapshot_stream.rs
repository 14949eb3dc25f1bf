//! Chunked snapshots: received into a file of the snapshot directory, resumed (not restarted)
//! after the connection is cut halfway, and paced to the send rate while messages flow beside.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_raft::{HeartbeatSeq, LogIndex, Message, MessageBody, NodeId, Snapshot, Term};
use cairn_transport::images::received_image;
use cairn_transport::{SnapshotStats, TransportConfig};

use crate::common::*;

const A: NodeId = NodeId(1);
const B: NodeId = NodeId(2);

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cairn-snapstream-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("a temp dir");
    d
}

fn config(local: NodeId, l: TcpListener, peer: NodeId, addr: SocketAddr) -> TransportConfig {
    let mut cfg = TransportConfig::new(7, local);
    cfg.listeners.push(l.into());
    cfg.peers = BTreeMap::from([(peer, vec![addr.into()])]);
    cfg
}

/// An image of `len` bytes that no two offsets repeat within 251 bytes.
fn image(len: usize) -> Bytes {
    Bytes::from((0..len).map(|i| (i % 251) as u8).collect::<Vec<_>>())
}

fn snapshot_msg(data: Bytes) -> Message {
    let mut snapshot = Snapshot::default();
    snapshot.meta.index = LogIndex(42);
    snapshot.meta.term = Term(2);
    snapshot.data = data;
    Message { from: A, to: B, term: Term(2), body: MessageBody::Snapshot { snapshot } }
}

/// Forwards connections to `to`; the first one to carry `cut` bytes from the caller to `to`
/// (the snapshot's: the messages' carry little) is cut there, both ways.
fn cutting_proxy(to: SocketAddr, cut: usize) -> SocketAddr {
    let (l, addr) = listener();
    let done = Arc::new(AtomicBool::new(false));
    std::thread::spawn(move || {
        for caller in l.incoming() {
            let Ok(caller) = caller else { return };
            let Ok(callee) = TcpStream::connect(to) else { return };
            let (c2, e2) = (caller.try_clone().expect("clone"), callee.try_clone().expect("clone"));
            let done = done.clone();
            std::thread::spawn(move || pump(c2, e2, Some((cut, &done))));
            std::thread::spawn(move || pump(callee, caller, None));
        }
    });
    addr
}

fn pump(mut from: TcpStream, mut to: TcpStream, cut: Option<(usize, &AtomicBool)>) {
    let mut buf = vec![0u8; 64 << 10];
    let mut passed = 0;
    loop {
        let room = match cut {
            Some((cut, done)) if !done.load(Relaxed) => cut - passed,
            _ => buf.len(),
        };
        if room == 0 {
            if let Some((_, done)) = cut {
                done.store(true, Relaxed);
            }
            break;
        }
        let n = match from.read(&mut buf[..room.min(64 << 10)]) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        passed += n;
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Waits for the snapshot at B and for A's report of it.
fn delivered(ra: &Receiver<Event>, rb: &Receiver<Event>) -> Message {
    let deadline = Instant::now() + Duration::from_secs(20);
    let got = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rb.recv_timeout(left).expect("the snapshot arrives in time") {
            Event::Message(m) if matches!(m.body, MessageBody::Snapshot { .. }) => break m,
            _ => {}
        }
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match ra.recv_timeout(left).expect("the sender reports in time") {
            Event::SnapshotSent(to, ok) => break assert_eq!((to, ok), (B, true)),
            Event::Unreachable(_) | Event::Message(_) => {}
        }
    }
    got
}

#[test]
fn a_transfer_cut_halfway_resumes_with_only_the_rest() {
    let dir = temp_dir("resume");
    let ((la, aa), (lb, ab)) = (listener(), listener());
    let len = 6 << 20;
    let proxy = cutting_proxy(ab, 3 << 20);
    let stats = Arc::new(SnapshotStats::default());
    let mut cfg_a = config(A, la, B, proxy);
    cfg_a.snapshot_stats = stats.clone();
    let (ta, ra) = start_with(cfg_a);
    let mut cfg_b = config(B, lb, A, aa);
    cfg_b.snapshot_dir = Some(dir.clone());
    let (_tb, rb) = start_with(cfg_b);
    let data = image(len);
    ta.send([snapshot_msg(data.clone())]);
    let got = delivered(&ra, &rb);
    let MessageBody::Snapshot { snapshot } = got.body else { unreachable!("matched above") };
    assert_eq!(snapshot.meta.index, LogIndex(42));
    let path = received_image(&snapshot.data).expect("the data names the received file");
    assert!(path.starts_with(&dir), "{path:?} is in the snapshot directory");
    assert!(std::fs::read(&path).expect("the received file") == data, "the file is the image");
    let resumed_at = stats.last_resume_offset.load(Relaxed);
    assert_eq!(stats.attempts.load(Relaxed), 2, "one cut, one resumed attempt");
    assert_eq!(stats.resumed.load(Relaxed), 1);
    assert!(resumed_at > (1 << 20) && resumed_at <= 3 << 20, "resumed at {resumed_at}");
    assert_eq!(
        stats.last_attempt_bytes.load(Relaxed),
        len as u64 - resumed_at,
        "the second attempt sent only the rest"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_paced_transfer_keeps_to_its_rate_while_messages_flow_beside_it() {
    let dir = temp_dir("paced");
    let ((la, aa), (lb, ab)) = (listener(), listener());
    let mut cfg_a = config(A, la, B, ab);
    let rate = 1 << 20;
    cfg_a.snapshot_send_rate = rate;
    let (ta, ra) = start_with(cfg_a);
    let mut cfg_b = config(B, lb, A, aa);
    cfg_b.snapshot_dir = Some(dir.clone());
    let (_tb, rb) = start_with(cfg_b);
    let started = Instant::now();
    ta.send([snapshot_msg(image(rate as usize))]);
    // Heartbeats sent during the transfer arrive during it.
    let mut beats = 0;
    let snap = loop {
        let seq = beats + 1;
        let body = MessageBody::Heartbeat { commit: LogIndex(0), seq: HeartbeatSeq(seq) };
        ta.send([Message { from: A, to: B, term: Term(2), body }]);
        match rb.recv_timeout(Duration::from_secs(10)).expect("an event") {
            Event::Message(m) if matches!(m.body, MessageBody::Heartbeat { .. }) => beats += 1,
            Event::Message(m) => break m,
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(700), "1 MiB at 1 MiB/s took {took:?}");
    assert!(beats >= 10, "only {beats} heartbeats went through during the transfer");
    let MessageBody::Snapshot { snapshot } = snap.body else { unreachable!("matched above") };
    assert!(received_image(&snapshot.data).is_some());
    loop {
        let e = ra.recv_timeout(Duration::from_secs(10)).expect("the sender reports");
        if let Event::SnapshotSent(to, ok) = e {
            break assert_eq!((to, ok), (B, true));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A peer cannot make this member install (and then remove) a file of its choosing: a snapshot
/// message whose data is a local handle closes the connection it came on, unseen.
#[test]
fn a_snapshot_naming_a_local_file_is_refused_on_any_stream() {
    use cairn_transport::codec::{encode_batch, encode_hello, Hello, StreamKind, HELLO_LEN};
    let ((lb, ab), (_, nobody)) = (listener(), listener());
    let (_tb, rb) = start_with(config(B, lb, A, nobody));
    let planted =
        std::env::temp_dir().join(format!("cairn-snapstream-victim-{}", std::process::id()));
    std::fs::write(&planted, b"not an image").expect("a file");
    let mut handle = b"CAIRNIF1".to_vec();
    handle.extend_from_slice(planted.to_str().expect("utf-8").as_bytes());
    for kind in [StreamKind::Messages, StreamKind::Snapshot] {
        let mut conn = TcpStream::connect(ab).expect("connect");
        let mut buf = Vec::new();
        encode_hello(&Hello { cluster_id: 7, from: A, to: B, kind }, &mut buf);
        assert_eq!(buf.len(), HELLO_LEN);
        encode_batch(&[snapshot_msg(Bytes::from(handle.clone()))], &mut buf);
        conn.write_all(&buf).expect("write");
        conn.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let mut rest = Vec::new();
        let _ = conn.read_to_end(&mut rest);
    }
    while let Ok(e) = rb.recv_timeout(Duration::from_millis(300)) {
        assert!(matches!(e, Event::Unreachable(_)), "a handle from a peer got through: {e:?}");
    }
    assert!(planted.exists());
    let _ = std::fs::remove_file(&planted);
}
