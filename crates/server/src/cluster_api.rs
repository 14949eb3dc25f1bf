//! The etcd Cluster service: MemberList on any member; MemberAdd, MemberRemove, MemberUpdate and
//! MemberPromote decided by the leader (a follower forwards them to the leader's client URL, as
//! published through the log, the way etcd forwards a promotion).

use cairn_node::{EngineError, Member};
use cairn_proto::etcdserverpb as pb;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::errors::{no_leader, status};
use crate::services::Ctx;

fn to_pb(m: Member) -> pb::Member {
    pb::Member {
        id: m.id,
        name: m.name,
        peer_ur_ls: m.peer_urls,
        client_ur_ls: m.client_urls,
        is_learner: m.is_learner,
    }
}

impl Ctx {
    /// Every member as this one knows them; its own name and URLs from its flags.
    fn members(&self) -> Vec<pb::Member> {
        let (_, me) = self.engine.identity();
        let mine = |mut m: pb::Member| {
            if m.id == me {
                m.name.clone_from(&self.engine.config().name);
                m.client_ur_ls.clone_from(&self.engine.config().advertise_client_urls);
                if !self.peer_urls.is_empty() {
                    m.peer_ur_ls.clone_from(&self.peer_urls);
                }
            }
            m
        };
        if self.engine.config().cluster.is_none() {
            return vec![mine(pb::Member { id: me, ..pb::Member::default() })];
        }
        self.engine.member_list().into_iter().map(to_pb).map(mine).collect()
    }

    /// The leader's Cluster service, when another member leads; `None` when this one does.
    fn cluster_leader(&self) -> Result<Option<pb::cluster_client::ClusterClient<Channel>>, Status> {
        let leader = self.engine.leader().ok_or_else(no_leader)?;
        if leader == self.engine.identity().1 {
            return Ok(None);
        }
        let url = self
            .engine
            .members()
            .remove(&leader)
            .and_then(|a| a.client_urls.into_iter().next())
            .ok_or_else(no_leader)?;
        Ok(Some(pb::cluster_client::ClusterClient::new(self.leader_channels.get(&url)?)))
    }

    fn done(&self) -> (Option<pb::ResponseHeader>, Vec<pb::Member>) {
        (self.header().at(self.engine.revision()), self.members())
    }
}

fn refused(e: EngineError) -> Status {
    status(e)
}

#[tonic::async_trait]
impl pb::cluster_server::Cluster for Ctx {
    async fn member_list(
        &self,
        req: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        self.check_leader(&req)?;
        // etcd 3.5 waits for a read barrier when asked (its Go client always asks): the list
        // then reflects every membership change committed before the call, on any member.
        if req.get_ref().linearizable {
            self.engine.read_barrier().await.map_err(status)?;
        }
        let (header, members) = self.done();
        Ok(Response::new(pb::MemberListResponse { header, members }))
    }

    async fn member_add(
        &self,
        req: Request<pb::MemberAddRequest>,
    ) -> Result<Response<pb::MemberAddResponse>, Status> {
        if let Some(mut leader) = self.cluster_leader()? {
            return leader.member_add(req.into_inner()).await;
        }
        let r = req.into_inner();
        let added = self.engine.member_add(r.peer_ur_ls, r.is_learner).await.map_err(refused)?;
        let (header, members) = self.done();
        Ok(Response::new(pb::MemberAddResponse { header, member: Some(to_pb(added)), members }))
    }

    async fn member_remove(
        &self,
        req: Request<pb::MemberRemoveRequest>,
    ) -> Result<Response<pb::MemberRemoveResponse>, Status> {
        if let Some(mut leader) = self.cluster_leader()? {
            return leader.member_remove(req.into_inner()).await;
        }
        self.engine.member_remove(req.into_inner().id).await.map_err(refused)?;
        let (header, members) = self.done();
        Ok(Response::new(pb::MemberRemoveResponse { header, members }))
    }

    async fn member_update(
        &self,
        req: Request<pb::MemberUpdateRequest>,
    ) -> Result<Response<pb::MemberUpdateResponse>, Status> {
        if let Some(mut leader) = self.cluster_leader()? {
            return leader.member_update(req.into_inner()).await;
        }
        let r = req.into_inner();
        self.engine.member_update(r.id, r.peer_ur_ls).await.map_err(refused)?;
        let (header, members) = self.done();
        Ok(Response::new(pb::MemberUpdateResponse { header, members }))
    }

    async fn member_promote(
        &self,
        req: Request<pb::MemberPromoteRequest>,
    ) -> Result<Response<pb::MemberPromoteResponse>, Status> {
        if let Some(mut leader) = self.cluster_leader()? {
            return leader.member_promote(req.into_inner()).await;
        }
        self.engine.member_promote(req.into_inner().id).await.map_err(refused)?;
        let (header, members) = self.done();
        Ok(Response::new(pb::MemberPromoteResponse { header, members }))
    }
}
