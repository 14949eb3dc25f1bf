//! Message connections read by the consumer's own thread ([`cairn_transport::MessagePoll`]):
//! the same delivery as through the sink (whole, in order, once), a turn's budget that splits
//! large frames across turns, garbage and misaddressed messages that close only their own
//! connection, and a sleeping consumer woken by its queue's senders.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cairn_raft::{Message, NodeId};
use cairn_transport::codec::{encode_hello, Hello, StreamKind};
use cairn_transport::{MessagePoll, Transport};

use crate::common::*;

const A: NodeId = NodeId(0xa);
const B: NodeId = NodeId(0xb);

/// A consumer thread reading its poll as the driver does: sleeps when nothing is unread, then
/// reads at most `budget` bytes a turn. Stops (and is joined) when dropped.
struct Consumer {
    stop: Arc<AtomicBool>,
    wake: cairn_transport::PollHandle,
    thread: Option<JoinHandle<()>>,
    /// The largest number of bytes one turn read.
    max_turn: Arc<std::sync::atomic::AtomicU64>,
}

impl Consumer {
    fn start(
        mut poll: MessagePoll,
        wake: cairn_transport::PollHandle,
        budget: u64,
    ) -> (Consumer, Receiver<Message>) {
        let (tx, rx) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let max_turn = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (s, m) = (stop.clone(), max_turn.clone());
        let thread = std::thread::spawn(move || {
            let mut out = Vec::new();
            while !s.load(Ordering::SeqCst) {
                if !poll.has_unread() {
                    poll.prepare_sleep();
                    if s.load(Ordering::SeqCst) {
                        break;
                    }
                    poll.sleep(Duration::from_secs(1));
                }
                let read = poll.read(budget, &mut out);
                m.fetch_max(read, Ordering::SeqCst);
                for msg in out.drain(..) {
                    let _ = tx.send(msg);
                }
            }
        });
        (Consumer { stop, wake, thread: Some(thread), max_turn }, rx)
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.wake();
        if let Some(t) = self.thread.take() {
            t.join().expect("the consumer thread ends");
        }
    }
}

/// A sends to B, whose message connections are read by a consumer with `budget`.
fn polled(
    budget: u64,
) -> (Transport, Transport, Consumer, Receiver<Message>, std::net::SocketAddr) {
    let ((la, aa), (lb, ab)) = (listener(), listener());
    let (ta, _ra) = start_with(config(7, A, la, B, ab));
    let (poll, wake) = MessagePoll::new().expect("a poll");
    let mut cfg = config(7, B, lb, A, aa);
    cfg.poll = Some(wake.clone());
    let (tb, _rb) = start_with(cfg);
    let (consumer, rx) = Consumer::start(poll, wake, budget);
    (ta, tb, consumer, rx, ab)
}

fn recv(rx: &Receiver<Message>) -> Message {
    rx.recv_timeout(Duration::from_secs(10)).expect("a message within 10 s")
}

#[test]
fn polled_connections_deliver_bursts_of_large_appends_whole_and_in_order() {
    // A budget far below a 2 MiB append: frames are read across several turns.
    let budget = 64 << 10;
    let (ta, _tb, consumer, rx, _) = polled(budget);
    let mut i = 1;
    for group in 0..200u64 {
        let n = 1 + group % 3;
        let batch: Vec<_> = (i..i + n).map(|j| mixed(A, B, j)).collect();
        if group % 2 == 0 {
            ta.send_now(batch);
        } else {
            ta.send(batch);
        }
        i += n;
    }
    for j in 1..i {
        assert_eq!(recv(&rx), mixed(A, B, j), "message {j} out of order or lost");
    }
    // One read may take a whole chunk past the budget, never much more.
    let max = consumer.max_turn.load(Ordering::SeqCst);
    assert!(max <= budget + (256 << 10), "a turn read {max} bytes with a budget of {budget}");
}

/// A hand-made peer connection from `from` to B, introduced and accepted.
fn introduce(addr: std::net::SocketAddr, from: NodeId) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connects");
    let mut hello = Vec::new();
    encode_hello(&Hello { cluster_id: 7, from, to: B, kind: StreamKind::Messages }, &mut hello);
    s.write_all(&hello).expect("hello written");
    s.set_read_timeout(Some(Duration::from_secs(5))).expect("a timeout");
    let mut reply = [0u8; 64];
    let n = s.read(&mut reply).expect("the reply");
    assert!(n > 0, "accepted");
    s
}

/// Waits for the other end to close `s` (a read returns 0 or fails).
fn closed_by_peer(s: &mut TcpStream) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut buf = [0u8; 64];
    s.set_read_timeout(Some(Duration::from_millis(200))).expect("a timeout");
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            // A read that timed out says nothing: the connection is still open.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn a_polled_connection_sending_garbage_is_closed_and_others_still_get_through() {
    let (ta, _tb, _consumer, rx, ab) = polled(4 << 20);
    ta.send([heartbeat(A, B, 1)]);
    assert_eq!(recv(&rx), heartbeat(A, B, 1));
    // A frame claiming 4 GiB: over the limit, refused before anything is buffered.
    let mut s = introduce(ab, A);
    s.write_all(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]).expect("written");
    assert!(closed_by_peer(&mut s), "the connection sending garbage is closed");
    // A well-formed frame whose message claims to come from someone else.
    let mut s = introduce(ab, A);
    let mut frame = Vec::new();
    cairn_transport::codec::encode_batch(&[heartbeat(NodeId(0xc), B, 2)], &mut frame);
    s.write_all(&frame).expect("written");
    assert!(closed_by_peer(&mut s), "the connection sending another's message is closed");
    ta.send([heartbeat(A, B, 3)]);
    assert_eq!(recv(&rx), heartbeat(A, B, 3), "the real peer's connection still delivers");
    assert!(rx.try_recv().is_err(), "nothing from the closed connections was delivered");
}

