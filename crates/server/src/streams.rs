//! What every long-lived stream of the server needs (Watch, LeaseKeepAlive) and the listener
//! too: noticing that the server is stopping.
//!
//! Each stream also reads its client's requests promptly, up to a bound of its own, itself
//! (`watch.rs`, `lease.rs`): hyper's HTTP/2 closes the whole connection (GOAWAY,
//! ENHANCE_YOUR_CALM) once the small DATA frames it holds unread exceed half its connection
//! window (`listen.rs` sizes it), which a client creating thousands of watches at once, or
//! keeping thousands of leases alive on one stream, would reach while the stream is busy
//! answering.

/// Resolves once the server is stopping.
pub(crate) async fn stopped(mut stopping: tokio::sync::watch::Receiver<bool>) {
    let _ = stopping.wait_for(|s| *s).await;
}
