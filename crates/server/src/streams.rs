//! What every long-lived stream of the server needs (Watch, LeaseKeepAlive) and the listener
//! too: reading a client's requests promptly, and noticing that the server is stopping.

use tokio::sync::mpsc;
use tonic::{Status, Streaming};

/// Requests a stream may read ahead of handling them.
const READ_AHEAD: usize = 16 * 1024;

/// Reads a client's requests as they arrive, into a queue of up to `READ_AHEAD`, ending with
/// the error that ended the stream if one did. Reading promptly matters: hyper's HTTP/2 closes
/// the whole connection (GOAWAY, ENHANCE_YOUR_CALM) once the small DATA frames it holds unread
/// exceed half its connection window (`listen.rs` sizes it), which a client creating
/// thousands of watches at once, or keeping thousands of leases alive on one stream, would
/// reach while the stream is busy answering.
pub(crate) fn read_ahead<T: Send + 'static>(mut requests: Streaming<T>) -> ReadAhead<T> {
    let (tx, rx) = mpsc::channel(READ_AHEAD);
    tokio::spawn(async move {
        loop {
            let next = match requests.message().await {
                Ok(Some(req)) => Ok(req),
                Ok(None) => return,
                Err(e) => Err(e),
            };
            let failed = next.is_err();
            if tx.send(Box::new(next)).await.is_err() || failed {
                return;
            }
        }
    });
    ReadAhead(rx)
}

/// The requests [`read_ahead`] has read. Boxed in the queue: the channel allocates its slots
/// in blocks of 32, and 32 unboxed requests-or-statuses are kilobytes that every open stream
/// (thousands of idle watch streams) would hold.
pub(crate) struct ReadAhead<T>(mpsc::Receiver<Box<Result<T, Status>>>);

impl<T> ReadAhead<T> {
    /// The next request, or `None` once the client's side has ended.
    pub(crate) async fn recv(&mut self) -> Option<Result<T, Status>> {
        self.0.recv().await.map(|b| *b)
    }
}

/// Resolves once the server is stopping.
pub(crate) async fn stopped(mut stopping: tokio::sync::watch::Receiver<bool>) {
    let _ = stopping.wait_for(|s| *s).await;
}
