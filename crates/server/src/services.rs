//! The etcd v3 gRPC services over the engine.

use std::pin::Pin;
use std::sync::Arc;

use cairn_kv::CompactRequest;
use cairn_node::Engine;
use cairn_proto::etcdserverpb as pb;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::auth::auth_status;
use crate::convert::{self, Header};
use crate::errors::{no_leader, not_yet, status};
use crate::large_response;
use crate::range_budget::{self, RangeBudget};

/// The etcd version cairn reports. Clients gate features on it: Kubernetes enables watch
/// progress requests only for 3.4.25+ outside 3.5.0–3.5.7, so report a current 3.6 release.
pub const ETCD_COMPATIBLE_VERSION: &str = "3.6.5";

/// What the services share.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub engine: Arc<Engine>,
    pub peer_urls: Vec<String>,
    /// How often idle watchers that asked for it get a progress notice.
    pub watch_progress_interval: std::time::Duration,
    /// Becomes true when the server stops; long-lived streams end then.
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// Connections to the leader, for the calls a follower forwards (keepalives, TTLs).
    pub leader_channels: crate::lease::LeaderChannels,
    /// The bytes large Range responses in flight may take.
    pub range_budget: RangeBudget,
    /// The low-priority threads that count, read and encode large ranges.
    pub bulk: Arc<crate::bulk::BulkPool>,
    /// How callers are identified once auth is on.
    pub(crate) authn: crate::auth::Authn,
}

/// The response header of this member now.
pub(crate) fn header(engine: &Engine) -> Header {
    let s = engine.identity();
    Header { cluster_id: s.0, member_id: s.1, raft_term: engine.raft_term() }
}

impl Ctx {
    pub(crate) fn header(&self) -> Header {
        header(&self.engine)
    }

    /// Honours the `hasleader` metadata etcd clients send (`WithRequireLeader`).
    pub(crate) fn check_leader<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let wants = req.metadata().get("hasleader").is_some_and(|v| v.as_bytes() == b"true");
        if wants && self.engine.leader().is_none() {
            return Err(no_leader());
        }
        Ok(())
    }

    /// Runs `work` on the bulk threads (bulk.rs), with the engine.
    async fn bulk<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Engine) -> Result<T, cairn_node::EngineError> + Send + 'static,
    ) -> Result<T, Status> {
        let engine = self.engine.clone();
        self.bulk.run(move || work(&engine)).await?.map_err(status)
    }
}

#[tonic::async_trait]
impl pb::kv_server::Kv for Ctx {
    async fn range(
        &self,
        req: Request<pb::RangeRequest>,
    ) -> Result<Response<pb::RangeResponse>, Status> {
        self.check_leader(&req)?;
        let caller = self.caller(&req)?;
        let req = convert::range_req(req.into_inner()).map_err(|e| status(e.into()))?;
        if let Some(c) = &caller {
            self.engine.auth_state().check_range(c, &req).map_err(auth_status)?;
        }
        let plan = self.engine.range_begin(req).await.map_err(status)?;
        if plan.is_read() {
            let r = self.engine.range_read(plan).await.map_err(status)?;
            return Ok(Response::new(self.header().range(r)));
        }
        // A large range is counted, read and encoded on the bulk threads: each is tens of
        // milliseconds of CPU that the runtime's threads (one, on a 2-core machine) would
        // otherwise take from every small request (bulk.rs says why not the blocking pool;
        // a yielding task would share one runtime thread's queue). Its answer is read only
        // once its bytes fit in the budget, and they stay charged until the response is sent.
        let plan = match plan.is_planned() {
            true => plan,
            false => self.bulk(move |engine| engine.range_plan_blocking(plan)).await?,
        };
        let charge = self.range_budget.charge(plan.bytes(), range_budget::MAX_WAIT).await?;
        let header = self.header();
        let encoded = self
            .bulk(move |engine| {
                let r = engine.range_read_blocking(plan)?;
                Ok(large_response::encode_range(&header, r))
            })
            .await??;
        // tonic sends a placeholder; the layer in large_response.rs sends the encoded bytes.
        let mut resp = Response::new(pb::RangeResponse::default());
        resp.extensions_mut().insert(encoded.holding(charge));
        Ok(resp)
    }

    async fn put(&self, req: Request<pb::PutRequest>) -> Result<Response<pb::PutResponse>, Status> {
        self.check_leader(&req)?;
        let caller = self.caller(&req)?;
        let put = convert::put_req(req.into_inner());
        let r = self.engine.put_as(caller, put).await.map_err(status)?;
        Ok(Response::new(self.header().put(r)))
    }

