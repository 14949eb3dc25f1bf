//! Large Range responses, encoded off the runtime's threads and sent without another copy.
//!
//! tonic encodes a unary response in the poll that sends it: for a range of 100,000 keys that is
//! 30 MB of protobuf written, and then 100,000 messages freed, by the thread that also serves
//! every small request of every connection (one thread on a 2-core machine). A put arriving
//! meanwhile waited for all of it: its p99 grew from milliseconds to over a hundred while four
//! clients read whole key spaces, although the same load against another process left it near
//! its idle latency (bench/results/2026-11-23-large-ranges.md).
//!
//! So a large range is encoded on the blocking pool, beside its read, into gRPC's framing (the
//! 5-byte prefix, then the message) in chunks of about [`CHUNK_BYTES`]. The service answers with
//! an empty placeholder message and the chunks in the response's extensions;
//! [`send_encoded`], a layer outside tonic, sends the chunks in the placeholder's stead and
//! then tonic's trailers (its status). The answer's charge against the range budget
//! (range_budget.rs) rides with the chunks and is returned when the connection drops the body. The runtime's thread only hands the chunks to the
//! connection. The wire bytes are what tonic would send for the same message; the fields are in
//! the order 1, 2, 3, 4 as prost writes them.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use ::bytes::{BufMut, Bytes, BytesMut};
use axum::body::Body;
use cairn_kv as kv;
use cairn_proto::etcdserverpb as pb;
use http_body::Frame;
use prost::encoding::{bytes, encode_key, encode_varint, encoded_len_varint, int64, WireType};
use prost::Message;
use tonic::Status;

use crate::convert::Header;
use crate::range_budget::Charge;

/// Bytes of one chunk handed to the connection (one key's record may make a chunk larger).
const CHUNK_BYTES: usize = 1 << 20;
/// gRPC's message prefix: a compression flag and a big-endian u32 length.
const PREFIX: usize = 5;
/// `RangeResponse.kvs`' field number.
const KVS_FIELD: u32 = 2;

/// A response message already encoded in gRPC's framing, riding in a response's extensions.
#[derive(Debug, Clone)]
pub struct Encoded {
    chunks: Vec<Bytes>,
    charge: Option<Charge>,
}

impl Encoded {
    /// Keeps `charge` until the connection has sent these bytes.
    pub fn holding(self, charge: Charge) -> Encoded {
        Encoded { charge: Some(charge), ..self }
    }
}

/// Encodes the answer `r` as [`Encoded`] chunks: the bytes tonic would send for
/// `header.range(r)`, written straight from the store's records (each value is copied once,
/// into the chunk).
///
/// # Errors
/// A message longer than gRPC's framing can announce (4 GiB) is refused.
pub fn encode_range(header: &Header, r: kv::RangeResponse) -> Result<Encoded, Status> {
    let kv::RangeResponse { revision, kvs, more, count } = r;
    // The message without its kvs, split around where they go: the header (field 1) before,
    // `more` and `count` (3 and 4) after.
    let head = pb::RangeResponse { header: header.at(revision), ..Default::default() };
    let head = head.encode_to_vec();
    let tail = pb::RangeResponse { header: None, kvs: Vec::new(), more, count }.encode_to_vec();
    let kvs_len: usize = kvs.iter().map(|kv| field_len(kv_len(kv))).sum();
    let len = head.len() + kvs_len + tail.len();
    let announced = u32::try_from(len).map_err(|_| {
        Status::resource_exhausted(format!(
            "cairn: a range response of {len} bytes is larger than a gRPC message can be \
             (4 GiB); read the range in pages with limit"
        ))
    })?;
    let mut chunks = Vec::with_capacity(len / CHUNK_BYTES + 1);
    let mut buf = BytesMut::with_capacity(CHUNK_BYTES.min(PREFIX + len));
    buf.put_u8(0);
    buf.put_u32(announced);
    buf.put_slice(&head);
    // Each record is freed once encoded, so the answer is not held twice.
    for kv in kvs {
        if buf.len() >= CHUNK_BYTES {
            chunks.push(buf.split().freeze());
            buf.reserve(CHUNK_BYTES);
        }
        put_kv(&kv, &mut buf);
    }
    buf.put_slice(&tail);
    chunks.push(buf.freeze());
    Ok(Encoded { chunks, charge: None })
}

