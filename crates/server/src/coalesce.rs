//! A client connection's socket, written so that HTTP/2 frames leave together.
//!
//! h2 copies a frame into its write buffer only when the payload is small; a larger payload is
//! kept aside and chained to the buffer, and h2 must write it out before it takes the next
//! frame. Over a socket that supports vectored writes "larger" means more than 256 bytes, which
//! is most watch events: a put seen by ten watchers of one connection left the server as eleven
//! `writev` calls, one per frame, and the client woke for each. Reported as not vectored, the
//! socket gets h2's other threshold (1 KiB), so events and small responses are gathered in h2's
//! buffer and written at once.
//!
//! Not vectored would cost a large frame two writes (its 9-byte header, then its payload), so
//! this type keeps short writes in a buffer of its own and sends them with the next large
//! payload in one `writev`, or at the flush h2 makes after every batch of frames. Nothing stays
//! buffered past a flush, so the socket's latency is unchanged.
//!
//! A connection also yields its thread after every [`FAIR_SHARE`] bytes it writes. Every
//! connection's task runs on the runtime's few threads (one on a 2-core machine), and h2 writes
//! as long as the socket takes bytes: a connection sending a 30 MB range answer copied
//! megabytes into the socket per turn, while a put on another connection waited for its turn
//! behind it. Yielding puts the writer at the back of the queue, so the wait is one share per
//! busy connection.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Writes shorter than this are buffered; longer ones go to the socket with what is buffered.
const SHORT: usize = 4096;
/// The buffer never grows past this: a write that would pass it flushes first.
const BUFFER: usize = 16 << 10;

/// Bytes a connection writes before it lets the other tasks of its thread run.
const FAIR_SHARE: usize = 256 << 10;

/// A socket whose short writes are held until the next long write or flush.
pub(crate) struct Coalesced<T> {
    io: T,
    pending: Vec<u8>,
    /// Bytes of `pending` already written.
    sent: usize,
    /// Bytes written since this connection last yielded its thread.
    since_yield: usize,
    /// The yield under way, once `since_yield` reached [`FAIR_SHARE`].
    yielding: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl<T: std::fmt::Debug> std::fmt::Debug for Coalesced<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalesced")
            .field("io", &self.io)
            .field("unsent", &self.unsent().len())
            .field("since_yield", &self.since_yield)
            .finish()
    }
}

impl<T> Coalesced<T> {
    pub(crate) fn new(io: T) -> Coalesced<T> {
        Coalesced { io, pending: Vec::new(), sent: 0, since_yield: 0, yielding: None }
    }

    /// Ready while this connection is within its share; otherwise yields the thread once
    /// (tokio's `yield_now`: the task goes behind the others that are ready) and then starts
    /// a new share.
    fn poll_fair(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.since_yield < FAIR_SHARE {
            return Poll::Ready(());
        }
        let yielding = self.yielding.get_or_insert_with(|| Box::pin(tokio::task::yield_now()));
        ready!(yielding.as_mut().poll(cx));
        self.yielding = None;
        self.since_yield = 0;
        Poll::Ready(())
    }

    fn unsent(&self) -> &[u8] {
        &self.pending[self.sent..]
    }

    /// Counts `n` bytes written from the front of what is pending; returns how many of them
    /// went past it (into the caller's data).
    fn consume(&mut self, n: usize) -> usize {
        let held = self.pending.len() - self.sent;
        if n < held {
            self.sent += n;
            return 0;
        }
        // Freed, not kept: an idle connection holds no buffer (h2 keeps its own), and one
        // allocation per flush is small beside the write itself.
        self.pending = Vec::new();
        self.sent = 0;
        n - held
    }
}

