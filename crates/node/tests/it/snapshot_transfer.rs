//! A follower's snapshot streamed at `--snapshot-send-rate` while the leader keeps
//! acknowledging writes, and received into a file of the member's `snap` directory that goes
//! once installed; and a member that crashed with a partial or a complete image still there
//! restarts clean and catches up.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_kv::*;
use cairn_node::cluster::{ClusterConfig, ClusterState};
use cairn_node::{Engine, EngineConfig};

struct Member {
    cfg: EngineConfig,
    engine: Option<Engine>,
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(e) = self.engine.take() {
            e.stop();
        }
        let _ = std::fs::remove_dir_all(&self.cfg.data_dir);
        if let Some(parent) = self.cfg.data_dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

fn configs(tag: &str, send_rate: u64) -> Vec<Member> {
    let dir = std::env::temp_dir().join(format!("cairn-snapxfer-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ls: Vec<_> =
        (0..3).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind")).collect();
    let urls: Vec<String> =
        ls.iter().map(|l| format!("http://{}", l.local_addr().expect("addr"))).collect();
    drop(ls);
    let initial: Vec<String> = urls.iter().enumerate().map(|(i, u)| format!("m{i}={u}")).collect();
    let initial = initial.join(",");
    (0..3)
        .map(|i| {
            let name = format!("m{i}");
            let mut cfg = EngineConfig::new(&name, dir.join(&name));
            cfg.tick_interval = Duration::from_millis(20);
            cfg.snapshot_entries = 20;
            // Little kept behind compactions or for a follower catching up, so that a member
            // that was stopped for a few hundred writes needs a snapshot.
            cfg.snapshot_catchup_entries = 5;
            cfg.snapshot_catchup_max = 40;
            cfg.snapshot_send_rate = send_rate;
            let url = std::slice::from_ref(&urls[i]);
            let c = ClusterConfig::from_flags(&name, &initial, tag, url, url, ClusterState::New);
            cfg.cluster = Some(c.expect("flags"));
            Member { cfg, engine: None }
        })
        .collect()
}

fn start(m: &mut Member) {
    m.engine = Some(Engine::open(m.cfg.clone()).expect("open"));
}

fn stop(m: &mut Member) {
    if let Some(e) = m.engine.take() {
        e.stop();
    }
}

fn eng(m: &Member) -> &Engine {
    m.engine.as_ref().expect("running")
}

/// The member the running members agree leads, waiting up to 10 s.
fn leader(ms: &[Member]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ids: Vec<Option<u64>> =
            ms.iter().filter_map(|m| m.engine.as_ref()).map(|e| e.leader()).collect();
        if let Some(Some(l)) = ids.first() {
            if ids.iter().all(|x| *x == Some(*l)) {
                let found =
                    ms.iter().position(|m| m.engine.as_ref().is_some_and(|e| e.identity().1 == *l));
                if let Some(i) = found {
                    return i;
                }
            }
        }
        assert!(Instant::now() < deadline, "no agreed leader: {ids:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn put(e: &Engine, k: String, v: Bytes) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let req =
            PutRequest { key: Bytes::from(k.clone()), value: v.clone(), ..Default::default() };
        match e.put(req).await {
            Ok(_) => return,
            Err(err) if Instant::now() < deadline => {
                let _ = err;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(err) => panic!("write {k} failed: {err:?}"),
        }
    }
}

fn snap_dir(m: &Member) -> PathBuf {
    m.cfg.data_dir.join("member").join("snap")
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(_) => Vec::new(),
    }
}

/// Waits until `m` has executed up to the leader's revision.
async fn caught_up(ms: &[Member], m: usize, l: usize, within: Duration) {
    let deadline = Instant::now() + within;
    let target = eng(&ms[l]).status().revision;
    while eng(&ms[m]).status().revision < target {
        assert!(Instant::now() < deadline, "member {m} never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes 2 MiB of values while `behind` is away, so that it needs a snapshot of them.
async fn fill_while_away(ms: &mut [Member], behind: usize, l: usize) {
    stop(&mut ms[behind]);
    // Silent for more than an election timeout (200 ms), the member counts as away: the
    // leader keeps no entries for it and compacts past it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let value = Bytes::from(vec![b'v'; 64 << 10]);
    for i in 0..32 {
        put(eng(&ms[l]), format!("big{i:02}"), value.clone()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_acknowledged_while_a_paced_snapshot_streams() {
    // 2 MiB at 1 MiB/s: about two seconds of transfer.
    let mut ms = configs("paced", 1 << 20);
    ms.iter_mut().for_each(start);
    let l = leader(&ms);
    let behind = (l + 1) % 3;
    fill_while_away(&mut ms, behind, l).await;
    start(&mut ms[behind]);
    let started = Instant::now();
    let (mut writes, mut slowest) = (0, Duration::ZERO);
    let target = eng(&ms[l]).status().revision;
    while eng(&ms[behind]).status().revision < target {
        assert!(started.elapsed() < Duration::from_secs(20), "the member never caught up");
        let t = Instant::now();
        put(eng(&ms[l]), format!("during{writes}"), Bytes::from("x")).await;
        slowest = slowest.max(t.elapsed());
        writes += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1500), "2 MiB at 1 MiB/s arrived in {took:?}");
    assert!(writes >= 20, "only {writes} writes were acknowledged during {took:?}");
    assert!(slowest < Duration::from_millis(500), "a write waited {slowest:?} during the transfer");
    caught_up(&ms, behind, l, Duration::from_secs(10)).await;
    // Installed (or refused, for one that arrived late): no received file stays.
    let deadline = Instant::now() + Duration::from_secs(3);
    while !files_in(&snap_dir(&ms[behind])).is_empty() {
        let left = files_in(&snap_dir(&ms[behind]));
        assert!(Instant::now() < deadline, "received files stay: {left:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The partial file the member is receiving into, once it holds at least `bytes`.
async fn partial_file(m: &Member, bytes: u64) -> PathBuf {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let part = files_in(&snap_dir(m)).into_iter().find(|p| {
            p.extension().is_some_and(|e| e == "part")
                && std::fs::metadata(p).is_ok_and(|md| md.len() >= bytes)
        });
        if let Some(p) = part {
            return p;
        }
        assert!(Instant::now() < deadline, "no partial snapshot file appeared");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_stopped_while_receiving_or_before_removing_an_image_restarts_clean() {
    let mut ms = configs("crash", 512 << 10);
    ms.iter_mut().for_each(start);
    let l = leader(&ms);
    let behind = (l + 1) % 3;
    let before = {
        fill_while_away(&mut ms, behind, l).await;
        eng(&ms[l]).status().revision
    };
    // Stopped halfway through receiving: the partial file stays, the old state is intact.
    start(&mut ms[behind]);
    let part = partial_file(&ms[behind], 256 << 10).await;
    stop(&mut ms[behind]);
    assert!(part.exists(), "the partial image is kept to resume from");
    // A complete image left by a crash before (or after) its install is no one's any more.
    let left = snap_dir(&ms[behind]).join("1-2-3-4.snap");
    std::fs::write(&left, b"an image whose message is forgotten").expect("plant a file");
    start(&mut ms[behind]);
    assert!(!left.exists(), "a complete image left by a crash is removed at start");
    assert!(eng(&ms[behind]).status().revision < before, "nothing was installed halfway");
    caught_up(&ms, behind, l, Duration::from_secs(20)).await;
    let rev = eng(&ms[l]).status().revision;
    let hash = |m: &Member| eng(m).hash_kv(rev).expect("a hash").hash;
    assert_eq!(hash(&ms[behind]), hash(&ms[l]), "the restarted member holds the leader's state");
    let deadline = Instant::now() + Duration::from_secs(3);
    while !files_in(&snap_dir(&ms[behind])).is_empty() {
        let left = files_in(&snap_dir(&ms[behind]));
        assert!(Instant::now() < deadline, "received files stay: {left:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