/// Bytes one element of a repeated message field takes: its key, its length, the message.
fn field_len(message: usize) -> usize {
    1 + encoded_len_varint(message as u64) + message
}

/// The length of `kv` encoded as an `mvccpb.KeyValue` (proto3: zero fields are left out).
fn kv_len(kv: &kv::KeyValue) -> usize {
    let mut n = 0;
    if !kv.key.is_empty() {
        n += bytes::encoded_len(1, &kv.key);
    }
    for (tag, v) in kv_ints(kv) {
        if v != 0 {
            n += int64::encoded_len(tag, &v);
        }
    }
    if !kv.value.is_empty() {
        n += bytes::encoded_len(5, &kv.value);
    }
    n
}

/// `kv` as an element of `RangeResponse.kvs`, its fields in prost's order.
fn put_kv(kv: &kv::KeyValue, buf: &mut BytesMut) {
    encode_key(KVS_FIELD, WireType::LengthDelimited, buf);
    encode_varint(kv_len(kv) as u64, buf);
    if !kv.key.is_empty() {
        bytes::encode(1, &kv.key, buf);
    }
    let [create, modified, version, lease] = kv_ints(kv);
    for (tag, v) in [create, modified, version] {
        if v != 0 {
            int64::encode(tag, &v, buf);
        }
    }
    if !kv.value.is_empty() {
        bytes::encode(5, &kv.value, buf);
    }
    if lease.1 != 0 {
        int64::encode(lease.0, &lease.1, buf);
    }
}

/// The integer fields of `kv` with their field numbers.
fn kv_ints(kv: &kv::KeyValue) -> [(u32, i64); 4] {
    [(2, kv.create_revision.0), (3, kv.mod_revision.0), (4, kv.version), (6, kv.lease.0)]
}

/// A response layer: a response with [`Encoded`] in its extensions sends those bytes in place
/// of the (placeholder) message tonic encoded, then tonic's trailers.
pub fn send_encoded(mut resp: axum::response::Response) -> axum::response::Response {
    match resp.extensions_mut().remove::<Encoded>() {
        Some(Encoded { chunks, charge }) => resp.map(|placeholder| {
            Body::new(Preencoded { chunks: chunks.into(), placeholder, _charge: charge })
        }),
        None => resp,
    }
}

/// A body that sends pre-encoded chunks, then the trailers of the body it replaces (whose data,
/// the placeholder message, it drops), and holds the answer's charge until it is dropped.
struct Preencoded {
    chunks: VecDeque<Bytes>,
    placeholder: Body,
    _charge: Option<Charge>,
}

