//! What the transport tests share: a sink that forwards what the transport delivers to a
//! channel, and small helpers around it.

use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use cairn_raft::{Entry, EntryPayload, HeartbeatSeq, LogIndex, Message, MessageBody, NodeId, Term};
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

/// The configuration of a transport for `local` in `cluster`, accepting on `l`, knowing `peer`
/// at `addr`.
pub fn config(
    cluster: u64,
    local: NodeId,
    l: TcpListener,
    peer: NodeId,
    addr: SocketAddr,
) -> TransportConfig {
    let mut cfg = TransportConfig::new(cluster, local);
    cfg.listeners.push(l.into());
    cfg.peers = std::collections::BTreeMap::from([(peer, vec![addr.into()])]);
    cfg
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

/// Every seventh message is an append of 2 MiB: a burst of them would make one frame beyond
/// what the receiver accepts if frames were not closed by size.
pub fn mixed(from: NodeId, to: NodeId, i: u64) -> Message {
    if i.is_multiple_of(7) {
        append(from, to, i, 2)
    } else {
        heartbeat(from, to, i)
    }
}

/// An append of `mib` MiB.
pub fn append(from: NodeId, to: NodeId, i: u64, mib: usize) -> Message {
    let data = Bytes::from(vec![(i % 251) as u8; mib << 20]);
    let entry = Entry { term: Term(1), index: LogIndex(i), payload: EntryPayload::Normal(data) };
    let (prev_index, prev_term, commit) = (LogIndex(i - 1), Term(1), LogIndex(i));
    let body = MessageBody::Append { prev_index, prev_term, entries: vec![entry], commit };
    Message { from, to, term: Term(1), body }
}
