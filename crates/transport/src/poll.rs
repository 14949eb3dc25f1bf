//! Reading peers' Raft messages on the thread that consumes them.
//!
//! A message read by the transport's thread and queued for the driver costs a thread hand-off
//! before the core sees it: the driver must be woken and scheduled, 15-30 µs on two shared
//! cores, twice in each round of a 1-client put on 3 members (the follower's append, the
//! leader's answer). `direct.rs` removed the same hand-off on the sending side. Here a
//! plain message connection, once its caller has introduced itself and been accepted, is handed
//! over to the [`MessagePoll`] of the thread that takes the messages: that thread waits on its
//! own input queue and on these sockets at once (one epoll set, through mio), and reads frames
//! off a socket itself when it finds it ready. TLS connections stay with the transport's task,
//! where rustls' state lives, and reach the consumer through the [`crate::Sink`].
//!
//! The queue's senders wake the waiting thread through [`PollHandle::wake`], which costs a
//! system call only when the thread is asleep (announced by [`MessagePoll::prepare_sleep`]).
//!
//! Memory is bounded as on the transport's path: a connection buffers about one frame (a
//! frame's size is checked against the limit before it is buffered, and the buffer grows only
//! with the bytes that arrive) and one read, and a turn reads at most about its budget; what a
//! sender writes meanwhile waits in the socket, and TCP pushes back on it.

use std::collections::HashMap;
use std::io::Read;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use cairn_raft::{Message, NodeId};
use mio::{Events, Interest, Poll, Token, Waker};

use crate::codec;
use crate::inbound::{check_message, InboundError};
use crate::outbound::hex;
use crate::PeerBytes;

/// The waker's token; connections count from 1.
const WAKER: Token = Token(0);
/// Bytes one read takes off a socket at most.
const READ_CHUNK: usize = 256 << 10;

/// A plain message connection whose caller was accepted, handed to the consumer's thread.
pub(crate) struct Adopted {
    pub(crate) sock: std::net::TcpStream,
    pub(crate) from: NodeId,
    pub(crate) local: NodeId,
    pub(crate) max_frame_bytes: u32,
    pub(crate) received: Arc<PeerBytes>,
    /// The connection's place among the inbound connections, freed when it closes.
    pub(crate) slot: tokio::sync::OwnedSemaphorePermit,
}

struct Conn {
    sock: mio::net::TcpStream,
    from: NodeId,
    local: NodeId,
    max_frame_bytes: u32,
    received: Arc<PeerBytes>,
    /// Bytes read and not yet decoded: part of one frame, or whole frames.
    buf: BytesMut,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

struct Shared {
    waker: Waker,
    /// The consumer is about to sleep, or sleeping: a sender must wake it.
    sleeping: AtomicBool,
    /// Connections handed over and not yet registered; `None` once the consumer is gone, so
    /// that a connection handed over after it closes at once instead of waiting unread.
    adopted: Mutex<Option<Vec<Adopted>>>,
}

/// Wakes the consumer of a [`MessagePoll`], and hands it connections. Cheap to clone.
#[derive(Clone)]
pub struct PollHandle(Arc<Shared>);

impl std::fmt::Debug for PollHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PollHandle")
    }
}

impl PollHandle {
    /// Call after queuing an input for the consumer: wakes it if it sleeps (or is about to).
    pub fn wake(&self) {
        // Pairs with the fence in `prepare_sleep`: either the consumer sees what was queued
        // before this, or this sees it sleeping.
        fence(Ordering::SeqCst);
        // Loaded first: a sender to a busy consumer only reads the shared line.
        if self.0.sleeping.load(Ordering::SeqCst) && self.0.sleeping.swap(false, Ordering::SeqCst) {
            if let Err(e) = self.0.waker.wake() {
                tracing::error!("waking the Raft thread failed: {e}");
            }
        }
    }

    pub(crate) fn adopt(&self, conn: Adopted) {
        match &mut *self.0.adopted.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(adopted) => adopted.push(conn),
            // The consumer has stopped: dropping the connection tells the peer.
            None => return,
        }
        self.wake();
    }
}