    async fn delete_range(
        &self,
        req: Request<pb::DeleteRangeRequest>,
    ) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        self.check_leader(&req)?;
        let caller = self.caller(&req)?;
        let delete = convert::delete_req(req.into_inner());
        let r = self.engine.delete_range_as(caller, delete).await.map_err(status)?;
        Ok(Response::new(self.header().delete(r)))
    }

    async fn txn(&self, req: Request<pb::TxnRequest>) -> Result<Response<pb::TxnResponse>, Status> {
        self.check_leader(&req)?;
        let caller = self.caller(&req)?;
        let txn = convert::txn_req(req.into_inner()).map_err(|e| status(e.into()))?;
        let r = self.engine.txn_as(caller, txn).await.map_err(status)?;
        Ok(Response::new(self.header().txn(r)))
    }

    async fn compact(
        &self,
        req: Request<pb::CompactionRequest>,
    ) -> Result<Response<pb::CompactionResponse>, Status> {
        self.check_leader(&req)?;
        let r = req.into_inner();
        let c = CompactRequest { revision: cairn_kv::Revision(r.revision), physical: r.physical };
        let resp = self.engine.compact(c).await.map_err(status)?;
        Ok(Response::new(pb::CompactionResponse { header: self.header().at(resp.revision) }))
    }

    type RangeStreamStream = BoxStream<pb::RangeStreamResponse>;

    async fn range_stream(
        &self,
        req: Request<pb::RangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        self.check_leader(&req)?;
        let caller = self.caller(&req)?;
        let req = convert::range_req(req.into_inner()).map_err(|e| status(e.into()))?;
        if let Some(c) = &caller {
            self.engine.auth_state().check_range(c, &req).map_err(auth_status)?;
        }
        crate::range_stream::start(self.clone(), req).await
    }
}

pub(crate) type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl pb::maintenance_server::Maintenance for Ctx {
    async fn alarm(
        &self,
        req: Request<pb::AlarmRequest>,
    ) -> Result<Response<pb::AlarmResponse>, Status> {
        crate::alarm::alarm(self, req.into_inner()).await
    }

    async fn status(
        &self,
        _req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let s = self.engine.status();
        Ok(Response::new(pb::StatusResponse {
            header: self.header().at(s.revision),
            version: ETCD_COMPATIBLE_VERSION.into(),
            db_size: s.db_size_bytes as i64,
            leader: s.leader.unwrap_or(0),
            raft_index: s.raft_index,
            raft_term: s.raft_term,
            raft_applied_index: s.raft_applied_index,
            errors: crate::alarm::status_errors(&s, &self.engine.raised_alarms()),
            db_size_in_use: s.db_size_in_use_bytes as i64,
            is_learner: self.engine.is_learner(),
            storage_version: "3.6.0".into(),
            db_size_quota: self.engine.config().quota_backend_bytes.unwrap_or(0) as i64,
        }))
    }

    async fn defragment(
        &self,
        _: Request<pb::DefragmentRequest>,
    ) -> Result<Response<pb::DefragmentResponse>, Status> {
        self.engine.defragment().await.map_err(status)?;
        let rev = self.engine.revision();
        Ok(Response::new(pb::DefragmentResponse { header: self.header().at(rev) }))
    }

    async fn hash(
        &self,
        _: Request<pb::HashRequest>,
    ) -> Result<Response<pb::HashResponse>, Status> {
        let (hash, rev) = self.engine.hash().map_err(status)?;
        Ok(Response::new(pb::HashResponse { header: self.header().at(rev), hash }))
    }

    async fn hash_kv(
        &self,
        req: Request<pb::HashKvRequest>,
    ) -> Result<Response<pb::HashKvResponse>, Status> {
        self.check_admin(&req)?;
        let rev = cairn_kv::Revision(req.into_inner().revision);
        let h = self.engine.hash_kv(rev).map_err(status)?;
        let current = self.engine.revision();
        Ok(Response::new(pb::HashKvResponse {
            header: self.header().at(current),
            hash: h.hash,
            compact_revision: h.compact_revision.0,
            hash_revision: h.revision.0,
        }))
    }

    type SnapshotStream = BoxStream<pb::SnapshotResponse>;

    async fn snapshot(
        &self,
        _: Request<pb::SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        Ok(Response::new(crate::snapshot::start(
            self.engine.clone(),
            self.header(),
            self.stopping.clone(),
        )))
    }

    async fn move_leader(
        &self,
        req: Request<pb::MoveLeaderRequest>,
    ) -> Result<Response<pb::MoveLeaderResponse>, Status> {
        self.engine.move_leader(req.into_inner().target_id).await.map_err(status)?;
        let rev = self.engine.revision();
        Ok(Response::new(pb::MoveLeaderResponse { header: self.header().at(rev) }))
    }

    async fn downgrade(
        &self,
        _: Request<pb::DowngradeRequest>,
    ) -> Result<Response<pb::DowngradeResponse>, Status> {
        Err(not_yet("Maintenance.Downgrade"))
    }
}
