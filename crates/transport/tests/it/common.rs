//! What the transport tests share: a sink that forwards what the transport delivers to a
//! channel, and small helpers around it.

use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_raft::{HeartbeatSeq, LogIndex, Message, MessageBody, NodeId, Term};
use cairn_transport::{Sink, Transport, TransportConfig};

/// What a transport handed its sink.
#[derive(Debug, PartialEq)]
pub enum Event {
    Message(Message),
    SnapshotSent(NodeId, bool),
    Unreachable(NodeId),
}

pub struct Collect(pub Mutex<Sender<Event>>);

impl Sink for Collect {
    fn message(&self, msg: Message) {
        let _ = self.0.lock().expect("sink lock").send(Event::Message(msg));
    }
    fn snapshot_sent(&self, to: NodeId, delivered: bool) {
        let _ = self.0.lock().expect("sink lock").send(Event::SnapshotSent(to, delivered));
    }
    fn unreachable(&self, to: NodeId) {
        let _ = self.0.lock().expect("sink lock").send(Event::Unreachable(to));
    }
}

/// Starts a transport with `cfg`, its events on the returned channel.
pub fn start_with(cfg: TransportConfig) -> (Transport, Receiver<Event>) {
    let (tx, rx) = channel();
    let t = Transport::start(cfg, Arc::new(Collect(Mutex::new(tx)))).expect("transport starts");
    (t, rx)
}

pub fn heartbeat(from: NodeId, to: NodeId, seq: u64) -> Message {
    let body = MessageBody::Heartbeat { commit: LogIndex(seq), seq: HeartbeatSeq(seq) };
    Message { from, to, term: Term(1), body }
}

/// A listener on a free loopback port, and its address.
pub fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let a = l.local_addr().expect("a bound port");
    (l, a)
}

pub fn next(rx: &Receiver<Event>) -> Event {
    rx.recv_timeout(Duration::from_secs(5)).expect("an event within 5 s")
}

/// The next message event, skipping unreachable reports from start-up races.
pub fn next_message(rx: &Receiver<Event>) -> Message {
    loop {
        match next(rx) {
            Event::Message(m) => return m,
            Event::Unreachable(_) => continue,
            e => panic!("expected a message, got {e:?}"),
        }
    }
}
