//! `cairn bench` as a script runs it: its exit status when the reader of its output has gone,
//! when requests fail, and its help. Embedded runs and a port where nothing listens: no server.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// A data directory of its own for an embedded run, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("cairn-bench-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cairn() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
    c.env("RUST_BACKTRACE", "0");
    c
}

fn run(args: &[&str]) -> Output {
    cairn().args(args).output().expect("cairn runs")
}

/// `cairn bench ... | head -1` once head has exited: the report meets a closed pipe.
#[test]
fn a_closed_pipe_is_no_panic() {
    let dir = Dir::new("pipe");
    let data = dir.0.to_str().expect("a UTF-8 temp path");
    for output in ["text", "json", "etcd"] {
        let mut child = cairn()
            .args(["bench", "--embedded", data, "--total", "50", "--output", output, "put"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cairn starts");
        // Close the read end before the run ends, so every write of the report fails.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("cairn ends");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "--output {output}: {stderr}");
        assert_eq!(out.status.code(), Some(0), "--output {output}: {stderr}");
    }
}

#[test]
fn failed_requests_fail_the_run_after_the_report() {
    let dir = Dir::new("fail");
    let data = dir.0.to_str().expect("a UTF-8 temp path");
    // Values over etcd's request limit: every put is refused.
    let out = run(&["bench", "--embedded", data, "--total", "5", "--value-size", "2000000", "put"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("5 of 5 requests failed"), "{stderr}");
    assert!(stderr.contains("request is too large"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("This run had 5 failed requests"));
}

#[test]
fn watch_and_lease_fail_where_nothing_listens() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let ep = format!("127.0.0.1:{port}");
    for w in ["watch", "lease-keepalive", "lease-grant-revoke"] {
        let out = run(&["bench", "--endpoints", &ep, "--total", "5", w]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{w}: {stderr}");
        assert!(stderr.contains("cannot connect"), "{w}: {stderr}");
    }
}

#[test]
fn help_explains_sizes_and_presets() {
    let out = run(&["bench", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for (flag, words) in [
        ("--key-size", "Key size in bytes"),
        ("--value-size", "Value size in bytes"),
        ("--output", "etcd"),
        ("seq-put", "1 client, 64-byte keys"),
        ("par-get", "16 clients"),
    ] {
        // A flag's help may sit on the line below it (clap's long layout).
        let lines: Vec<&str> = help.lines().collect();
        let at = lines.iter().position(|l| l.trim_start().starts_with(flag)).expect(flag);
        let text = lines[at..(at + 2).min(lines.len())].join(" ");
        assert!(text.contains(words), "{flag}: {text}");
    }
}
