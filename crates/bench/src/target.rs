//! Where requests go: an etcd v3 endpoint over gRPC, or an embedded cairn engine.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
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

/// An in-process engine: what cairn costs without gRPC.
#[derive(Clone, Debug)]
pub struct Embedded(pub Arc<Engine>);

impl Embedded {
    pub fn open(dir: &std::path::Path) -> Result<Embedded, String> {
        Engine::open(EngineConfig::new("bench", dir))
            .map(|e| Embedded(Arc::new(e)))
            .map_err(|e| e.to_string())
    }
}

impl Target for Embedded {
    async fn put(&self, _: usize, key: Vec<u8>, value: Vec<u8>) -> Result<(), OpError> {
        let req = cairn_kv::PutRequest {
            key: Bytes::from(key),
            value: Bytes::from(value),
            ..Default::default()
        };
        self.0.put(req).await.map(|_| ()).map_err(|e| e.to_string())
    }

    async fn range(&self, _: usize, key: Vec<u8>, serializable: bool) -> Result<(), OpError> {
        let req =
            cairn_kv::RangeRequest { key: Bytes::from(key), serializable, ..Default::default() };
        self.0.range(req).await.map(|_| ()).map_err(|e| e.to_string())
    }

    async fn txn_put(&self, _: usize, key: Vec<u8>, value: Vec<u8>) -> Result<(), OpError> {
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
        self.0.txn(req).await.map(|_| ()).map_err(|e| e.to_string())
    }
}