impl http_body::Body for Preencoded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if let Some(chunk) = self.chunks.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        loop {
            match Pin::new(&mut self.placeholder).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) if frame.is_data() => continue,
                other => return other,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty() && self.placeholder.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue};
    use http_body::Body as _;

    /// A body of the given frames.
    struct Frames(VecDeque<Frame<Bytes>>);

    impl http_body::Body for Frames {
        type Data = Bytes;
        type Error = axum::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
            Poll::Ready(self.0.pop_front().map(Ok))
        }
    }

    /// The body's data, joined, and its trailers.
    async fn collect(mut body: Body) -> (Vec<u8>, Option<HeaderMap>) {
        let (mut data, mut trailers) = (Vec::new(), None);
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            let frame = frame.expect("a body without errors");
            match frame.into_data() {
                Ok(bytes) => data.extend_from_slice(&bytes),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        (data, trailers)
    }

    const HEADER: Header = Header { cluster_id: 7, member_id: 8, raft_term: 2 };

    /// A record; every third has zeros where proto3 leaves fields out.
    fn kv(i: usize, value: usize) -> kv::KeyValue {
        let zeros = i % 3 == 1;
        kv::KeyValue {
            key: format!("key{i:06}").into_bytes().into(),
            create_revision: kv::Revision(if zeros { 0 } else { 2 + i as i64 }),
            mod_revision: kv::Revision(1_000_000 + i as i64),
            version: if zeros { 0 } else { 3 },
            value: vec![b'v'; if zeros { 0 } else { value }].into(),
            lease: kv::LeaseId(i as i64 % 3),
        }
    }

    fn response(n: usize, value: usize) -> kv::RangeResponse {
        kv::RangeResponse {
            revision: kv::Revision(1_000_000 + n as i64),
            kvs: (0..n).map(|i| kv(i, value)).collect(),
            more: n % 2 == 1,
            count: n as i64 + 5,
        }
    }

    /// What tonic sends for `resp`: the prefix, then prost's encoding.
    fn tonic_wire(resp: &pb::RangeResponse) -> Vec<u8> {
        let message = resp.encode_to_vec();
        let mut wire = vec![0];
        wire.extend_from_slice(&(message.len() as u32).to_be_bytes());
        wire.extend_from_slice(&message);
        wire
    }

    #[test]
    fn the_chunks_are_the_bytes_tonic_would_send() {
        for (n, value) in [(0, 0), (1, 0), (3, 10), (5_000, 256), (3, 3 << 20)] {
            let want = tonic_wire(&HEADER.range(response(n, value)));
            let encoded = encode_range(&HEADER, response(n, value)).expect("encodes");
            assert_eq!(
                encoded.chunks.iter().map(Bytes::len).sum::<usize>(),
                want.len(),
                "{n} keys of {value} bytes"
            );
            assert_eq!(encoded.chunks.concat(), want, "{n} keys of {value} bytes");
            if want.len() > 2 * CHUNK_BYTES {
                assert!(encoded.chunks.len() > 1, "a large response is sent in chunks");
            }
        }
    }

    #[tokio::test]
    async fn the_body_sends_the_chunks_in_place_of_the_placeholder_then_its_trailers() {
        let encoded = encode_range(&HEADER, response(2_000, 600)).expect("encodes");
        let want = encoded.chunks.concat();
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let placeholder = Frames(VecDeque::from([
            Frame::data(Bytes::from_static(b"\0\0\0\0\0")),
            Frame::trailers(trailers.clone()),
        ]));
        let mut resp = axum::response::Response::new(Body::new(placeholder));
        resp.extensions_mut().insert(encoded);
        let resp = send_encoded(resp);
        assert!(resp.extensions().get::<Encoded>().is_none(), "taken from the extensions");
        let (data, sent_trailers) = collect(resp.into_body()).await;
        assert_eq!(sent_trailers, Some(trailers), "tonic's status follows the message");
        assert!(data == want, "the chunks are sent, the placeholder's bytes are not");
    }

    #[tokio::test]
    async fn the_charge_lasts_as_long_as_the_body_that_holds_it() {
        use crate::range_budget::{RangeBudget, MAX_WAIT, UNIT};
        let budget = RangeBudget::new(10 * UNIT);
        let charge = budget.charge(3 * UNIT, MAX_WAIT).await.expect("fits");
        let encoded = encode_range(&HEADER, response(3, 10)).expect("encodes").holding(charge);
        let want = encoded.chunks.concat();
        let mut resp = axum::response::Response::new(Body::from("placeholder"));
        resp.extensions_mut().insert(encoded);
        let resp = send_encoded(resp);
        assert_eq!(budget.available(), 7 * UNIT, "held by the body");
        let (data, _) = collect(resp.into_body()).await;
        assert!(data == want);
        assert_eq!(budget.available(), 10 * UNIT, "returned once the body is done");
    }

    #[test]
    fn a_response_without_encoded_bytes_is_left_alone() {
        let resp = send_encoded(axum::response::Response::new(Body::from("as is")));
        assert!(resp.extensions().is_empty());
    }
}
