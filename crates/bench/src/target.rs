//! Where requests go: an etcd v3 endpoint over gRPC, or an embedded cairn engine.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_node::cluster::{ClusterConfig, ClusterState};
use cairn_node::{Engine, EngineConfig};
use cairn_proto::etcdserverpb as pb;
use tonic::transport::{Channel, Endpoint};

/// A failed request, summarised for counting.
pub type OpError = String;

/// The operations the workloads need.
pub trait Target: Clone + Send + Sync + 'static {
    fn put(
        &self,
        client: usize,
        key: Vec<u8>,
        value: Vec<u8>,
    ) -> impl Future<Output = Result<(), OpError>> + Send;
    fn range(
        &self,
        client: usize,
        key: Vec<u8>,
        serializable: bool,
    ) -> impl Future<Output = Result<(), OpError>> + Send;
    fn txn_put(
        &self,
        client: usize,
        key: Vec<u8>,
        value: Vec<u8>,
    ) -> impl Future<Output = Result<(), OpError>> + Send;
}

fn url(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    }
}

/// gRPC connections to one endpoint; client `i` uses connection `i % conns`.
#[derive(Clone, Debug)]
pub struct Grpc {
    channels: Arc<Vec<Channel>>,
    pub endpoint: String,
}

pub(crate) fn status_err(s: tonic::Status) -> OpError {
    format!("{:?}: {}", s.code(), s.message())
}

impl Grpc {
    pub async fn connect(endpoint: &str, conns: usize, timeout: Duration) -> Result<Grpc, String> {
        let mut channels = Vec::with_capacity(conns.max(1));
        for _ in 0..conns.max(1) {
            let ch = Endpoint::from_shared(url(endpoint))
                .map_err(|e| format!("{endpoint}: {e}"))?
                .timeout(timeout)
                .connect_timeout(Duration::from_secs(5))
                .tcp_nodelay(true)
                .connect()
                .await
                .map_err(|e| format!("cannot connect to {endpoint}: {e}"))?;
            channels.push(ch);
        }
        Ok(Grpc { channels: Arc::new(channels), endpoint: endpoint.to_string() })
    }

    pub fn channel(&self, client: usize) -> Channel {
        self.channels[client % self.channels.len()].clone()
    }

    fn kv(&self, client: usize) -> pb::kv_client::KvClient<Channel> {
        pb::kv_client::KvClient::new(self.channel(client))
    }

    /// The server's Maintenance.Status: (version, member id, leader id).
    pub async fn status(&self) -> Result<(String, u64, u64), OpError> {
        let mut m = pb::maintenance_client::MaintenanceClient::new(self.channel(0));
        let s = m.status(pb::StatusRequest {}).await.map_err(status_err)?.into_inner();
        let member = s.header.map_or(0, |h| h.member_id);
        Ok((s.version, member, s.leader))
    }
}

impl Target for Grpc {
    async fn put(&self, client: usize, key: Vec<u8>, value: Vec<u8>) -> Result<(), OpError> {
        let req = pb::PutRequest { key, value, ..Default::default() };
        self.kv(client).put(req).await.map(|_| ()).map_err(status_err)
    }

    async fn range(&self, client: usize, key: Vec<u8>, serializable: bool) -> Result<(), OpError> {
        let req = pb::RangeRequest { key, serializable, ..Default::default() };
        self.kv(client).range(req).await.map(|_| ()).map_err(status_err)
    }

    async fn txn_put(&self, client: usize, key: Vec<u8>, value: Vec<u8>) -> Result<(), OpError> {
        let put = pb::RequestOp {
            request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                key,
                value,
                ..Default::default()
            })),
        };
        let req = pb::TxnRequest { compare: vec![], success: vec![put], failure: vec![] };
        self.kv(client).txn(req).await.map(|_| ()).map_err(status_err)
    }
}

/// Engines in this process: what cairn costs without gRPC. One engine, or the members of one
/// cluster with client `i` on member `i % members`.
#[derive(Clone, Debug)]
pub struct Embedded {
    engines: Arc<Vec<Engine>>,
}

/// The cluster token of `--members` clusters (it seeds the member and cluster ids).
const CLUSTER_TOKEN: &str = "cairn-bench";

impl Embedded {
    /// One engine with its data in `dir`, as `--embedded` has always run.
    pub fn open(dir: &Path) -> Result<Embedded, String> {
        let engine = Engine::open(EngineConfig::new("bench", dir)).map_err(|e| e.to_string())?;
        Ok(Embedded { engines: Arc::new(vec![engine]) })
    }