#[test]
fn a_sleeping_consumer_is_woken_by_a_sender_and_sleeps_out_its_timeout_otherwise() {
    let (mut poll, wake) = MessagePoll::new().expect("a poll");
    let started = Instant::now();
    poll.prepare_sleep();
    poll.sleep(Duration::from_millis(50));
    assert!(started.elapsed() >= Duration::from_millis(45), "nothing woke it: it slept");
    // Woken after announcing its sleep, before sleeping: the sleep returns at once.
    poll.prepare_sleep();
    wake.wake();
    let started = Instant::now();
    poll.sleep(Duration::from_secs(10));
    assert!(started.elapsed() < Duration::from_secs(5), "the wake was not lost");
    // Woken from another thread while asleep.
    poll.prepare_sleep();
    let waker = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        wake.wake();
    });
    let started = Instant::now();
    poll.sleep(Duration::from_secs(10));
    assert!(started.elapsed() < Duration::from_secs(5), "a sender woke the sleep");
    waker.join().expect("the waker ends");
}

/// B, whose message connections go to a poll that the test reads on its own thread: the poll,
/// what keeps B running, and B's address.
fn b_read_here() -> (MessagePoll, (Transport, std::net::TcpListener), std::net::SocketAddr) {
    let ((la, aa), (lb, ab)) = (listener(), listener());
    let (poll, wake) = MessagePoll::new().expect("a poll");
    let mut cfg = config(7, B, lb, A, aa);
    cfg.poll = Some(wake);
    let (tb, _rb) = start_with(cfg);
    (poll, (tb, la), ab)
}

#[test]
fn a_connection_that_always_has_more_does_not_keep_another_unread() {
    // Read turn by turn on this thread, 64 KiB a turn, so that the order is the poll's alone.
    let (mut poll, _b, ab) = b_read_here();
    let mut busy = introduce(ab, A);
    let mut quiet = introduce(ab, A);
    let mut out = Vec::new();
    // Both connections handed over and registered, nothing to read yet.
    let deadline = Instant::now() + Duration::from_secs(5);
    while poll.connections() < 2 && Instant::now() < deadline {
        poll.read(u64::MAX, &mut out);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(poll.connections(), 2);
    // 8 MiB on the busy connection, more than its socket holds: the writer refills it as fast
    // as it is read. Then one heartbeat on the quiet one.
    let appends = 8u64;
    let mut frames = Vec::new();
    for i in 1..=appends {
        cairn_transport::codec::encode_batch(&[append(A, B, i, 1)], &mut frames);
    }
    let writer = std::thread::spawn(move || {
        busy.write_all(&frames).expect("written");
        busy
    });
    std::thread::sleep(Duration::from_millis(100));
    let mut frame = Vec::new();
    cairn_transport::codec::encode_batch(&[heartbeat(A, B, 99)], &mut frame);
    quiet.write_all(&frame).expect("written");
    std::thread::sleep(Duration::from_millis(50));
    let (mut turns, mut appends_before) = (0, 0);
    loop {
        assert!(turns < 10_000, "the heartbeat never arrived");
        turns += 1;
        poll.read(64 << 10, &mut out);
        let hb = out.iter().position(|m| *m == heartbeat(A, B, 99));
        appends_before += hb.unwrap_or(out.len());
        out.clear();
        if hb.is_some() {
            break;
        }
    }
    assert!(
        turns <= 3 && (appends_before as u64) < appends,
        "the heartbeat waited {turns} turns, behind {appends_before} appends of the busy connection"
    );
    // The rest of the appends, all of them, before the writer can finish.
    let deadline = Instant::now() + Duration::from_secs(10);
    while (appends_before as u64) < appends && Instant::now() < deadline {
        poll.read(u64::MAX, &mut out);
        appends_before += out.drain(..).count();
    }
    assert_eq!(appends_before as u64, appends, "every append arrived");
    let _busy = writer.join().expect("the writer ends");
}

#[test]
fn a_connection_handed_over_while_the_consumer_is_awake_ends_its_next_sleep() {
    let (mut poll, _b, ab) = b_read_here();
    // Handed over while the consumer is busy elsewhere (it has not announced a sleep, so the
    // hand-over does not wake it), then a heartbeat on it.
    let mut s = introduce(ab, A);
    let mut frame = Vec::new();
    cairn_transport::codec::encode_batch(&[heartbeat(A, B, 5)], &mut frame);
    s.write_all(&frame).expect("written");
    std::thread::sleep(Duration::from_millis(100));
    poll.prepare_sleep();
    let started = Instant::now();
    poll.sleep(Duration::from_secs(3));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the sleep ran past the new connection's bytes"
    );
    let mut out = Vec::new();
    poll.read(u64::MAX, &mut out);
    assert_eq!(out, vec![heartbeat(A, B, 5)]);
}

#[test]
fn a_connection_handed_over_after_the_consumer_stopped_is_closed() {
    let (poll, _b, ab) = b_read_here();
    drop(poll);
    let mut s = introduce(ab, A);
    assert!(closed_by_peer(&mut s), "no one would ever read it: it is closed");
}
