//! The snapshot file: framed as etcdctl expects, every prefix and every flipped byte refused,
//! and one file restores into the members of a new cluster with the ids their flags give.

use bytes::Bytes;
use cairn_kv::PutRequest;
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

#[tokio::test]
async fn one_file_restores_the_members_of_a_new_cluster() {
    let file = snapshot_file("cluster", 4096).await;
    let initial = "a=http://127.0.0.1:1,b=http://127.0.0.1:2,c=http://127.0.0.1:3";
    let work = temp_dir("cluster-restore");
    let mut cluster_ids = Vec::new();
    for (name, url) in
        [("a", "http://127.0.0.1:1"), ("b", "http://127.0.0.1:2"), ("c", "http://127.0.0.1:3")]
    {
        let urls = vec![url.to_string()];
        let cluster =
            ClusterConfig::from_flags(name, initial, "tok", &urls, &urls, ClusterState::New)
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
        cluster_ids.push(done.cluster_id);
        // A second restore into the same directory is refused.
        let again = restore(&file, &cfg);
        assert!(matches!(again, Err(RestoreError::NotEmpty(_))), "{again:?}");
    }
    assert!(cluster_ids.windows(2).all(|w| w[0] == w[1]));
    let _ = std::fs::remove_dir_all(&work);
}
