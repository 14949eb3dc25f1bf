//! `Maintenance.Snapshot`: the member's snapshot file (`cairn_node::backup`), streamed as etcd
//! streams its database: pieces of 32 KiB, each saying how many bytes remain after it, then one
//! last message carrying the SHA-256 of everything before it, every message with the storage
//! version (etcd 3.6).
//!
//! The file is encoded on a blocking thread as the client takes it: the queue to the client
//! holds [`QUEUE`] pieces, so the server holds about `(QUEUE + 2) * CHUNK` bytes of it at once
//! (plus the record being encoded and 16 bytes per revision in the store), whatever the store's
//! size. A client that stops reading stalls only its own stream; one that goes away ends it.

use std::sync::Arc;

use cairn_node::Engine;
use cairn_proto::etcdserverpb as pb;
use tokio::sync::mpsc;
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
pub(crate) fn start(engine: Arc<Engine>, header: Header) -> BoxStream<pb::SnapshotResponse> {
    let (tx, rx) = mpsc::channel(QUEUE);
    tokio::task::spawn_blocking(move || send(&engine, &header, &tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

type Tx = mpsc::Sender<Result<pb::SnapshotResponse, Status>>;

/// Encodes and queues the file, then its digest. Returns early once the client is gone.
fn send(engine: &Engine, header: &Header, tx: &Tx) {
    let mut stream = match engine.backup() {
        Ok(s) => s,
        Err(e) => {
            let _ = tx.blocking_send(Err(status(e)));
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
                let _ = tx.blocking_send(Err(status(cairn_kv::KvError::from(e).into())));
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
        if tx.blocking_send(Ok(resp)).is_err() {
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
    let _ = tx.blocking_send(Ok(last));
}
