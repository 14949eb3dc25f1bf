//! The `cairn` binary's first minutes: how it reads etcd's flags and URLs, what a failed start
//! leaves behind (nothing new), and what it logs when it starts. Each test runs the binary.

use crate::pki;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Runs cairn to its exit; one still running after 20 s (a start that should have been
/// refused) is killed, and its output returned as it stands.
fn cairn(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cairn");
    for _ in 0..200 {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    child.wait_with_output().expect("collect output")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A loopback port in 24000-24999 that nothing listens on now, held until the caller drops it.
fn free_port() -> (u16, TcpListener) {
    let start = 24_000 + (std::process::id() % 900) as u16;
    for port in (start..25_000).chain(24_000..start) {
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            return (port, l);
        }
    }
    panic!("no free port in 24000-24999");
}

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cairn-cli-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn a_listen_url_without_a_scheme_says_so() {
    let data = tmp("noscheme");
    let out = cairn(&[
        "--data-dir",
        data.to_str().expect("utf-8"),
        "--listen-client-urls",
        "127.0.0.1:24999",
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("--listen-client-urls"), "{err}");
    assert!(err.contains("has no scheme: write http://127.0.0.1:24999"), "{err}");
    assert!(!data.exists(), "a refused flag created {}", data.display());
}

#[test]
fn host_names_are_refused_for_listening_as_etcd_refuses_them() {
    let data = tmp("hostname");
    let data = data.to_str().expect("utf-8");
    let out = cairn(&["--data-dir", data, "--listen-client-urls", "http://db1.example:24999"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("expected IP in URL for binding (http://db1.example:24999)"));
    let peers = cairn(&[
        "--data-dir",
        data,
        "--initial-cluster",
        "default=http://127.0.0.1:24998",
        "--initial-advertise-peer-urls",
        "http://127.0.0.1:24998",
        "--listen-peer-urls",
        "http://db1.example:24998",
    ]);
    assert!(stderr(&peers).contains("--listen-peer-urls: expected IP in URL for binding"));
}

#[test]
fn etcd_flags_cairn_lacks_are_named_as_such() {
    for args in [&["--auto-compaction-retention", "1"][..], &["--auto-tls"]] {
        let out = cairn(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let flag = args[0].split('=').next().expect("flag");
        let want = format!("{flag} is an etcd flag cairn does not support yet");
        assert!(stderr(&out).contains(&want), "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("similar argument"), "{}", stderr(&out));
    }
    // Neither etcd's nor cairn's: clap's own answer stands.
    let typo = cairn(&["--data-dirr", "x"]);
    assert_eq!(typo.status.code(), Some(2));
    assert!(stderr(&typo).contains("a similar argument exists: '--data-dir'"));
    // `cairn bench` takes no etcd server flags.
    let bench = cairn(&["bench", "--auto-compaction-retention", "1"]);
    assert_eq!(bench.status.code(), Some(2));
    assert!(!stderr(&bench).contains("etcd flag"), "{}", stderr(&bench));
}

#[test]
fn unusable_tls_flags_are_refused_in_etcds_words_before_anything_is_written() {
    let certs = pki::dir("cli");
    let ca = pki::Ca::new(&certs, "ca");
    let (cert, key) = ca.issue("server", "server");
    let (_, other_key) = ca.issue("other", "other");
    let missing = certs.join("missing.pem");
    let [cert, key, other_key, missing] =
        [cert, key, other_key, missing].map(|p| p.to_str().expect("utf-8").to_string());
    let (port, held) = free_port();
    drop(held);
    let https = format!("https://127.0.0.1:{port}");
    let peer = format!("https://127.0.0.1:{}", port + 1);
    let cluster = format!("a={peer}");
    let client = ["--listen-client-urls", https.as_str()];
    let peers = [
        "--name",
        "a",
        "--initial-cluster",
        &cluster,
        "--initial-advertise-peer-urls",
        &peer,
        "--listen-peer-urls",
        &peer,
        "--cert-file",
        &cert,
        "--key-file",
        &key,
    ];
    let no_cert = format!(
        "TLS key/cert (--cert-file, --key-file) must be provided for client url {https} with HTTPS scheme"
    );
    let peer_files = ["--peer-cert-file", &cert, "--peer-key-file", &other_key];
    let cases: [(Vec<&str>, &str); 6] = [
        (client.to_vec(), &no_cert),
        (
            [&client[..], &["--cert-file", &cert]].concat(),
            "--cert-file and --key-file must both be given",
        ),
        (
            [&client[..], &["--cert-file", &cert, "--key-file", &other_key]].concat(),
            "tls: private key does not match public key",
        ),
        ([&client[..], &["--cert-file", &missing, "--key-file", &key]].concat(), "open "),
        ([&client[..], &peers[..]].concat(), "cannot listen on TLS for https://127.0.0.1"),
        // The peer flags reach the peer listeners: their key is checked too.
        (
            [&client[..], &peers[..], &peer_files[..]].concat(),
            "peer TLS: tls: private key does not match public key",
        ),
    ];
    for (i, (args, want)) in cases.iter().enumerate() {
        let data = tmp(&format!("tls-{i}"));
        let out = cairn(&[&["--data-dir", data.to_str().expect("utf-8")][..], args].concat());
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr(&out).contains(want), "{args:?}: {}", stderr(&out));
        assert!(!data.exists(), "{args:?} left {}", data.display());
    }
    let _ = std::fs::remove_dir_all(certs);
}

/// etcd's version, cipher suite and allowed-name flags are checked at start, in etcd's words.
#[test]
fn tls_version_and_cipher_suite_flags_are_read_as_etcd_reads_them() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["--tls-min-version", "TLS1.1"],
            r#"unexpected TLS version "TLS1.1" (must be one of: TLS1.2, TLS1.3)"#,
        ),
        (
            &["--tls-min-version=TLS1.3", "--tls-max-version=TLS1.2"],
            "min version (TLS1.3) is greater than max version (TLS1.2)",
        ),
        (&["--cipher-suites", "TLS_BOGUS"], r#"unexpected TLS cipher suite "TLS_BOGUS""#),
        (
            &["--tls-min-version=TLS1.3", "--cipher-suites=TLS_AES_128_GCM_SHA256"],
            "cipher suites cannot be configured when only TLS1.3 is enabled",
        ),
        (
            &["--peer-cert-allowed-cn=a", "--peer-cert-allowed-hostname=b"],
            r#"AllowedCNs and AllowedHostnames are mutually exclusive (cns=["a"], hostnames=["b"])"#,
        ),
    ];
    for (i, (args, want)) in cases.iter().enumerate() {
        let data = tmp(&format!("tls-policy-{i}"));
        let out = cairn(&[&["--data-dir", data.to_str().expect("utf-8")][..], args].concat());
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr(&out).contains(want), "{args:?}: {}", stderr(&out));
        assert!(!data.exists(), "{args:?} left {}", data.display());
    }
}

#[test]
fn a_start_on_a_port_in_use_leaves_no_data_directory() {
    let (port, _held) = free_port();
    let data = tmp("inuse").join("cairn-data");
    let url = format!("http://127.0.0.1:{port}");
    let out = cairn(&["--data-dir", data.to_str().expect("utf-8"), "--listen-client-urls", &url]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("Address already in use"), "{}", stderr(&out));
    assert!(!data.exists() && !data.parent().expect("parent").exists(), "left {}", data.display());
}

/// A start whose engine cannot open (here: a peer that does not resolve) removes the data
/// directory it created, and keeps one that was there before.
#[test]
fn a_failed_open_removes_only_the_directory_it_created() {
    let (client, c) = free_port();
    let (peer, p) = free_port();
    drop((c, p));
    let run = |data: &Path| {
        let peer = format!("http://127.0.0.1:{peer}");
        cairn(&[
            "--name",
            "a",
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--listen-client-urls",
            &format!("http://127.0.0.1:{client}"),
            "--initial-cluster",
            &format!("a={peer},b=http://no-such-host.invalid:2380"),
            "--initial-advertise-peer-urls",
            &peer,
            "--listen-peer-urls",
            &peer,
        ])
    };
    let data = tmp("openfail");
    let out = run(&data);
    assert!(stderr(&out).contains("does not resolve"), "{}", stderr(&out));
    assert!(!data.exists(), "a failed first start left {}", data.display());
    std::fs::create_dir_all(&data).expect("mkdir");
    assert!(!run(&data).status.success());
    assert!(data.exists(), "a failed start removed a directory it did not create");
    std::fs::remove_dir_all(&data).expect("clean up");
}

/// Starts cairn and collects its stderr lines until one contains `until` (or 20 s pass).
fn start_until(args: &[&str], until: &str) -> (Child, Vec<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cairn");
    let (tx, rx) = mpsc::channel();
    let pipe = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(20)) {
        let done = line.contains(until);
        lines.push(line);
        if done {
            break;
        }
    }
    (child, lines)
}

#[test]
fn localhost_listens_on_loopback_and_the_start_is_logged() {
    let (port, held) = free_port();
    drop(held);
    let data = tmp("startlog");
    let url = format!("http://localhost:{port}");
    let args = ["--data-dir", data.to_str().expect("utf-8"), "--listen-client-urls", &url];
    let (mut child, lines) = start_until(&args, "serving the etcd v3 API");
    let _ = child.kill();
    let _ = child.wait();
    let all = lines.join("\n");
    assert!(all.contains(&format!("serving the etcd v3 API on http://127.0.0.1:{port}")), "{all}");
    assert!(all.contains(&format!("data directory {}", data.display())), "{all}");
    assert!(all.contains("named \"default\" in cluster"), "{all}");
    assert!(
        all.contains(
            "committed log entries replayed onto the database, revision 1, compact revision -1"
        ),
        "{all}"
    );
    // --log-level error keeps the start quiet; the address line is not a log record.
    let quiet = [&args[..], &["--log-level", "error"]].concat();
    let (mut child, lines) = start_until(&quiet, "serving the etcd v3 API");
    let _ = child.kill();
    let _ = child.wait();
    let all = lines.join("\n");
    assert!(all.contains("serving the etcd v3 API"), "{all}");
    assert!(!all.contains("INFO"), "{all}");
    std::fs::remove_dir_all(&data).expect("clean up");
}