    /// `members` engines founding one cluster over loopback peer connections, with their data
    /// in `dir/m0`, `dir/m1`, ... and every other setting at its default (fsync on); returns
    /// once every member sees the same leader, so that the first requests find one.
    pub async fn open_cluster(dir: &Path, members: usize) -> Result<Embedded, String> {
        let mut engines = Vec::with_capacity(members);
        for cfg in cluster_configs(dir, members)? {
            let at = cfg.data_dir.display().to_string();
            engines.push(Engine::open(cfg).map_err(|e| format!("{at}: {e}"))?);
        }
        let target = Embedded { engines: Arc::new(engines) };
        if let Err(e) = target.agreed_leader(Duration::from_secs(30)).await {
            target.stop();
            return Err(e);
        }
        Ok(target)
    }

    /// Waits until every member names the same leader.
    async fn agreed_leader(&self, within: Duration) -> Result<u64, String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let seen: Vec<Option<u64>> = self.engines.iter().map(Engine::leader).collect();
            if let Some(Some(l)) = seen.first() {
                if seen.iter().all(|s| *s == Some(*l)) {
                    return Ok(*l);
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("the members agreed on no leader within {within:?}: {seen:?}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The members, in order.
    pub fn members(&self) -> usize {
        self.engines.len()
    }

    fn engine(&self, client: usize) -> &Engine {
        &self.engines[client % self.engines.len()]
    }

    /// Stops every member.
    pub fn stop(&self) {
        self.engines.iter().for_each(Engine::stop);
    }
}

/// The members' configurations: `m0=http://127.0.0.1:<port>,...` as etcd's `--initial-cluster`,
/// on free loopback ports.
fn cluster_configs(dir: &Path, members: usize) -> Result<Vec<EngineConfig>, String> {
    // A member's data binds it to its peer URLs, which are new ports on every run: a directory
    // from an earlier run cannot found this cluster.
    for i in 0..members {
        let member = dir.join(format!("m{i}")).join("member");
        if member.exists() {
            return Err(format!(
                "{} holds a member of an earlier cluster: --members founds a new cluster, \
                 give it an empty directory",
                member.display()
            ));
        }
    }
    // Bound together so that they differ, then released for the engines to bind.
    let probes = (0..members)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("finding free loopback ports: {e}"))?;
    let urls = probes
        .iter()
        .map(|l| l.local_addr().map(|a| format!("http://{a}")))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("finding free loopback ports: {e}"))?;
    drop(probes);
    let initial: Vec<String> = urls.iter().enumerate().map(|(i, u)| format!("m{i}={u}")).collect();
    let initial = initial.join(",");
    let mut configs = Vec::with_capacity(members);
    for (i, url) in urls.iter().enumerate() {
        let name = format!("m{i}");
        let url = std::slice::from_ref(url);
        let cluster =
            ClusterConfig::from_flags(&name, &initial, CLUSTER_TOKEN, url, url, ClusterState::New)
                .map_err(|e| e.to_string())?;
        let mut cfg = EngineConfig::new(&name, dir.join(&name));
        cfg.cluster = Some(cluster);
        configs.push(cfg);
    }
    Ok(configs)
}

impl Target for Embedded {
    async fn put(&self, client: usize, key: Vec<u8>, value: Vec<u8>) -> Result<(), OpError> {
        let req = cairn_kv::PutRequest {
            key: Bytes::from(key),
            value: Bytes::from(value),
            ..Default::default()
        };
        self.engine(client).put(req).await.map(|_| ()).map_err(|e| e.to_string())
    }

    async fn range(&self, client: usize, key: Vec<u8>, serializable: bool) -> Result<(), OpError> {
        let req =
            cairn_kv::RangeRequest { key: Bytes::from(key), serializable, ..Default::default() };
        self.engine(client).range(req).await.map(|_| ()).map_err(|e| e.to_string())
    }

    async fn txn_put(&self, client: usize, key: Vec<u8>, value: Vec<u8>) -> Result<(), OpError> {
        let put = cairn_kv::PutRequest {
            key: Bytes::from(key),
            value: Bytes::from(value),
            ..Default::default()
        };
        let req = cairn_kv::TxnRequest {
            compare: vec![],
            success: vec![cairn_kv::RequestOp::Put(put)],
            failure: vec![],
        };
        self.engine(client).txn(req).await.map(|_| ()).map_err(|e| e.to_string())
    }
}
