//! The data directory's safety: private permissions on everything the engine creates, existing
//! directories tightened, and one engine at a time even when the lock file is removed.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use cairn_node::{Engine, EngineConfig, EngineError, OpenError};

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cairn-datadir-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("stat").permissions().mode() & 0o777
}

/// Every directory and file under `dir`, `dir` included.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    for e in std::fs::read_dir(dir).expect("list") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

#[test]
fn everything_the_engine_creates_is_private_to_its_owner() {
    let dir = temp_dir("modes");
    let e = Engine::open(EngineConfig::new("modes", &dir)).expect("open");
    let mut paths = Vec::new();
    walk(&dir, &mut paths);
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    for name in ["LOCK", "member_id", "wal", "db", "data.mdb"] {
        assert!(names.iter().any(|n| n.ends_with(name)), "{name} missing from {names:?}");
    }
    for p in &paths {
        let want = if p.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode(p), want, "{} is {:o}", p.display(), mode(p));
    }
    e.stop();
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn a_data_directory_open_to_others_is_tightened() {
    let dir = temp_dir("tighten");
    std::fs::create_dir_all(dir.join("member")).expect("create");
    for d in [dir.clone(), dir.join("member")] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let e = Engine::open(EngineConfig::new("tighten", &dir)).expect("open");
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("member")), 0o700);
    e.stop();
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn a_second_engine_is_refused_with_the_directory_and_the_holders_pid() {
    let dir = temp_dir("pid");
    let first = Engine::open(EngineConfig::new("one", &dir)).expect("open");
    match Engine::open(EngineConfig::new("two", &dir)) {
        Err(EngineError::Open(e @ OpenError::Locked { .. })) => {
            let msg = e.to_string();
            assert!(msg.contains(&dir.display().to_string()), "{msg}");
            assert!(msg.contains(&format!("pid {}", std::process::id())), "{msg}");
        }
        other => panic!("expected the directory to be locked, got {other:?}"),
    }
    first.stop();
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn removing_the_lock_file_does_not_let_a_second_engine_in() {
    let dir = temp_dir("unlinked");
    let first = Engine::open(EngineConfig::new("one", &dir)).expect("open");
    std::fs::remove_file(dir.join("member/LOCK")).expect("remove LOCK");
    match Engine::open(EngineConfig::new("two", &dir)) {
        Err(EngineError::Open(OpenError::Locked { dir: d, .. })) => assert_eq!(d, dir),
        other => panic!("a second engine opened the same files: {other:?}"),
    }
    first.stop();
    drop(first);
    // Released with the engine: the directory opens again.
    Engine::open(EngineConfig::new("again", &dir)).expect("reopen").stop();
    std::fs::remove_dir_all(&dir).expect("clean up");
}
