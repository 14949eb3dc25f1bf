//! The client port's HTTP layer against a server in this process: `/version`, text 404s for
//! unknown paths, gRPC only over HTTP/2 with a gRPC content type (a browser's cross-site POST
//! runs nothing), and `Unimplemented` answers that name the call.

use std::time::Duration;

use axum::http::{self, Method, Request, StatusCode};
use cairn_proto::etcdserverpb as pb;
use pb::kv_client::KvClient;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

use crate::common;
use common::server;

/// One HTTP/1.1 request over a fresh connection: the status, the content type and the body.
async fn http1(
    port: u16,
    method: &str,
    path: &str,
    headers: &str,
    body: &[u8],
) -> (u16, String, String) {
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n{headers}\
         content-length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.expect("send the head");
    tcp.write_all(body).await.expect("send the body");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut raw))
        .await
        .expect("an answer within 10 s")
        .expect("read the answer");
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a complete HTTP answer");
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status code");
    let ct = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-type: ").map(str::to_owned))
        .unwrap_or_default();
    (status, ct, body.to_owned())
}

/// One HTTP/2 request: the status and the body.
async fn http2(port: u16, req: Request<()>, body: Vec<u8>) -> (StatusCode, String) {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    let (mut client, conn) = h2::client::handshake(tcp).await.expect("an HTTP/2 handshake");
    tokio::spawn(conn);
    let (resp, mut send) = client.send_request(req, false).expect("send the head");
    send.send_data(body.into(), true).expect("send the body");
    let resp = resp.await.expect("an answer");
    let status = resp.status();
    let mut body = resp.into_body();
    let mut text = Vec::new();
    while let Some(chunk) = body.data().await {
        text.extend_from_slice(&chunk.expect("a body chunk"));
    }
    (status, String::from_utf8_lossy(&text).into_owned())
}

/// `msg` in gRPC's length-prefixed framing.
fn grpc_frame(msg: &impl Message) -> Vec<u8> {
    let bytes = msg.encode_to_vec();
    let mut out = vec![0];
    out.extend_from_slice(&u32::try_from(bytes.len()).expect("a small message").to_be_bytes());
    out.extend(bytes);
    out
}