/// The consumer's side: the sockets handed over, and the wait on them and on its queue.
pub struct MessagePoll {
    poll: Poll,
    events: Events,
    conns: HashMap<Token, Conn>,
    next: usize,
    /// Connections that may hold unread bytes: signalled ready, and not read to the end since.
    ready: Vec<Token>,
    /// The last wait gathered the events: the next read need not ask for them again.
    fresh: bool,
    shared: Arc<Shared>,
    scratch: Box<[u8]>,
}

impl Drop for MessagePoll {
    /// Connections handed over from now on are closed at once (see `PollHandle::adopt`).
    fn drop(&mut self) {
        let adopted = self.shared.adopted.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(adopted);
    }
}

impl std::fmt::Debug for MessagePoll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessagePoll").field("conns", &self.conns.len()).finish_non_exhaustive()
    }
}

impl MessagePoll {
    pub fn new() -> std::io::Result<(MessagePoll, PollHandle)> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let shared = Arc::new(Shared {
            waker,
            sleeping: AtomicBool::new(false),
            adopted: Mutex::new(Some(Vec::new())),
        });
        let me = MessagePoll {
            poll,
            events: Events::with_capacity(64),
            conns: HashMap::new(),
            next: 1,
            ready: Vec::new(),
            fresh: false,
            shared: shared.clone(),
            scratch: vec![0; READ_CHUNK].into_boxed_slice(),
        };
        Ok((me, PollHandle(shared)))
    }

    /// Connections being read.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Whether a connection may hold bytes the last read left (its budget ran out): the
    /// consumer must not sleep then.
    pub fn has_unread(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Says the consumer is about to sleep. It must then look at its queue once more, and
    /// [`MessagePoll::sleep`] only if it is empty ([`MessagePoll::awake`] otherwise): an
    /// input queued before this is seen there, one queued after it wakes the sleep.
    pub fn prepare_sleep(&self) {
        self.shared.sleeping.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// The consumer found input after [`MessagePoll::prepare_sleep`] and will not sleep.
    pub fn awake(&self) {
        self.shared.sleeping.store(false, Ordering::SeqCst);
    }

    /// Sleeps until a sender wakes the consumer, a connection has bytes, or `timeout` passes.
    pub fn sleep(&mut self, timeout: Duration) {
        // Connections handed over since the last read: registered now, after the announcement,
        // or bytes on them could not end this sleep (a later hand-over wakes it). Registering
        // one marks it ready, and then the sleep only gathers what else is ready.
        self.register_adopted();
        let timeout = if self.ready.is_empty() { timeout } else { Duration::ZERO };
        self.gather(Some(timeout));
        self.shared.sleeping.store(false, Ordering::SeqCst);
        self.fresh = true;
    }

    /// Looks for connections with bytes, without sleeping: true if any. The next
    /// [`MessagePoll::read`] reads them without asking again.
    pub fn peek(&mut self) -> bool {
        self.register_adopted();
        if !self.conns.is_empty() {
            self.gather(Some(Duration::ZERO));
            self.fresh = true;
        }
        !self.ready.is_empty()
    }

    /// Reads the connections that have bytes, until about `budget` bytes were read, and puts
    /// every message they carry in `out`, in each connection's order. Returns the bytes read.
    pub fn read(&mut self, budget: u64, out: &mut Vec<Message>) -> u64 {
        self.register_adopted();
        // A member without peer connections (a single member) skips the system call.
        if !std::mem::take(&mut self.fresh) && !self.conns.is_empty() {
            self.gather(Some(Duration::ZERO));
        }
        let mut read = 0u64;
        while read < budget {
            let Some(&token) = self.ready.first() else { break };
            let Some(conn) = self.conns.get_mut(&token) else {
                self.ready.remove(0);
                continue;
            };
            match conn.read(&mut self.scratch, budget - read, out) {
                Ok((n, Drained::Yes)) => {
                    read += n;
                    self.ready.remove(0);
                }
                Ok((n, Drained::No)) => {
                    // The budget ran out: this connection goes last, so that one busy sender
                    // (a leader streaming appends) cannot keep the others unread turn after turn.
                    read += n;
                    self.ready.rotate_left(1);
                }
                Err(e) => {
                    // As the transport's reader: a connection that broke or hung up is not news.
                    if !matches!(e, InboundError::Io(_)) {
                        tracing::warn!(from = %hex(conn.from), "closed a peer connection: {e}");
                    }
                    self.close(token);
                    self.ready.remove(0);
                }
            }
        }
        read
    }

    /// Waits for events up to `timeout` and marks the connections they name as ready.
    fn gather(&mut self, timeout: Option<Duration>) {
        if let Err(e) = self.poll.poll(&mut self.events, timeout) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::error!("waiting for peer messages failed: {e}");
                if let Some(t) = timeout {
                    std::thread::sleep(t.min(Duration::from_millis(10)));
                }
            }
            return;
        }
        for event in self.events.iter() {
            let token = event.token();
            if token != WAKER && !self.ready.contains(&token) {
                self.ready.push(token);
            }
        }
    }

    fn register_adopted(&mut self) {
        let adopted = match &mut *self.shared.adopted.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(adopted) if !adopted.is_empty() => std::mem::take(adopted),
            _ => return,
        };
        for a in adopted {
            let token = Token(self.next);
            self.next += 1;
            let mut sock = mio::net::TcpStream::from_std(a.sock);
            if let Err(e) = self.poll.registry().register(&mut sock, token, Interest::READABLE) {
                tracing::warn!(from = %hex(a.from), "closed a peer connection: {e}");
                continue;
            }
            let conn = Conn {
                sock,
                from: a.from,
                local: a.local,
                max_frame_bytes: a.max_frame_bytes,
                received: a.received,
                buf: BytesMut::new(),
                _slot: a.slot,
            };
            self.conns.insert(token, conn);
            // Bytes may have arrived before the registration: read it once to be sure.
            self.ready.push(token);
        }
    }

    fn close(&mut self, token: Token) {
        if let Some(mut conn) = self.conns.remove(&token) {
            let _ = self.poll.registry().deregister(&mut conn.sock);
        }
    }
}