impl<T: AsyncWrite + Unpin> Coalesced<T> {
    /// Writes out everything pending.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.unsent().is_empty() {
            ready!(self.poll_fair(cx));
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.pending[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.since_yield += n;
            self.consume(n);
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Coalesced<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalesced<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if data.len() < SHORT {
            if this.pending.len() + data.len() > BUFFER {
                ready!(this.poll_drain(cx))?;
            }
            this.pending.extend_from_slice(data);
            return Poll::Ready(Ok(data.len()));
        }
        loop {
            ready!(this.poll_fair(cx));
            if this.unsent().is_empty() {
                let n = ready!(Pin::new(&mut this.io).poll_write(cx, data))?;
                this.since_yield += n;
                return Poll::Ready(Ok(n));
            }
            let parts = [IoSlice::new(&this.pending[this.sent..]), IoSlice::new(data)];
            let n = ready!(Pin::new(&mut this.io).poll_write_vectored(cx, &parts))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            this.since_yield += n;
            let past = this.consume(n);
            if past > 0 {
                return Poll::Ready(Ok(past));
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }

    /// The point of this type: see the module's comment.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A socket that records each write call and accepts at most `limit` bytes per call.
    #[derive(Default)]
    struct Recorder {
        calls: Vec<Vec<u8>>,
        limit: Option<usize>,
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = self.limit.map_or(data.len(), |l| l.min(data.len()));
            self.calls.push(data[..n].to_vec());
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            parts: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let all: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
            let n = self.limit.map_or(all.len(), |l| l.min(all.len()));
            self.calls.push(all[..n].to_vec());
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }
    }

    fn written(r: &Recorder) -> Vec<u8> {
        r.calls.concat()
    }

    #[tokio::test]
    async fn short_writes_leave_together_at_the_flush() {
        let mut c = Coalesced::new(Recorder::default());
        for i in 0..10u8 {
            c.write_all(&[i; 300]).await.expect("write");
        }
        assert!(c.io.calls.is_empty(), "nothing is written before the flush");
        c.flush().await.expect("flush");
        assert_eq!(c.io.calls.len(), 1);
        let want: Vec<u8> = (0..10u8).flat_map(|i| [i; 300]).collect();
        assert_eq!(written(&c.io), want);
    }

    #[tokio::test]
    async fn a_long_write_takes_the_buffered_header_along() {
        let mut c = Coalesced::new(Recorder::default());
        c.write_all(&[1; 9]).await.expect("header");
        c.write_all(&[2; SHORT * 2]).await.expect("payload");
        assert_eq!(c.io.calls.len(), 1, "header and payload in one call");
        c.flush().await.expect("flush");
        assert_eq!(c.io.calls.len(), 1, "nothing left to flush");
        let mut want = vec![1u8; 9];
        want.extend_from_slice(&[2; SHORT * 2]);
        assert_eq!(written(&c.io), want);
    }

    #[tokio::test]
    async fn partial_writes_lose_and_repeat_nothing() {
        let mut c = Coalesced::new(Recorder { calls: Vec::new(), limit: Some(1000) });
        let mut want = Vec::new();
        for i in 0..40u8 {
            let len = if i % 7 == 0 { SHORT + 123 } else { 100 + usize::from(i) * 37 };
            let chunk = vec![i; len];
            c.write_all(&chunk).await.expect("write");
            want.extend_from_slice(&chunk);
        }
        c.shutdown().await.expect("shutdown");
        assert_eq!(written(&c.io), want);
        assert!(c.pending.is_empty());
    }

    /// A connection writing a large answer lets another task run after each share: without
    /// the yield, the other task would run only after all 4 MiB were written.
    #[tokio::test(flavor = "current_thread")]
    async fn a_long_writer_yields_to_other_tasks_after_each_share() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let progress = Arc::new(AtomicUsize::new(0));
        let seen = progress.clone();
        // Spawned first: runs at the writer's first yield, and records how far it got.
        let other = tokio::spawn(async move { seen.load(Ordering::SeqCst) });
        let mut c = Coalesced::new(Recorder::default());
        for _ in 0..64 {
            c.write_all(&[7; 64 << 10]).await.expect("write");
            progress.fetch_add(64 << 10, Ordering::SeqCst);
        }
        let at = other.await.expect("the other task");
        assert!(at <= 256 << 10, "the other task ran only after {at} bytes");
        assert_eq!(written(&c.io).len(), 64 << 16);
    }

    #[test]
    fn h2_is_told_the_socket_is_not_vectored() {
        assert!(!Coalesced::new(Recorder::default()).is_write_vectored());
    }
}
