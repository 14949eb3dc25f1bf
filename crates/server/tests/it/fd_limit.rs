//! Clients cannot stop the log by taking every file descriptor: a server started under
//! `ulimit -n 256` (soft and hard) is sent more idle connections than that, then writes that
//! roll the WAL over many segments, and every write must succeed with the server still up.
//!
//! The server runs in a child process (this test binary again, running `fd_child_server`), since
//! the limit is the whole process's.

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cairn::{EngineConfig, ServeConfig};
use cairn_proto::etcdserverpb as pb;
use pb::kv_client::KvClient;

const CHILD_DIR: &str = "CAIRN_FD_CHILD_DIR";
const CHILD_URL: &str = "CAIRN_FD_CHILD_URL";
const LIMIT: usize = 256;
const SEGMENT_BYTES: u64 = 64 << 10;

/// The server, when run as the child; does nothing as an ordinary test. It stops when its
/// standard input closes, so it cannot outlive the test that started it.
#[test]
fn fd_child_server() {
    let (Ok(dir), Ok(url)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_URL)) else { return };
    let mut engine = EngineConfig::new("fd", Path::new(&dir));
    engine.wal_segment_bytes = SEGMENT_BYTES;
    let cfg = ServeConfig::new(engine, vec![url]);
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_target(false).init();
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let stdin_closed = async {
        let _ = tokio::task::spawn_blocking(|| std::io::stdin().read_to_end(&mut Vec::new())).await;
    };
    rt.block_on(cairn::serve(cfg, stdin_closed)).expect("the server ran and stopped cleanly");
}

fn start_child(dir: &Path, url: &str, log: &Path) -> Child {
    let exe = std::env::current_exe().expect("this test binary");
    Command::new("bash")
        .arg("-c")
        .arg(format!("ulimit -n {LIMIT} && exec \"$0\" \"$@\""))
        .arg(exe)
        .args(["--exact", "fd_limit::fd_child_server", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR, dir)
        .env(CHILD_URL, url)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("a log file"))
        .spawn()
        .expect("start the server")
}

fn wal_segments(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("member/wal")).map_or(0, |d| d.count())
}

/// Whether the server closed `c` (it refused the connection) rather than keeping it open.
fn closed_by_server(c: &mut TcpStream) -> bool {
    c.set_read_timeout(Some(Duration::from_millis(20))).expect("a read timeout");
    match c.read(&mut [0u8; 1]) {
        Ok(n) => n == 0,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_past_the_descriptor_limit_cannot_stop_the_log() {
    let dir: PathBuf = std::env::temp_dir().join(format!("cairn-fd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let log = std::env::temp_dir().join(format!("cairn-fd-{}.log", std::process::id()));
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let addr = probe.local_addr().expect("its address");
    drop(probe);
    let url = format!("http://{addr}");
    let mut child = start_child(&dir, &url, &log);
    let mut kv = None;
    for _ in 0..200 {
        if let Ok(c) = KvClient::connect(url.clone()).await {
            kv = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut kv = kv.expect("the server started");
    kv.put(pb::PutRequest { key: b"first".to_vec(), ..Default::default() })
        .await
        .expect("a write before the flood");
    let mut idle: Vec<TcpStream> =
        // A server that stopped accepting leaves connections queued, then unanswered.
        (0..LIMIT + 150)
            .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok())
            .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let value = vec![b'v'; 8 << 10];
    for i in 0..100 {
        let put = pb::PutRequest {
            key: format!("k{i}").into_bytes(),
            value: value.clone(),
            ..Default::default()
        };
        let put = tokio::time::timeout(Duration::from_secs(10), kv.put(put)).await;
        if let Err(e) =
            put.map_err(|_| "timed out".to_string()).and_then(|r| r.map_err(|e| e.to_string()))
        {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            panic!(
                "write {i} failed after {} idle connections: {e}\nserver log:\n{log}",
                idle.len()
            );
        }
    }
    assert!(wal_segments(&dir) >= 5, "the writes rolled the WAL: {} segments", wal_segments(&dir));
    assert!(child.try_wait().expect("the child's state").is_none(), "the server is still up");
    let refused = idle.iter_mut().map(closed_by_server).filter(|c| *c).count();
    assert!(refused >= idle.len() - LIMIT, "{refused} of {} connections refused", idle.len());
    drop(idle);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&log);
}
