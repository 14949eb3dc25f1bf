//! Writing a peer's messages on the caller's thread when nothing is queued ahead of them.
//!
//! A batch handed to the writer task costs a thread hand-off before it reaches the socket: the
//! transport's thread must be woken and scheduled, which on two shared cores was 15-30 µs of
//! a 1-client put's ~450 µs on 3 members (twice per put: the leader's appends, and each
//! follower's answer). So while a peer's plain connection is up and its queue is empty, the
//! driver writes the batch itself, on a duplicate of the connection's descriptor that never
//! blocks. Order is kept by one rule: the caller writes directly only when no message is queued
//! or being written by the writer task (`queued` counts them until they are written or
//! dropped). A write that the socket takes only in part hands the rest of its bytes to the
//! writer task, as the first thing queued, so nothing overtakes it.
//!
//! TLS connections always go through the writer task: rustls' state lives there.

use std::io::Write;
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The writable side of a peer's connection, shared by the writer task and the caller.
#[derive(Debug, Default)]
pub(crate) struct Direct {
    /// Items in the writer's queue or in its hands, not yet written or dropped.
    pub(crate) queued: AtomicUsize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// A duplicate of the current plain connection (non-blocking, as tokio left it); `None`
    /// while the peer is down, dialing, or reached through TLS.
    sock: Option<TcpStream>,
    /// Encoding buffer, kept between batches.
    buf: Vec<u8>,
}

/// What [`Direct::write`] did with a batch.
#[derive(Debug)]
pub(crate) enum Wrote {
    /// Not written: queue the messages for the writer task.
    Queue,
    /// All of it is on the socket (this many bytes).
    All(usize),
    /// The socket took this many bytes; the rest was queued for the writer task.
    Part(usize),
    /// The connection failed; the batch is lost (Raft resends) and the writer will reconnect.
    Failed(std::io::Error),
}

impl Direct {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The writer task connected: later batches may go straight to `conn`'s socket.
    pub(crate) fn attach(&self, conn: &impl AsFd) {
        match conn.as_fd().try_clone_to_owned() {
            Ok(fd) => self.state().sock = Some(TcpStream::from(fd)),
            // Without the duplicate every batch goes through the writer task, as with TLS.
            Err(e) => tracing::debug!("no direct writes to this peer: {e}"),
        }
    }

    /// The connection ended: batches go to the writer task until the next one is attached.
    /// Called before the writer drops what was queued for the old connection, so that no part
    /// of a batch begun on it is left in the queue for the next one.
    pub(crate) fn detach(&self) {
        self.state().sock = None;
    }

    /// Writes the batch `encode` produces straight to the socket if the connection is up and
    /// nothing is queued before it. If the socket takes only part of it, `queue_rest` gets the
    /// rest under the lock, so that it is queued before any other batch can be written or
    /// queued; it returns false if it could not queue it.
    pub(crate) fn write(
        &self,
        encode: impl FnOnce(&mut Vec<u8>),
        queue_rest: impl FnOnce(Vec<u8>) -> bool,
    ) -> Wrote {
        let mut st = self.state();
        if self.queued.load(Ordering::Acquire) != 0 {
            return Wrote::Queue;
        }
        let State { sock, buf } = &mut *st;
        let Some(s) = sock.as_mut() else { return Wrote::Queue };
        buf.clear();
        encode(buf);
        let outcome = match write_some(s, buf) {
            Ok(n) if n == buf.len() => Wrote::All(n),
            Ok(n) if queue_rest(buf[n..].to_vec()) => Wrote::Part(n),
            // Part of a frame is on the wire and the rest cannot follow (the writer task is
            // gone): the connection is unusable.
            Ok(_) => Wrote::Failed(std::io::ErrorKind::BrokenPipe.into()),
            Err(e) => Wrote::Failed(e),
        };
        if let Wrote::Failed(_) = outcome {
            // The writer task notices at its next write, which fails at once, and reconnects.
            if let Some(s) = sock.take() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
        if buf.capacity() > 1 << 20 {
            // A burst of large appends should not pin its buffer.
            *buf = Vec::new();
        }
        outcome
    }
}

/// Writes as much of `buf` as the socket takes without blocking.
fn write_some(sock: &mut TcpStream, buf: &[u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match sock.write(&buf[done..]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (b, _) = l.accept().expect("accept");
        a.set_nonblocking(true).expect("nonblocking");
        (a, b)
    }

    #[test]
    fn writes_only_while_attached_and_nothing_is_queued() {
        let (a, mut b) = pair();
        let d = Direct::default();
        assert!(matches!(d.write(|b| b.extend_from_slice(b"x"), |_| true), Wrote::Queue));
        d.attach(&a);
        d.queued.store(1, Ordering::Release);
        assert!(matches!(d.write(|b| b.extend_from_slice(b"y"), |_| true), Wrote::Queue));
        d.queued.store(0, Ordering::Release);
        assert!(matches!(d.write(|b| b.extend_from_slice(b"abc"), |_| true), Wrote::All(3)));
        let mut got = [0u8; 3];
        b.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"abc");
        d.detach();
        assert!(matches!(d.write(|b| b.extend_from_slice(b"z"), |_| true), Wrote::Queue));
    }

    #[test]
    fn a_full_socket_leaves_the_rest_to_queue_in_order() {
        let (a, mut b) = pair();
        let d = Direct::default();
        d.attach(&a);
        // More than the socket buffers hold while nobody reads.
        let big: Vec<u8> = (0..16 << 20).map(|i| i as u8).collect();
        let mut rest = Vec::new();
        let wrote = d.write(
            |buf| buf.extend_from_slice(&big),
            |r| {
                rest = r;
                true
            },
        );
        let Wrote::Part(written) = wrote else { panic!("expected a partial write, got {wrote:?}") };
        assert!(written > 0 && written < big.len());
        // What was written and the rest make the batch, byte for byte.
        assert_eq!(written + rest.len(), big.len());
        let mut got = vec![0u8; written];
        b.read_exact(&mut got).expect("read");
        assert_eq!(got, big[..written]);
        assert_eq!(rest, big[written..]);
    }

    #[test]
    fn a_rest_that_cannot_be_queued_breaks_the_connection() {
        let (a, _b) = pair();
        let d = Direct::default();
        d.attach(&a);
        let big = vec![7u8; 16 << 20];
        assert!(matches!(d.write(|buf| buf.extend_from_slice(&big), |_| false), Wrote::Failed(_)));
        assert!(matches!(d.write(|b| b.push(1), |_| true), Wrote::Queue));
    }

    #[test]
    fn a_failed_write_detaches() {
        let (a, b) = pair();
        let d = Direct::default();
        d.attach(&a);
        drop(b);
        // The first write may still be taken by the kernel; the reset shows on a later one.
        let mut failed = false;
        for _ in 0..100 {
            match d.write(|buf| buf.extend_from_slice(&[0u8; 4096]), |_| true) {
                Wrote::Failed(_) => {
                    failed = true;
                    break;
                }
                Wrote::Queue => panic!("queued while still attached"),
                _ => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        }
        assert!(failed, "writing to a closed peer never failed");
        assert!(matches!(d.write(|b| b.push(1), |_| true), Wrote::Queue));
    }
}
