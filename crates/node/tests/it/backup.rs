//! The snapshot file: framed as etcdctl expects, every prefix and every flipped byte refused,
//! and one file restores into the members of a new cluster with the ids their flags give.

use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_kv::{AlarmMember, AlarmType, KeyValue, PutRequest, RangeRequest};
use cairn_node::backup::{open_file, FileError};
use cairn_node::cluster::{ClusterConfig, ClusterState};
use cairn_node::restore::{restore, RestoreConfig, RestoreError};
use cairn_node::{Engine, EngineConfig};

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("cairn-node-backup-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// A snapshot file of a store with a few keys, read in pieces of `chunk` bytes.
async fn snapshot_file(tag: &str, chunk: usize) -> Vec<u8> {
    let dir = temp_dir(tag);
    let engine = Engine::open(EngineConfig::new(tag, &dir)).expect("opens");
    for i in 0..40 {
        let req = PutRequest::new(format!("k{i}"), Bytes::from(vec![b'v'; 200]));
        engine.put(req).await.expect("puts");
    }
    let mut stream = engine.backup().expect("a backup");
    let len = stream.len();
    let mut file = Vec::new();
    while let Some(piece) = stream.next_chunk(chunk).expect("a piece") {
        file.extend_from_slice(&piece);
    }
    assert_eq!(file.len() as u64, len, "the length announced up front");
    file.extend_from_slice(&stream.digest());
    engine.stop();
    let _ = std::fs::remove_dir_all(&dir);
    file
}

#[tokio::test]
async fn every_prefix_and_every_flipped_byte_is_refused() {
    let file = snapshot_file("damage", 1000).await;
    assert_eq!(file.len() % 512, 32, "sectors, then the SHA-256 (etcdctl checks this)");
    let image = open_file(&file, false).expect("the file opens").image;
    cairn_kv::snapshot::decode(image).expect("its image decodes");
    for cut in 0..file.len() {
        assert!(open_file(&file[..cut], false).is_err(), "a prefix of {cut} bytes");
    }
    assert_eq!(open_file(&file[..file.len() - 32], false).map(|_| ()), Err(FileError::MissingHash));
    assert!(open_file(&file[..file.len() - 32], true).is_ok(), "--skip-hash-check");
    for at in 0..file.len() {
        let mut flipped = file.clone();
        flipped[at] ^= 0x01;
        let opened = open_file(&flipped, false);
        assert!(opened.is_err(), "a flipped byte at {at}");
        // Without the digest, the image's own checksum still catches damage to it.
        if let Ok(f) = open_file(&flipped, true) {
            if at >= 24 && at < 24 + f.image.len() {
                assert!(cairn_kv::snapshot::decode(f.image).is_err(), "image byte {at}");
            }
        }
    }
}

/// Free loopback ports, found by binding port 0 (closed again before the members bind them).
fn free_ports(n: usize) -> Vec<u16> {
    let ls: Vec<_> =
        (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind")).collect();
    ls.iter().map(|l| l.local_addr().expect("addr").port()).collect()
}

/// Every key with its revisions, version and value, read linearizably once a leader serves.
async fn read_all(engine: &Engine) -> (i64, Vec<KeyValue>) {
    let req = RangeRequest {
        key: Bytes::from_static(b"\0"),
        range_end: Bytes::from_static(b"\0"),
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match engine.range(req.clone()).await {
            Ok(r) => return (r.revision.0, r.kvs),
            Err(e) if Instant::now() > deadline => panic!("no read within 15 s: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_file_restores_the_members_of_a_new_cluster() {
    let src = temp_dir("cluster-source");
    let engine = Engine::open(EngineConfig::new("src", &src)).expect("opens");
    for i in 0..40 {
        engine.put(PutRequest::new(format!("k{i}"), format!("v{i}"))).await.expect("puts");
    }
    engine.put(PutRequest::new("k1", "again")).await.expect("puts");
    // The file keeps the raised alarms, as etcd's backend file keeps its alarm bucket.
    let alarm = AlarmMember { member: 42, alarm: AlarmType::NoSpace };
    engine.alarm_activate(alarm).await.expect("raises NOSPACE");
    let (revision, expected) = read_all(&engine).await;
    let mut stream = engine.backup().expect("a backup");
    let mut file = Vec::new();
    while let Some(piece) = stream.next_chunk(4096).expect("a piece") {
        file.extend_from_slice(&piece);
    }
    file.extend_from_slice(&stream.digest());
    engine.stop();
    let _ = std::fs::remove_dir_all(&src);

    let ports = free_ports(3);
    let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let initial = format!("a={},b={},c={}", urls[0], urls[1], urls[2]);
    let work = temp_dir("cluster-restore");
    let mut members = Vec::new();
    for (name, url) in ["a", "b", "c"].into_iter().zip(&urls) {
        let url = std::slice::from_ref(url);
        let cluster = ClusterConfig::from_flags(name, &initial, "tok", url, url, ClusterState::New)
            .expect("cluster flags");
        let cfg = RestoreConfig {
            data_dir: work.join(name),
            name: name.into(),
            cluster: Some(cluster.clone()),
            skip_hash_check: false,
        };
        let done = restore(&file, &cfg).expect("restores");
        assert_eq!(done.member_id, cluster.local_id, "the id `cairn serve` derives for {name}");
        assert_eq!(done.cluster_id, cluster.cluster_id);
        assert_eq!(done.meta.applied_index, 3, "the log starts after the three members");
        let again = restore(&file, &cfg);
        assert!(matches!(again, Err(RestoreError::NotEmpty(_))), "{again:?}");
        let mut ecfg = EngineConfig::new(name, &cfg.data_dir);
        ecfg.tick_interval = Duration::from_millis(20);
        ecfg.cluster = Some(cluster);
        members.push(ecfg);
    }
    // The three members start from the restored directories and form the cluster.
    let engines: Vec<Engine> =
        members.into_iter().map(|c| Engine::open(c).expect("a restored member starts")).collect();
    for e in &engines {
        assert_eq!(read_all(e).await, (revision, expected.clone()), "every member has it all");
        assert!(e.raised_alarms().contains(&alarm), "the restore kept the alarm");
    }
    engines[0].alarm_deactivate(alarm).await.expect("disarms");
    let written = engines[0].put(PutRequest::new("after", "x")).await.expect("writes go on");
    assert_eq!(written.revision.0, revision + 1);
    // One cluster, not three: the write reaches every member, and all follow one leader.
    for e in &engines {
        assert_eq!(read_all(e).await.0, revision + 1);
    }
    let leaders: Vec<_> = engines.iter().map(Engine::leader).collect();
    assert!(leaders[0].is_some() && leaders.iter().all(|l| *l == leaders[0]), "{leaders:?}");
    for e in engines {
        e.stop();
    }
    let _ = std::fs::remove_dir_all(&work);
}
