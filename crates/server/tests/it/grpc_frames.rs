//! Fuzzing the request path from raw gRPC frames: each case sends one HTTP/2 request to a live
//! server with a body made from a valid gRPC frame of a valid request and then damaged (bytes
//! flipped, cut or added, the length prefix wrong, the compression flag set, a second message,
//! no message at all), on the KV, Lease, Watch, Cluster, Maintenance and Auth calls. Every case
//! must get an HTTP/2 answer with a gRPC status among those etcd's clients expect (never a reset
//! stream, a dropped connection or a hang, which is what a panic in a handler gives), and the
//! server must serve as before afterwards.
//!
//! `src/request_fuzz.rs` covers the messages' decoding and checks in depth; this covers the
//! framing and the whole stack above the socket. A longer run is one command:
//! `FRAME_FUZZ_CASES=20000 cargo test -p cairn --test it grpc_frames::`.

use std::time::Duration;

use axum::http::{self, Method, Request};
use bytes::Bytes;
use cairn_proto::etcdserverpb as pb;
use prost::Message;

use crate::common;

/// A small deterministic generator (xorshift64*): a failing case is replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A valid request for each call, encoded.
fn calls() -> Vec<(&'static str, Vec<u8>)> {
    let mut all = kv_calls();
    all.extend(other_calls());
    all
}

const KEY: &[u8] = b"fuzz/key";

/// The KV calls.
fn kv_calls() -> Vec<(&'static str, Vec<u8>)> {
    let key = KEY.to_vec();
    vec![
        (
            "/etcdserverpb.KV/Range",
            pb::RangeRequest {
                key: key.clone(),
                range_end: b"fuzz0".to_vec(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "/etcdserverpb.KV/Put",
            pb::PutRequest { key: key.clone(), value: b"v".to_vec(), ..Default::default() }
                .encode_to_vec(),
        ),
        (
            "/etcdserverpb.KV/DeleteRange",
            pb::DeleteRangeRequest { key: key.clone(), ..Default::default() }.encode_to_vec(),
        ),
        (
            "/etcdserverpb.KV/Txn",
            pb::TxnRequest {
                compare: vec![pb::Compare {
                    key: key.clone(),
                    target: pb::compare::CompareTarget::Version as i32,
                    target_union: Some(pb::compare::TargetUnion::Version(0)),
                    ..Default::default()
                }],
                success: vec![pb::RequestOp {
                    request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                        key: key.clone(),
                        value: b"t".to_vec(),
                        ..Default::default()
                    })),
                }],
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "/etcdserverpb.KV/Compact",
            pb::CompactionRequest { revision: 1, physical: false }.encode_to_vec(),
        ),
    ]
}

/// Lease, Watch, Cluster, Maintenance and Auth calls.
fn other_calls() -> Vec<(&'static str, Vec<u8>)> {
    let key = KEY.to_vec();
    vec![
        (
            "/etcdserverpb.Lease/LeaseGrant",
            pb::LeaseGrantRequest { ttl: 60, id: 0 }.encode_to_vec(),
        ),
        ("/etcdserverpb.Lease/LeaseRevoke", pb::LeaseRevokeRequest { id: 7 }.encode_to_vec()),
        (
            "/etcdserverpb.Lease/LeaseTimeToLive",
            pb::LeaseTimeToLiveRequest { id: 7, keys: true }.encode_to_vec(),
        ),
        ("/etcdserverpb.Lease/LeaseLeases", pb::LeaseLeasesRequest {}.encode_to_vec()),
        ("/etcdserverpb.Lease/LeaseKeepAlive", pb::LeaseKeepAliveRequest { id: 7 }.encode_to_vec()),
        (
            "/etcdserverpb.Watch/Watch",
            pb::WatchRequest {
                request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                    pb::WatchCreateRequest { key: key.clone(), ..Default::default() },
                )),
            }
            .encode_to_vec(),
        ),
        (
            "/etcdserverpb.Cluster/MemberList",
            pb::MemberListRequest { linearizable: true }.encode_to_vec(),
        ),
        ("/etcdserverpb.Maintenance/Status", pb::StatusRequest {}.encode_to_vec()),
        ("/etcdserverpb.Maintenance/HashKV", pb::HashKvRequest { revision: 0 }.encode_to_vec()),
        ("/etcdserverpb.Auth/AuthStatus", pb::AuthStatusRequest {}.encode_to_vec()),
        (
            "/etcdserverpb.Auth/Authenticate",
            pb::AuthenticateRequest { name: "root".into(), password: "x".into() }.encode_to_vec(),
        ),
    ]
}

/// `msg` in gRPC's framing: a compression flag, a big-endian length, the message.
fn frame(flag: u8, len: u32, msg: &[u8]) -> Vec<u8> {
    let mut out = vec![flag];
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(msg);
    out
}