enum Drained {
    /// The socket had nothing more (it will signal again when it has).
    Yes,
    /// The budget ran out first.
    No,
}

impl Conn {
    /// Decodes the frames buffered and reads more, until the socket is drained or `budget`
    /// bytes were read.
    fn read(
        &mut self,
        scratch: &mut [u8],
        budget: u64,
        out: &mut Vec<Message>,
    ) -> Result<(u64, Drained), InboundError> {
        let mut read = 0u64;
        loop {
            self.decode(out)?;
            if read >= budget {
                return Ok((read, Drained::No));
            }
            match self.sock.read(scratch) {
                Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into()),
                Ok(n) => {
                    read += n as u64;
                    self.buf.extend_from_slice(&scratch[..n]);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    return Ok((read, Drained::Yes))
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(InboundError::Io(e)),
            }
        }
    }

    /// Takes every whole frame off the buffer and puts its messages in `out`.
    fn decode(&mut self, out: &mut Vec<Message>) -> Result<(), InboundError> {
        while let Some((payload, crc)) = self.frame()? {
            PeerBytes::add(&self.received.received, codec::FRAME_HEADER_LEN + payload.len());
            let msgs = codec::decode_batch(payload, crc).map_err(InboundError::Protocol)?;
            for msg in msgs {
                check_message(&msg, self.from, self.local)?;
                out.push(msg);
            }
        }
        Ok(())
    }

    /// The next whole frame's payload and checksum, if the buffer holds one.
    fn frame(&mut self) -> Result<Option<(Bytes, u32)>, InboundError> {
        let Some(header) = self.buf.first_chunk::<{ codec::FRAME_HEADER_LEN }>() else {
            return Ok(None);
        };
        let (len, crc) = codec::parse_frame_header(header, self.max_frame_bytes)
            .map_err(InboundError::Protocol)?;
        // Nothing is reserved for what the header claims: the buffer grows with the bytes that
        // arrive, so a stranger's headers claiming 64 MiB each cost nothing.
        let whole = codec::FRAME_HEADER_LEN + len as usize;
        if self.buf.len() < whole {
            return Ok(None);
        }
        self.buf.advance(codec::FRAME_HEADER_LEN);
        let payload = self.buf.split_to(len as usize).freeze();
        // The messages hold slices of the buffer: a large one emptied is let go, so that small
        // entries decoded later do not keep it alive.
        if self.buf.is_empty() && self.buf.capacity() > READ_CHUNK {
            self.buf = BytesMut::new();
        }
        Ok(Some((payload, crc)))
    }
}
