//! etcd 3.7's `KV.RangeStream`: a range sent in chunks, every chunk read at one pinned revision,
//! with the header, `more` and `count` on the last chunk only (Kubernetes 1.37 fills its watch
//! cache with it and falls back to paged Range on `Unimplemented`).
//!
//! Memory stays bounded whatever the range: each chunk is read, sent and dropped, the task waits
//! for the client to take a chunk before it reads the next (two in flight), and chunk sizes
//! adapt toward `TARGET_BYTES`. Revision filters (which etcd refuses on the stream) are served:
//! each chunk is filtered as it is read, so they cost time, never memory. Sort orders other than
//! by key ascending are refused as etcd refuses them: sorting by value, version or revision
//! needs the whole result at once, which is what the stream exists to avoid; Range serves them.

use bytes::Bytes;
use cairn_kv::{self as kv, range, RangeRequest, SortOrder, SortTarget};
use cairn_proto::etcdserverpb as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Response, Status};

use crate::convert::kv_pb;
use crate::errors::status;
use crate::services::{BoxStream, Ctx};

/// Bytes of keys and values a chunk aims for.
const TARGET_BYTES: usize = 1 << 20;
/// etcd's first chunk limit.
const FIRST_CHUNK: i64 = 10;
const MAX_CHUNK: i64 = 10_000;

/// Checks the request and starts sending its chunks.
pub(crate) async fn start(
    ctx: Ctx,
    req: RangeRequest,
) -> Result<Response<BoxStream<pb::RangeStreamResponse>>, Status> {
    let default_order = req.sort_order == SortOrder::None
        || (req.sort_order == SortOrder::Ascend && req.sort_target == SortTarget::Key);
    if !default_order {
        return Err(Status::unimplemented("RangeStream does not support custom sort orders"));
    }
    if !req.serializable {
        ctx.engine.read_barrier().await.map_err(status)?;
    }
    // The count, and the revision every chunk reads at, before the stream starts, so a bad
    // revision (compacted, future) fails the call itself.
    let whole = RangeRequest { count_only: true, serializable: true, ..req.clone() };
    let first = ctx.engine.range(whole).await.map_err(status)?;
    let (tx, rx) = mpsc::channel(2);
    tokio::spawn(async move {
        if let Err(e) = send_chunks(&ctx, req, first, &tx).await {
            let _ = tx.send(Err(e)).await;
        }
    });
    Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
}

type Chunks = mpsc::Sender<Result<pb::RangeStreamResponse, Status>>;

fn chunk(kvs: Vec<kv::KeyValue>) -> pb::RangeStreamResponse {
    let kvs = kvs.into_iter().map(kv_pb).collect();
    pb::RangeStreamResponse {
        range_response: Some(pb::RangeResponse { kvs, ..Default::default() }),
    }
}

/// Reads and sends the chunks; returns once the last is sent or the client left.
async fn send_chunks(
    ctx: &Ctx,
    req: RangeRequest,
    first: kv::RangeResponse,
    tx: &Chunks,
) -> Result<(), Status> {
    let read = |r: RangeRequest| ctx.engine.range(r);
    // Every chunk reads at the revision of the first read (the client's, or the latest then).
    let header = first.revision;
    let pinned = if req.revision.0 > 0 { req.revision } else { header };
    let done = |kvs: Vec<kv::KeyValue>, more: bool| {
        let mut last = chunk(kvs);
        if let Some(r) = &mut last.range_response {
            (r.header, r.more, r.count) = (ctx.header().at(header), more, first.count);
        }
        last
    };
    if req.count_only {
        return send(tx, done(Vec::new(), false)).await;
    }
    let limit = if req.limit > 0 { req.limit } else { i64::MAX };
    let (mut key, mut size, mut sent) = (req.key.clone(), FIRST_CHUNK, 0i64);
    loop {
        let resp = read(page(&req, &key, size, pinned, req.keys_only)).await.map_err(status)?;
        let bytes: usize = resp.kvs.iter().map(|kv| kv.key.len() + kv.value.len()).sum();
        if let Some(last) = resp.kvs.last() {
            key = next_key(&last.key);
        }
        let mut kvs: Vec<kv::KeyValue> =
            resp.kvs.into_iter().filter(|kv| range::passes_filters(&req, kv)).collect();
        let room = usize::try_from(limit - sent).unwrap_or(usize::MAX);
        let cut = kvs.len() > room;
        kvs.truncate(room);
        sent += kvs.len() as i64;
        if cut || sent == limit {
            // Full: `more` says whether anything matching lies beyond.
            let more = cut || (resp.more && matches_beyond(ctx, &req, &key, pinned).await?);
            return send(tx, done(kvs, more)).await;
        }
        if !resp.more {
            return send(tx, done(kvs, false)).await;
        }
        if !kvs.is_empty() {
            send(tx, chunk(kvs)).await?;
        }
        size = adapt(size, bytes);
    }
}

/// A plain read of up to `limit` keys of `req`'s range from `key` on, at `pinned`: no sort, no
/// filters (the stream applies them to what it reads), no barrier (taken once, at the start).
fn page(
    req: &RangeRequest,
    key: &Bytes,
    limit: i64,
    pinned: kv::Revision,
    keys_only: bool,
) -> RangeRequest {
    RangeRequest {
        key: key.clone(),
        range_end: req.range_end.clone(),
        limit,
        revision: pinned,
        serializable: true,
        keys_only,
        ..RangeRequest::default()
    }
}

/// The smallest key after `key`.
fn next_key(key: &Bytes) -> Bytes {
    let mut next = key.to_vec();
    next.push(0);
    Bytes::from(next)
}

/// Whether a key from `from` on (within the request's range) passes its filters.
async fn matches_beyond(
    ctx: &Ctx,
    req: &RangeRequest,
    from: &Bytes,
    pinned: kv::Revision,
) -> Result<bool, Status> {
    let mut key = from.clone();
    loop {
        let r = page(req, &key, MAX_CHUNK, pinned, true);
        let resp = ctx.engine.range(r).await.map_err(status)?;
        if resp.kvs.iter().any(|kv| range::passes_filters(req, kv)) {
            return Ok(true);
        }
        match resp.kvs.last() {
            Some(last) if resp.more => key = next_key(&last.key),
            _ => return Ok(false),
        }
    }
}

/// The next chunk's limit: doubled while chunks are under half the target, halved while over
/// twice it (etcd's `adjustChunkLimit`).
fn adapt(size: i64, bytes: usize) -> i64 {
    if bytes < TARGET_BYTES / 2 {
        (size * 2).min(MAX_CHUNK)
    } else if bytes > TARGET_BYTES * 2 {
        (size / 2).max(1)
    } else {
        size
    }
}

/// Sends a chunk; fails once the client has left, which ends the reading.
async fn send(tx: &Chunks, resp: pb::RangeStreamResponse) -> Result<(), Status> {
    tx.send(Ok(resp)).await.map_err(|_| Status::cancelled("the client left"))
}