async fn value(kv: &mut KvClient<Channel>, key: &[u8]) -> Option<Vec<u8>> {
    let r = kv.range(pb::RangeRequest { key: key.to_vec(), ..Default::default() }).await;
    r.expect("range").into_inner().kvs.pop().map(|kv| kv.value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_answers_as_etcd_does_with_cairns_own_version() {
    let s = server("version").await;
    let (status, ct, body) = http1(s.port, "GET", "/version", "", b"").await;
    assert_eq!((status, ct.as_str()), (200, "application/json"), "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["etcdserver"], cairn::ETCD_COMPATIBLE_VERSION);
    assert_eq!(v["cairn"], env!("CARGO_PKG_VERSION"));
    // etcd clients parse the cluster version as major.minor.patch and need 3.5 or later.
    let cluster: Vec<u32> = v["etcdcluster"]
        .as_str()
        .expect("a string")
        .split('.')
        .map(|p| p.parse().expect("a number"))
        .collect();
    assert_eq!(cluster.len(), 3, "{body}");
    assert!(cluster[0] == 3 && cluster[1] >= 5 && cluster[2] == 0, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_get_a_text_404() {
    let s = server("notfound").await;
    for path in ["/metricz", "/versoin", "/", "/etcdserverpb.KV"] {
        let (status, ct, body) = http1(s.port, "GET", path, "", b"").await;
        assert_eq!(status, 404, "{path}: {body}");
        assert!(ct.starts_with("text/plain"), "{path}: {ct}");
        assert!(body.starts_with("404 page not found"), "{path}: {body}");
    }
    let (status, _, body) = http1(s.port, "POST", "/v3/kv/range", "", b"{\"key\":\"Zm9v\"}").await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("gRPC only"), "{body}");
    let (status, _, body) = http1(s.port, "GET", "/health", "", b"").await;
    assert_eq!((status, body.as_str()), (200, r#"{"health":"true","reason":""}"#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_runs_only_over_http2_with_a_grpc_content_type() {
    let mut s = server("csrf").await;
    let put = |key: &str| {
        let req = pb::PutRequest { key: key.into(), value: b"x".to_vec(), ..Default::default() };
        grpc_frame(&req)
    };
    // What a web page can send cross-site: a form POST (HTTP/1.1, a "simple" content type).
    let cases = [
        ("text/plain", "form"),
        ("application/x-www-form-urlencoded", "urlencoded"),
        ("application/grpc", "http1grpc"),
    ];
    for (ct, key) in cases {
        let headers = format!("content-type: {ct}\r\n");
        let (status, _, body) =
            http1(s.port, "POST", "/etcdserverpb.KV/Put", &headers, &put(key)).await;
        assert!((400..500).contains(&status), "{ct}: {status} {body}");
        assert!(body.contains("only over HTTP/2"), "{ct}: {body}");
        assert_eq!(value(&mut s.kv, key.as_bytes()).await, None, "{ct}: the put ran");
    }
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("http://127.0.0.1:{}/etcdserverpb.KV/Put", s.port))
        .header(http::header::CONTENT_TYPE, "text/plain")
        .body(())
        .expect("a request");
    let (status, body) = http2(s.port, req, put("h2text")).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{body}");
    assert_eq!(value(&mut s.kv, b"h2text").await, None, "the put ran");
    // The real thing still works.
    s.kv.put(pb::PutRequest { key: b"k".to_vec(), value: b"v".to_vec(), ..Default::default() })
        .await
        .expect("a gRPC put");
    assert_eq!(value(&mut s.kv, b"k").await, Some(b"v".to_vec()));
}

/// Calls `path` with an empty message and returns the status.
async fn call(port: u16, path: &'static str) -> tonic::Status {
    let channel = Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("a URL")
        .connect()
        .await
        .expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let codec = tonic_prost::ProstCodec::<(), ()>::default();
    let path = http::uri::PathAndQuery::from_static(path);
    grpc.unary(tonic::Request::new(()), path, codec).await.expect_err("no such call")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unimplemented_calls_are_named() {
    let s = server("unimpl").await;
    let cases = [
        ("/etcdserverpb.Auth/Nope", "unknown method Nope for service etcdserverpb.Auth"),
        ("/v3lockpb.Lock/Lock", "cairn does not implement v3lockpb.Lock/Lock"),
        ("/etcdserverpb.KV/Nope", "unknown method Nope for service etcdserverpb.KV"),
        ("/etcdserverpb.Maintenance/Nope", "unknown method Nope for service"),
        ("/no.Such/Call", "unknown service no.Such"),
    ];
    for (path, want) in cases {
        let status = call(s.port, path).await;
        assert_eq!(status.code(), tonic::Code::Unimplemented, "{path}: {status:?}");
        assert!(status.message().contains(want), "{path}: {:?}", status.message());
    }
    // A call cairn names itself keeps its own message.
    let status = call(s.port, "/etcdserverpb.Maintenance/Downgrade").await;
    assert_eq!(status.message(), "cairn does not implement Maintenance.Downgrade yet");
}

fn h2_frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("a small frame").to_be_bytes();
    let mut f = len[1..].to_vec();
    f.extend_from_slice(&[ty, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// HPACK's "literal with incremental indexing" of `value` under the static table's name `index`
/// (short strings, no Huffman).
fn literal(index: u8, value: &str) -> Vec<u8> {
    let mut b = vec![0x40 | index, u8::try_from(value.len()).expect("a short value")];
    b.extend_from_slice(value.as_bytes());
    b
}

/// Two Maintenance.Status calls on one HTTP/2 connection, their headers encoded as grpc-go does
/// (the first adds `:authority` and the rest to the dynamic table, the second refers to them),
/// as etcdctl 3.4's `endpoint status` sends them. Returns each call's grpc-status and message.
async fn status_calls(port: u16, authority: &str) -> Vec<(String, Vec<u8>)> {
    let mut first = vec![0x83, 0x86]; // :method POST, :scheme http
    first.extend(literal(1, authority));
    first.extend(literal(4, "/etcdserverpb.Maintenance/Status"));
    first.extend(literal(31, "application/grpc"));
    first.extend([0x40, 2, b't', b'e', 8]);
    first.extend_from_slice(b"trailers");
    // The dynamic table now holds te (62), content-type, :path and :authority (65).
    let second = vec![0x83, 0x86, 0x80 | 65, 0x80 | 64, 0x80 | 63, 0x80 | 62];
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(0x4, 0, 0, &[]));
    for (stream, block) in [(1, first), (3, second)] {
        out.extend(h2_frame(0x1, 0x4, stream, &block));
        out.extend(h2_frame(0x0, 0x1, stream, &grpc_frame(&pb::StatusRequest {})));
    }
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    tcp.write_all(&out).await.expect("send");
    let mut decoder = loona_hpack::Decoder::new();
    let mut got: Vec<(String, Vec<u8>)> = vec![Default::default(); 2];
    let mut ended = 0;
    let read = async {
        while ended < 2 {
            let mut head = [0u8; 9];
            tcp.read_exact(&mut head).await.expect("a frame");
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let mut payload = vec![0; len];
            tcp.read_exact(&mut payload).await.expect("a frame's payload");
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
            let call = (stream as usize).saturating_sub(1) / 2;
            match head[3] {
                0x0 => got[call].1.extend_from_slice(&payload),
                0x1 => {
                    for (name, value) in decoder.decode(&payload).expect("a header block") {
                        if name == b"grpc-status" {
                            got[call].0 = String::from_utf8(value).expect("UTF-8");
                        }
                    }
                    ended += usize::from(head[4] & 0x1 != 0);
                }
                0x3 => panic!("stream {stream} reset: {payload:?}"),
                0x7 => panic!("connection closed (GOAWAY): {payload:?}"),
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read).await.expect("answers within 10 s");
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_as_authority_is_accepted_as_etcd_does() {
    let s = server("authority").await;
    for authority in [format!("http://127.0.0.1:{}", s.port), format!("127.0.0.1:{}", s.port)] {
        for (status, message) in status_calls(s.port, &authority).await {
            assert_eq!(status, "0", "{authority}");
            let r = pb::StatusResponse::decode(&message[5..]).expect("a StatusResponse");
            assert_eq!(r.version, cairn::ETCD_COMPATIBLE_VERSION, "{authority}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_alarms_and_probes_as_etcd_3_5_does() {
    let s = server("health").await;
    let ok = r#"{"health":"true","reason":""}"#;
    assert_eq!(http1(s.port, "GET", "/health", "", b"").await.2, ok);
    assert_eq!(http1(s.port, "GET", "/health?serializable=true", "", b"").await.2, ok);
    let (status, _, body) = http1(s.port, "GET", "/readyz?verbose", "", b"").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        "[+]data_corruption ok\n[+]serializable_read ok\n[+]linearizable_read ok\nok\n"
    );
    assert_eq!(http1(s.port, "GET", "/livez", "", b"").await.2, "ok\n");

    let url = format!("http://127.0.0.1:{}", s.port);
    let mut m = pb::maintenance_client::MaintenanceClient::connect(url).await.expect("connect");
    let alarm = |action, alarm| pb::AlarmRequest { action, member_id: 0, alarm };
    use pb::alarm_request::AlarmAction;
    m.alarm(alarm(AlarmAction::Activate as i32, pb::AlarmType::Nospace as i32))
        .await
        .expect("raise NOSPACE");
    let (status, _, body) = http1(s.port, "GET", "/health", "", b"").await;
    assert_eq!(
        (status, body.as_str()),
        (503, "{\"health\":\"false\",\"reason\":\"ALARM NOSPACE\"}\n")
    );
    let (status, _, body) = http1(s.port, "GET", "/health?exclude=NOSPACE", "", b"").await;
    assert_eq!((status, body.as_str()), (200, ok));
    // Only CORRUPT makes a member unready.
    assert_eq!(http1(s.port, "GET", "/readyz", "", b"").await.0, 200);

    m.alarm(alarm(AlarmAction::Activate as i32, pb::AlarmType::Corrupt as i32))
        .await
        .expect("raise CORRUPT");
    let (status, _, body) = http1(s.port, "GET", "/health?exclude=NOSPACE", "", b"").await;
    assert_eq!(
        (status, body.as_str()),
        (503, "{\"health\":\"false\",\"reason\":\"ALARM CORRUPT\"}\n")
    );
    let (status, _, body) = http1(s.port, "GET", "/readyz", "", b"").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("[-]data_corruption failed: alarm activated: CORRUPT\n"), "{body}");
    let (status, _, body) = http1(s.port, "GET", "/readyz?exclude=data_corruption", "", b"").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    assert_eq!(http1(s.port, "GET", "/readyz/linearizable_read", "", b"").await.0, 200);
    assert_eq!(http1(s.port, "GET", "/livez", "", b"").await.0, 200);
}
