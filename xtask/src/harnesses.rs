//! The harnesses' own behaviour when the server is not there: they stop at once and say why,
//! in the server's words, instead of waiting out their timeouts; and they find the binary in
//! cargo's target directory.

#![cfg(test)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// A stand-in server that exits at once, saying why on stderr.
fn failing_server(test: &str) -> PathBuf {
    let name = format!("cairn-xtask-fake-{}-{test}", std::process::id());
    let path = std::env::temp_dir().join(name);
    // Written by a child shell, so no fd of this process (which other test threads' forks
    // could inherit) holds the file open when it is run: that fails with ETXTBSY.
    let script = "printf '#!/bin/sh\\necho \"fake cairn: cannot start, for the test\" >&2\\nexit 3\\n' > \"$1\" && chmod +x \"$1\"";
    let status = Command::new("sh").args(["-c", script, "sh"]).arg(&path).status().expect("sh");
    assert!(status.success(), "writing the stand-in failed");
    path
}

/// Runs `program args` from the workspace root with `env`, and checks it failed within `within`
/// saying `want`.
fn fails_fast(program: &str, args: &[&str], env: &[(&str, &str)], want: &str, within: Duration) {
    let started = Instant::now();
    let mut cmd = Command::new(program);
    cmd.args(args).current_dir(root());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out: Output = cmd.output().expect("run the harness");
    let took = started.elapsed();
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{program} {args:?} succeeded: {text}");
    assert!(text.contains(want), "{program} {args:?} does not say {want:?}: {text}");
    assert!(took < within, "{program} {args:?} took {took:?} to fail");
}

#[test]
fn the_smoke_script_stops_at_once_when_cairn_is_missing_or_exits() {
    let script = ["tests/etcdctl_smoke.sh"];
    let missing = [("CAIRN_BIN", "/nonexistent/cairn")];
    fails_fast(
        "bash",
        &script,
        &missing,
        "cairn did not start: no such file",
        Duration::from_secs(5),
    );
    let fake = failing_server("smoke");
    let exits = [("CAIRN_BIN", fake.to_str().expect("utf-8"))];
    fails_fast("bash", &script, &exits, "cannot start, for the test", Duration::from_secs(5));
    std::fs::remove_file(fake).expect("clean up");
}

#[test]
fn compare_py_stops_at_once_when_cairn_is_missing_or_exits() {
    let missing = [("CAIRN_BIN", "/nonexistent/cairn")];
    let quick = ["scripts/compare.py", "--quick"];
    fails_fast(
        "python3",
        &quick,
        &missing,
        "no such file /nonexistent/cairn",
        Duration::from_secs(5),
    );
    let fake = failing_server("compare");
    let start = format!(
        "import sys; sys.path.insert(0, 'scripts'); import compare, tempfile; \
         compare.Server('cairn', {:?}, tempfile.mkdtemp())",
        fake.to_str().expect("utf-8")
    );
    fails_fast(
        "python3",
        &["-c", &start],
        &[],
        "cannot start, for the test",
        Duration::from_secs(5),
    );
    std::fs::remove_file(fake).expect("clean up");
}

#[test]
fn compare_py_finds_cairn_under_cargo_target_dir() {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys; sys.path.insert(0, 'scripts'); import compare; print(compare.CAIRN)",
        ])
        .current_dir(root())
        .env_remove("CAIRN_BIN")
        .env("CARGO_TARGET_DIR", "/tmp/cairn-elsewhere")
        .output()
        .expect("python3");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "/tmp/cairn-elsewhere/release/cairn");
}
