//! What an operator scrapes and reads: `/metrics` under etcd's names, with the series an etcd
//! Grafana dashboard plots moving with the work done; JSON log lines; and the settings a
//! `--config-file` and the environment give. Each test runs the binary.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_proto::etcdserverpb as pb;
use pb::kv_client::KvClient;
use pb::watch_client::WatchClient;

/// A loopback port nothing listens on now (the kernel's pick, released at once).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("bound").port()
}

fn tmp(name: &str) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("cairn-metrics-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A running cairn whose stderr lines are collected; killed when dropped.
struct Running {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Running {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Running {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(args)
            .envs(env.iter().copied())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cairn");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (pipe, sink) = (child.stderr.take().expect("stderr"), lines.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                sink.lock().expect("lines").push(line);
            }
        });
        Running { child, lines }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GET `path` over HTTP/1.1: (status line, body); `None` while nothing listens.
fn get(port: u16, path: &str) -> Option<(String, String)> {
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(tcp, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut resp = String::new();
    tcp.read_to_string(&mut resp).ok()?;
    let (head, body) = resp.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_string(), body.to_string()))
}

fn wait_for(port: u16, path: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some((status, body)) = get(port, path) {
            if status.contains("200") {
                return body;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("nothing served {path} on port {port}");
}

/// Every sample of a scrape, by its series (name and labels as written).
fn samples(body: &str) -> HashMap<String, f64> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

fn value(s: &HashMap<String, f64>, series: &str) -> f64 {
    *s.get(series).unwrap_or_else(|| panic!("no series {series}"))
}

fn handled(method: &str, code: &str) -> String {
    format!(
        "grpc_server_handled_total{{grpc_type=\"unary\",grpc_service=\"etcdserverpb.KV\",\
         grpc_method=\"{method}\",grpc_code=\"{code}\"}}"
    )
}

const PUT_STARTED: &str = "grpc_server_started_total{grpc_type=\"unary\",\
                           grpc_service=\"etcdserverpb.KV\",grpc_method=\"Put\"}";

const WATCH: &str = "grpc_type=\"bidi_stream\",grpc_service=\"etcdserverpb.Watch\",\
                     grpc_method=\"Watch\"";

/// Puts `n` keys, fails one put (an empty key), reads what a watch from revision 1 sends, and
/// compacts at revision 5.
async fn work(port: u16, n: usize) {
    let url = format!("http://127.0.0.1:{port}");
    let mut kv = KvClient::connect(url.clone()).await.expect("connect");
    for i in 0..n {
        let put = pb::PutRequest {
            key: format!("k{i}").into(),
            value: b"v".to_vec(),
            ..Default::default()
        };
        kv.put(put).await.expect("put");
    }
    let empty = pb::PutRequest { key: Vec::new(), value: b"v".to_vec(), ..Default::default() };
    let err = kv.put(empty).await.expect_err("an empty key is refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let mut watch = WatchClient::connect(url).await.expect("connect");
    let create = pb::WatchCreateRequest {
        key: b"k".to_vec(),
        range_end: b"l".to_vec(),
        start_revision: 1,
        ..Default::default()
    };
    let req = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)),
    };
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(req).await.expect("send");
    let mut stream = watch
        .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("watch")
        .into_inner();
    let mut events = 0;
    while events < n {
        let resp = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("a watch reply in time")
            .expect("a reply")
            .expect("the stream goes on");
        events += resp.events.len();
    }
    drop(tx);
    let compact = pb::CompactionRequest { revision: 5, physical: true };
    kv.compact(compact).await.expect("compact");
}

