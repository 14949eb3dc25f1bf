//! etcd's periodic corruption check across members: three servers in this process, one of
//! whose stores is changed behind its back while it is stopped; the leader's check finds the
//! divergence, raises CORRUPT for that member through Raft, and every member refuses writes.

use std::time::{Duration, Instant};

use cairn::{EngineConfig, ServeConfig};
use cairn_kv::backend::{Backend, BackendView, Record, WriteBatch};
use cairn_kv::RevisionId;
use cairn_node::cluster::{ClusterConfig, ClusterState};
use cairn_proto::etcdserverpb as pb;
use pb::kv_client::KvClient;
use pb::maintenance_client::MaintenanceClient;
use tonic::transport::Channel;

struct Member {
    cfg: ServeConfig,
    client: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<()>>,
}

impl Member {
    fn start(&mut self) {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let cfg = self.cfg.clone();
        self.done = Some(tokio::spawn(async move {
            let _ = cairn::serve(cfg, async move {
                let _ = stopped.await;
            })
            .await;
        }));
        self.stop = Some(stop);
    }

    async fn stop(&mut self) {
        drop(self.stop.take());
        if let Some(done) = self.done.take() {
            tokio::time::timeout(Duration::from_secs(20), done)
                .await
                .expect("the server stops in time")
                .expect("the server task ends");
        }
    }
}

fn free_ports(n: usize) -> Vec<u16> {
    let ls: Vec<_> =
        (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind")).collect();
    ls.iter().map(|l| l.local_addr().expect("addr").port()).collect()
}

fn members(dir: &std::path::Path) -> Vec<Member> {
    let ports = free_ports(6);
    let url = |p: u16| format!("http://127.0.0.1:{p}");
    let initial: Vec<String> = (0..3).map(|i| format!("m{i}={}", url(ports[3 + i]))).collect();
    let initial = initial.join(",");
    (0..3)
        .map(|i| {
            let name = format!("m{i}");
            let peer = vec![url(ports[3 + i])];
            let mut engine = EngineConfig::new(&name, dir.join(&name));
            engine.tick_interval = Duration::from_millis(20);
            // The leader's check asks the others at the client URLs they publish.
            engine.advertise_client_urls = vec![url(ports[i])];
            let cluster = ClusterConfig::from_flags(
                &name,
                &initial,
                "corrupt",
                &peer,
                &peer,
                ClusterState::New,
            );
            engine.cluster = Some(cluster.expect("cluster flags"));
            let mut cfg = ServeConfig::new(engine, vec![url(ports[i])]);
            cfg.advertise_peer_urls = peer;
            cfg.corrupt_check_interval = Some(Duration::from_millis(200));
            Member { cfg, client: url(ports[i]), stop: None, done: None }
        })
        .collect()
}

async fn put(url: &str, key: &str) -> Result<(), tonic::Status> {
    let mut kv: KvClient<Channel> = KvClient::connect(url.to_string())
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let req = pb::PutRequest { key: key.into(), value: b"v".to_vec(), ..Default::default() };
    kv.put(req).await.map(drop)
}

/// Retries `put` until it is answered (the cluster may still be electing).
async fn put_retrying(url: &str, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = put(url, key).await {
        assert!(Instant::now() < deadline, "put {key} on {url}: {e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn alarms(url: &str) -> Vec<pb::AlarmMember> {
    let mut m = MaintenanceClient::connect(url.to_string()).await.expect("connect");
    let req = pb::AlarmRequest { action: 0, member_id: 0, alarm: 0 };
    m.alarm(req).await.expect("alarm list").into_inner().alarms
}

async fn member_id(url: &str) -> u64 {
    let mut m = MaintenanceClient::connect(url.to_string()).await.expect("connect");
    let status = m.status(pb::StatusRequest {}).await.expect("status").into_inner();
    status.header.expect("a header").member_id
}

/// Changes the value of one record in the stopped member's database, as a disk that flips
/// bits or a bug that writes the wrong value would.
fn plant_divergence(cfg: &EngineConfig) {
    let db = cfg.data_dir.join("member").join("db");
    // `serve` returned, so the database is closed: opening it here must work at once.
    let backend = cairn_storage::lmdb::LmdbBackend::open(&db, cfg.map_bytes()).expect("open");
    let mut found: Option<(RevisionId, Record)> = None;
    backend
        .view()
        .expect("a view")
        .scan(RevisionId::default(), &mut |rev, record| {
            found = Some((rev, record));
            false
        })
        .expect("scan");
    let (rev, mut record) = found.expect("a record to change");
    record.value = bytes::Bytes::from_static(b"planted");
    let batch = WriteBatch { puts: vec![(rev, record.encode())], ..WriteBatch::default() };
    backend.commit(batch).expect("commit the planted change");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_divergence_raises_corrupt_and_writes_are_refused() {
    let dir = std::env::temp_dir().join(format!("cairn-corrupt-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut ms = members(&dir);
    ms.iter_mut().for_each(Member::start);
    for i in 0..10 {
        put_retrying(&ms[i % 3].client, &format!("k{i}")).await;
    }
    // Rounds of the check pass over identical stores without an alarm.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(alarms(&ms[0].client).await.is_empty());

    let victim_id = member_id(&ms[2].client).await;
    ms[2].stop().await;
    plant_divergence(&ms[2].cfg.engine);
    ms[2].start();
    let deadline = Instant::now() + Duration::from_secs(30);
    let raised = loop {
        // A write moves the leader's revision, so the next round hashes a revision the restarted
        // member has reached.
        let _ = put(&ms[0].client, "tick").await;
        let raised = alarms(&ms[0].client).await;
        if !raised.is_empty() {
            break raised;
        }
        assert!(Instant::now() < deadline, "no CORRUPT alarm within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let corrupt = pb::AlarmMember { member_id: victim_id, alarm: pb::AlarmType::Corrupt as i32 };
    assert_eq!(raised, vec![corrupt]);
    for m in &ms {
        let refused = put(&m.client, "after").await.expect_err("a write under CORRUPT");
        assert_eq!(refused.code(), tonic::Code::DataLoss, "{refused:?}");
        assert_eq!(refused.message(), "etcdserver: corrupt cluster");
    }
    for m in &mut ms {
        m.stop().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
