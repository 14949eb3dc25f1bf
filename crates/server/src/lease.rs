//! The etcd Lease service. Grants and revokes go through Raft on any member; keepalives and
//! TimeToLive need the leader's clock, so a follower forwards them to the leader's client URL
//! (as published through the log), as etcd forwards them to its leader.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cairn_kv::{KvError, LeaseId};
use cairn_node::EngineError;
use cairn_proto::etcdserverpb as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use crate::errors::status;
use crate::services::{BoxStream, Ctx};

/// Connections to leaders, by client URL, reused across forwarded calls.
#[derive(Clone, Debug, Default)]
pub struct LeaderChannels(Arc<Mutex<HashMap<String, Channel>>>);

impl LeaderChannels {
    fn get(&self, url: &str) -> Result<Channel, Status> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = map.get(url) {
            return Ok(c.clone());
        }
        let endpoint = Channel::from_shared(url.to_string())
            .map_err(|e| Status::unavailable(format!("leader URL {url}: {e}")))?
            .connect_timeout(std::time::Duration::from_secs(2));
        let channel = endpoint.connect_lazy();
        map.insert(url.to_string(), channel.clone());
        Ok(channel)
    }
}

impl Ctx {
    /// A client of the leader's Lease service, when this member knows who leads and where.
    fn leader_lease_client(&self) -> Result<pb::lease_client::LeaseClient<Channel>, Status> {
        let leader = self.engine.leader().ok_or_else(crate::errors::no_leader)?;
        let url = self
            .engine
            .members()
            .remove(&leader)
            .and_then(|a| a.client_urls.into_iter().next())
            .ok_or_else(crate::errors::no_leader)?;
        Ok(pb::lease_client::LeaseClient::new(self.leader_channels.get(&url)?))
    }

    /// One keepalive: here if this member leads, else forwarded to the leader.
    async fn keep_alive_once(&self, id: i64) -> Result<pb::LeaseKeepAliveResponse, Status> {
        // etcd's header carries the revision read before the renewal.
        let revision = self.engine.revision();
        match self.engine.lease_keep_alive(LeaseId(id)).await {
            Ok(ttl) => {
                Ok(pb::LeaseKeepAliveResponse { header: self.header().at(revision), id, ttl })
            }
            // Not an error on the stream: TTL 0 tells the client the lease is gone.
            Err(EngineError::Kv(KvError::LeaseNotFound)) => {
                Ok(pb::LeaseKeepAliveResponse { header: self.header().at(revision), id, ttl: 0 })
            }
            Err(EngineError::NotLeader) => {
                let mut leader = self.leader_lease_client()?;
                let (tx, rx) = mpsc::channel(1);
                let _ = tx.send(pb::LeaseKeepAliveRequest { id }).await;
                drop(tx);
                let mut responses =
                    leader.lease_keep_alive(ReceiverStream::new(rx)).await?.into_inner();
                responses
                    .message()
                    .await?
                    .ok_or_else(|| Status::unavailable("the leader closed the keepalive"))
            }
            Err(e) => Err(status(e)),
        }
    }
}

#[tonic::async_trait]
impl pb::lease_server::Lease for Ctx {
    async fn lease_grant(
        &self,
        req: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        self.check_leader(&req)?;
        let r = req.into_inner();
        let (lease, revision) =
            self.engine.lease_grant(LeaseId(r.id), r.ttl).await.map_err(status)?;
        Ok(Response::new(pb::LeaseGrantResponse {
            header: self.header().at(revision),
            id: lease.id.0,
            ttl: lease.ttl,
            error: String::new(),
        }))
    }

    async fn lease_revoke(
        &self,
        req: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        self.check_leader(&req)?;
        let revision =
            self.engine.lease_revoke(LeaseId(req.into_inner().id)).await.map_err(status)?;
        Ok(Response::new(pb::LeaseRevokeResponse { header: self.header().at(revision) }))
    }

    type LeaseKeepAliveStream = BoxStream<pb::LeaseKeepAliveResponse>;

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        self.check_leader(&req)?;
        let mut requests = crate::streams::read_ahead(req.into_inner());
        let (tx, rx) = mpsc::channel(4);
        let ctx = self.clone();
        tokio::spawn(async move {
            let stopping = crate::streams::stopped(ctx.stopping.clone());
            tokio::pin!(stopping);
            loop {
                let next = tokio::select! {
                    () = &mut stopping => {
                        let _ = tx.send(Err(crate::errors::server_stopped())).await;
                        return;
                    }
                    next = requests.recv() => next,
                };
                let resp = match next {
                    Some(Ok(req)) => ctx.keep_alive_once(req.id).await,
                    // A request that does not decode fails the stream.
                    Some(Err(e)) => Err(e),
                    None => return,
                };
                let failed = resp.is_err();
                if tx.send(resp).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn lease_time_to_live(
        &self,
        req: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        self.check_leader(&req)?;
        let r = req.into_inner();
        match self.engine.lease_time_to_live(LeaseId(r.id), r.keys).await {
            Ok(t) => Ok(Response::new(pb::LeaseTimeToLiveResponse {
                header: self.header().at(t.revision),
                id: r.id,
                ttl: t.ttl,
                granted_ttl: t.granted_ttl,
                keys: t.keys.into_iter().map(|k| k.to_vec()).collect(),
            })),
            Err(EngineError::NotLeader) => self.leader_lease_client()?.lease_time_to_live(r).await,
            Err(e) => Err(status(e)),
        }
    }

    async fn lease_leases(
        &self,
        req: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        self.check_leader(&req)?;
        let leases =
            self.engine.leases().into_iter().map(|l| pb::LeaseStatus { id: l.id.0 }).collect();
        let revision = self.engine.revision();
        Ok(Response::new(pb::LeaseLeasesResponse { header: self.header().at(revision), leases }))
    }
}