#[test]
fn metrics_move_with_the_work_and_logs_are_json() {
    let (client, metrics) = (free_port(), free_port());
    let data = tmp("scrape");
    let client_url = format!("http://127.0.0.1:{client}");
    let metrics_url = format!("http://127.0.0.1:{metrics}");
    let server = Running::start(
        &[
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--listen-client-urls",
            &client_url,
            "--listen-metrics-urls",
            &metrics_url,
            "--log-format",
            "json",
        ],
        &[],
    );
    let before = samples(&wait_for(client, "/metrics"));
    assert_eq!(value(&before, "etcd_server_has_leader"), 1.0);
    assert_eq!(value(&before, "etcd_server_is_leader"), 1.0);
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let n = 20;
    rt.block_on(work(client, n));
    // The store's commit runs on its own interval after the writes are answered.
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        let s = samples(&wait_for(metrics, "/metrics"));
        let commits = "etcd_disk_backend_commit_duration_seconds_count";
        if value(&s, commits) > value(&before, commits) || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    check_scrape(&before, &after, n as f64);
    assert!(wait_for(metrics, "/health").contains(r#""health":"true""#));
    // etcd's /health counts, under etcd's names (no `_total`).
    let counted = samples(&wait_for(metrics, "/metrics"));
    assert!(value(&counted, "etcd_server_health_success") >= 1.0);
    assert_eq!(value(&counted, "etcd_server_health_failures"), 0.0);
    drop(server_logs_once(server));
    let _ = std::fs::remove_dir_all(&data);
}

fn check_scrape(before: &HashMap<String, f64>, after: &HashMap<String, f64>, n: f64) {
    let moved = |series: &str| value(after, series) - value(before, series);
    assert_eq!(value(after, "etcd_server_leader_changes_seen_total"), 1.0);
    assert!(moved("etcd_server_proposals_committed_total") >= n, "committed");
    assert!(moved("etcd_server_proposals_applied_total") >= n, "applied");
    assert_eq!(value(after, "etcd_server_proposals_pending"), 0.0);
    assert_eq!(value(after, "etcd_server_proposals_failed_total"), 0.0);
    assert!(moved("etcd_disk_wal_fsync_duration_seconds_count") >= n, "fsyncs");
    assert!(moved("etcd_disk_wal_fsync_duration_seconds_sum") > 0.0, "fsync time");
    let inf = "etcd_disk_wal_fsync_duration_seconds_bucket{le=\"+Inf\"}";
    assert_eq!(value(after, inf), value(after, "etcd_disk_wal_fsync_duration_seconds_count"));
    assert!(moved("etcd_disk_backend_commit_duration_seconds_count") >= 1.0, "backend commits");
    let total = value(after, "etcd_mvcc_db_total_size_in_bytes");
    assert!(total > 0.0);
    assert_eq!(value(after, "etcd_debugging_mvcc_db_total_size_in_bytes"), total);
    let in_use = value(after, "etcd_mvcc_db_total_size_in_use_in_bytes");
    assert!(in_use > 0.0 && in_use <= total, "{in_use} of {total}");
    assert_eq!(value(after, "etcd_debugging_mvcc_keys_total"), n);
    assert_eq!(moved(&handled("Put", "OK")), n);
    assert_eq!(moved(&handled("Put", "InvalidArgument")), 1.0);
    assert_eq!(moved(PUT_STARTED), n + 1.0);
    assert_eq!(moved(&format!("grpc_server_started_total{{{WATCH}}}")), 1.0);
    assert!(moved(&format!("grpc_server_msg_received_total{{{WATCH}}}")) >= 1.0);
    assert!(moved(&format!("grpc_server_msg_sent_total{{{WATCH}}}")) >= 2.0);
    assert!(moved("cairn_watch_events_sent_total") >= n, "events");
    assert!(value(after, "process_resident_memory_bytes") > 1e6);
    assert!(value(after, "process_open_fds") > 3.0);
    assert_eq!(value(after, "etcd_server_quota_backend_bytes"), (8u64 << 30) as f64);
}

/// Stops the server and checks its log: JSON lines, the leader change and the compaction
/// logged once each, and no line per request.
fn server_logs_once(mut server: Running) -> Vec<String> {
    let _ = server.child.kill();
    let _ = server.child.wait();
    std::thread::sleep(Duration::from_millis(100));
    let lines = server.lines();
    let (mut leader_lines, mut compaction_lines) = (0, 0);
    for line in &lines {
        // The addresses served are said in plain words whatever the log's level and format.
        if line.starts_with("cairn: ") {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let msg = v["message"].as_str().unwrap_or_else(|| panic!("a message in {line}"));
        if msg.starts_with("leader is ") {
            leader_lines += 1;
        }
        if msg == "compacted the store" {
            assert_eq!(v["revision"], "5", "{line}");
            compaction_lines += 1;
        }
        assert!(!msg.contains("put"), "a line per request: {line}");
    }
    assert_eq!((leader_lines, compaction_lines), (1, 1), "{lines:#?}");
    lines
}

#[test]
fn config_file_environment_and_flags_in_that_order() {
    let data = tmp("config");
    std::fs::create_dir_all(&data).expect("dir");
    let (from_file, from_env) = (free_port(), free_port());
    let file = data.join("cairn.yml");
    let yaml = format!(
        "name: file-name\nlisten-client-urls: http://127.0.0.1:{from_file}\nlog-outputs: [stderr]\n\
         data-dir: {}\n",
        data.join("d").display()
    );
    std::fs::write(&file, yaml).expect("write");
    let env_url = format!("http://127.0.0.1:{from_env}");
    let path = file.to_str().expect("utf-8");
    // The environment overrides the file's name and URL; the flag overrides the environment's
    // name.
    let env = [("ETCD_NAME", "env-name"), ("ETCD_LISTEN_CLIENT_URLS", env_url.as_str())];
    let server = Running::start(&["--config-file", path, "--name", "flag-name"], &env);
    wait_for(from_env, "/health");
    assert!(get(from_file, "/health").is_none(), "the file's URL is overridden");
    drop(server_until_named(server, "flag-name"));
    std::fs::write(&file, "name: x\nwal-dir: /somewhere\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["--config-file", path])
        .output()
        .expect("run cairn");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("wal-dir is an etcd setting cairn does not support yet"), "{err}");
    std::fs::write(&file, "name: x\nbogus: 1\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["--config-file", path])
        .output()
        .expect("run cairn");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown key bogus"), "{err}");
    let _ = std::fs::remove_dir_all(&data);
}

/// Waits for the log line that names the member, then stops the server.
fn server_until_named(server: Running, name: &str) -> Running {
    let want = format!("named \"{name}\"");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.lines().iter().any(|l| l.contains(&want)) {
        assert!(Instant::now() < deadline, "{want} not in {:#?}", server.lines());
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

/// The member id a scrape names in `etcd_server_id{server_id="..."}`.
fn server_id(s: &HashMap<String, f64>) -> String {
    let series = s.keys().find(|k| k.starts_with("etcd_server_id{")).expect("etcd_server_id");
    let (_, rest) = series.split_once("server_id=\"").expect("a server_id label");
    rest.trim_end_matches("\"}").to_string()
}

/// Two members: each times its round trips to the other and counts the bytes between them,
/// under etcd's names and with the peer's id as etcd labels it.
#[test]
fn peers_are_probed_and_their_traffic_counted() {
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let url = |p: u16| format!("http://127.0.0.1:{p}");
    let initial = format!("m0={},m1={}", url(ports[2]), url(ports[3]));
    let data = tmp("peers");
    let servers: Vec<Running> = (0..2)
        .map(|i| {
            let args = [
                "--name".to_string(),
                format!("m{i}"),
                "--data-dir".into(),
                data.join(format!("m{i}")).display().to_string(),
                "--listen-client-urls".into(),
                url(ports[i]),
                "--listen-peer-urls".into(),
                url(ports[2 + i]),
                "--initial-advertise-peer-urls".into(),
                url(ports[2 + i]),
                "--initial-cluster".into(),
                initial.clone(),
            ];
            Running::start(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[])
        })
        .collect();
    let ids: Vec<String> =
        ports[..2].iter().map(|p| server_id(&samples(&wait_for(*p, "/metrics")))).collect();
    // The second member found the first up at its first probe; the first probes again within
    // etcd's 4 s interval.
    let deadline = Instant::now() + Duration::from_secs(20);
    for (me, peer) in [(0, 1), (1, 0)] {
        let to = format!("{{To=\"{}\"}}", ids[peer]);
        let from = format!("{{From=\"{}\"}}", ids[peer]);
        let count = format!("etcd_network_peer_round_trip_time_seconds_count{to}");
        let sent = format!("etcd_network_peer_sent_bytes_total{to}");
        let received = format!("etcd_network_peer_received_bytes_total{from}");
        // Raft's first messages (the election) may come after the first probe.
        let s = loop {
            let s = samples(&wait_for(ports[me], "/metrics"));
            let moved = |series: &str| s.get(series).is_some_and(|n| *n >= 1.0);
            if moved(&count) && moved(&sent) && moved(&received) {
                break s;
            }
            assert!(Instant::now() < deadline, "no round trip or traffic from m{me} to m{peer}");
            std::thread::sleep(Duration::from_millis(100));
        };
        // The encoder writes `le` before the family's labels.
        let inf = format!(
            "etcd_network_peer_round_trip_time_seconds_bucket{{le=\"+Inf\",To=\"{}\"}}",
            ids[peer]
        );
        assert_eq!(value(&s, &inf), value(&s, &count));
        let sum = value(&s, &format!("etcd_network_peer_round_trip_time_seconds_sum{to}"));
        assert!(sum > 0.0 && sum < 5.0 * value(&s, &count), "{sum}");
    }
    drop(servers);
    let _ = std::fs::remove_dir_all(&data);
}