/// A body made from the valid `msg`, damaged in one of the ways a client or a network could.
fn damaged(r: &mut Rng, msg: &[u8]) -> Vec<u8> {
    let len = msg.len() as u32;
    let mut body = match r.below(9) {
        // The message itself damaged, framed honestly.
        0..=2 => {
            let mut m = msg.to_vec();
            for _ in 0..=r.below(4) {
                match (r.below(3), m.is_empty()) {
                    (0, false) => {
                        let i = r.below(m.len());
                        m[i] = r.next() as u8;
                    }
                    (1, false) => m.truncate(r.below(m.len())),
                    _ => {
                        let i = r.below(m.len() + 1);
                        m.insert(i, r.next() as u8);
                    }
                }
            }
            frame(0, m.len() as u32, &m)
        }
        // A length prefix that claims less or more than follows (up to 4 GiB).
        3 => frame(0, len.saturating_sub(1 + r.below(3) as u32), msg),
        4 => frame(0, [len + 1, len + 100, 1 << 20, 64 << 20, u32::MAX][r.below(5)], msg),
        // Compressed, with no grpc-encoding agreed.
        5 => frame(1, len, msg),
        // Two messages on a unary call (a stream takes them).
        6 => [frame(0, len, msg), frame(0, len, msg)].concat(),
        // A frame cut inside its prefix, or no body at all.
        7 => frame(0, len, msg)[..r.below(5)].to_vec(),
        // Random bytes.
        _ => (0..r.below(64)).map(|_| r.next() as u8).collect(),
    };
    if r.below(8) == 0 {
        body.extend((0..r.below(16)).map(|_| r.next() as u8));
    }
    body
}

/// gRPC codes a damaged request may get: those etcd's clients expect from etcd for bad input
/// (and OK, for damage that left a valid request).
const EXPECTED: &[i32] = &[
    0,  // OK
    3,  // InvalidArgument
    5,  // NotFound (a lease)
    8,  // ResourceExhausted (a message over the limit)
    9,  // FailedPrecondition
    11, // OutOfRange (a compacted or future revision)
    12, // Unimplemented (a compressed message)
    13, // Internal (what grpc-go answers for a message that does not decode)
    16, // Unauthenticated
];

/// Sends one request and returns its gRPC status code.
async fn send(
    client: &mut h2::client::SendRequest<Bytes>,
    path: &str,
    body: Vec<u8>,
) -> Result<i32, String> {
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("http://127.0.0.1{path}"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header("te", "trailers")
        .body(())
        .map_err(|e| e.to_string())?;
    let (resp, mut send) = client.send_request(req, false).map_err(|e| e.to_string())?;
    send.send_data(body.into(), true).map_err(|e| e.to_string())?;
    let resp = resp.await.map_err(|e| format!("no answer: {e}"))?;
    if resp.status() != http::StatusCode::OK {
        return Err(format!("HTTP status {}", resp.status()));
    }
    let header_status = resp.headers().get("grpc-status").cloned();
    let mut body = resp.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| format!("the answer's body broke off: {e}"))?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let status = match header_status {
        Some(s) => Some(s),
        None => body
            .trailers()
            .await
            .map_err(|e| e.to_string())?
            .and_then(|t| t.get("grpc-status").cloned()),
    };
    let status = status.ok_or("no grpc-status")?;
    status
        .to_str()
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("grpc-status {status:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_grpc_frames_get_statuses_never_a_crash() {
    let mut s = common::server("grpc-frames").await;
    let cases: u64 =
        std::env::var("FRAME_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(400);
    let calls = calls();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", s.port)).await.expect("connect");
    let (mut client, conn) = h2::client::handshake(tcp).await.expect("an HTTP/2 handshake");
    tokio::spawn(conn);
    let mut seen = std::collections::BTreeMap::<i32, u64>::new();
    for seed in 1..=cases {
        let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let (path, msg) = &calls[r.below(calls.len())];
        let body = damaged(&mut r, msg);
        let answer = tokio::time::timeout(Duration::from_secs(10), send(&mut client, path, body))
            .await
            .unwrap_or_else(|_| Err("no answer within 10 s".into()));
        let code = answer.unwrap_or_else(|e| panic!("case {seed} ({path}): {e}"));
        assert!(EXPECTED.contains(&code), "case {seed} ({path}): grpc-status {code}");
        *seen.entry(code).or_default() += 1;
    }
    eprintln!("gRPC statuses over {cases} cases: {seen:?}");
    // The damage was seen as damage (not every case answered OK), and valid requests still
    // went through (not every case refused).
    assert!(seen.get(&0).copied().unwrap_or(0) > 0, "{seen:?}");
    assert!(seen.iter().any(|(c, n)| *c != 0 && *n > 0), "{seen:?}");
    // The server serves as before.
    let put =
        pb::PutRequest { key: b"after".to_vec(), value: b"ok".to_vec(), ..Default::default() };
    s.kv.put(put).await.expect("a put after the fuzzing");
    let got = s.kv.range(pb::RangeRequest { key: b"after".to_vec(), ..Default::default() }).await;
    assert_eq!(got.expect("a range").into_inner().kvs[0].value, b"ok");
}
