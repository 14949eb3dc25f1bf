//! `Maintenance.Snapshot`: the member's snapshot file (`cairn_node::backup`), streamed as etcd
//! streams its database: pieces of 32 KiB, each saying how many bytes remain after it, then one
//! last message carrying the SHA-256 of everything before it, every message with the storage
//! version (etcd 3.6).
//!
//! The file is encoded on a blocking thread as the client takes it: the queue to the client
//! holds [`QUEUE`] pieces, so the server holds about `(QUEUE + 2) * CHUNK` bytes of it at once
//! (plus the record being encoded and 16 bytes per revision in the store), whatever the store's
//! size. A client that stops reading stalls only its own stream; one that goes away ends it, and
//! so does the server's stop (a stop waits for open streams, and would wait for that client).

use std::sync::Arc;

use cairn_node::Engine;
use cairn_proto::etcdserverpb as pb;
use tokio::sync::{mpsc, watch};
use tonic::Status;

use crate::convert::Header;
use crate::errors::status;
use crate::services::BoxStream;

/// etcd's piece size (`snapshotSendBufferSize`).
const CHUNK: usize = 32 * 1024;
/// Pieces encoded ahead of the client.
const QUEUE: usize = 4;
/// What etcd 3.6 sends as the storage version (as `Status` reports it).
pub(crate) const STORAGE_VERSION: &str = "3.6.0";

/// Starts streaming the snapshot of `engine`'s store as it is now.
pub(crate) fn start(
    engine: Arc<Engine>,
    header: Header,
    stopping: watch::Receiver<bool>,
) -> BoxStream<pb::SnapshotResponse> {
    let (tx, rx) = mpsc::channel(QUEUE);
    let queue = Queue { tx, stopping, rt: tokio::runtime::Handle::current() };
    tokio::task::spawn_blocking(move || send(&engine, &header, &queue));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// The way to the client, from the blocking thread.
struct Queue {
    tx: mpsc::Sender<Result<pb::SnapshotResponse, Status>>,
    stopping: watch::Receiver<bool>,
    rt: tokio::runtime::Handle,
}

impl Queue {
    /// Queues `item` once there is room; false once the client is gone or the server stops.
    fn push(&self, item: Result<pb::SnapshotResponse, Status>) -> bool {
        let sent = self.rt.block_on(async {
            tokio::select! {
                sent = self.tx.send(item) => return sent.is_ok(),
                () = crate::streams::stopped(self.stopping.clone()) => {}
            }
            false
        });
        if !sent {
            // Best effort (the client may be gone, or the queue full): without the digest the
            // client knows the file is incomplete anyway.
            let _ = self.tx.try_send(Err(Status::unavailable("etcdserver: server stopped")));
        }
        sent
    }
}

/// Encodes and queues the file, then its digest. Returns early once the client is gone.
fn send(engine: &Engine, header: &Header, queue: &Queue) {
    let mut stream = match engine.backup() {
        Ok(s) => s,
        Err(e) => {
            queue.push(Err(status(e)));
            return;
        }
    };
    let total = stream.len();
    let revision = stream.revision();
    tracing::info!("sending a snapshot at revision {} to a client: {total} bytes", revision.0);
    let mut sent = 0u64;
    let mut first = true;
    loop {
        let blob = match stream.next_chunk(CHUNK) {
            Ok(Some(blob)) => blob,
            Ok(None) => break,
            Err(e) => {
                queue.push(Err(status(cairn_kv::KvError::from(e).into())));
                return;
            }
        };
        sent += blob.len() as u64;
        let resp = pb::SnapshotResponse {
            // The first message says which member and revision the snapshot is of.
            header: if first { header.at(revision) } else { None },
            remaining_bytes: total - sent,
            blob: blob.to_vec(),
            version: STORAGE_VERSION.into(),
        };
        first = false;
        if !queue.push(Ok(resp)) {
            return;
        }
    }
    let digest = stream.digest();
    let last = pb::SnapshotResponse {
        header: None,
        remaining_bytes: 0,
        blob: digest.to_vec(),
        version: STORAGE_VERSION.into(),
    };
    queue.push(Ok(last));
}
