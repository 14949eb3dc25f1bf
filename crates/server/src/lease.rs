//! The etcd Lease service. Grants and revokes go through Raft on any member; keepalives and
//! TimeToLive need the leader's clock, so a follower forwards them to the leader's client URL
//! (as published through the log), as etcd forwards them to its leader.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use cairn_kv::{KvError, LeaseId};
use cairn_node::{EngineError, LeaseConfirmed, LeaseRound};
use cairn_proto::etcdserverpb as pb;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::auth_status;
use crate::errors::status;
use crate::services::{BoxStream, Ctx};

/// Connections to leaders, by client URL, reused across forwarded calls.
#[derive(Clone, Debug, Default)]
pub struct LeaderChannels(Arc<Mutex<HashMap<String, Channel>>>);

impl LeaderChannels {
    pub(crate) fn get(&self, url: &str) -> Result<Channel, Status> {
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

    /// One keepalive whose round confirmed the leadership, answered at once if it can be: by
    /// this member's lease clock, which most are. None: [`Ctx::keep_alive_once`] must answer
    /// it (forwarded to the leader, or left to the driver).
    fn keep_alive_now(
        &self,
        id: i64,
        confirmed: LeaseConfirmed,
    ) -> Option<Result<pb::LeaseKeepAliveResponse, Status>> {
        // etcd's header carries the revision read before the renewal.
        let revision = self.engine.revision();
        let ttl = match self.engine.lease_keep_alive_now(LeaseId(id), confirmed)? {
            Ok(ttl) => ttl,
            // Not an error on the stream: TTL 0 tells the client the lease is gone.
            Err(EngineError::Kv(KvError::LeaseNotFound)) => 0,
            Err(EngineError::NotLeader) => return None,
            Err(e) => return Some(Err(status(e))),
        };
        Some(Ok(pb::LeaseKeepAliveResponse { header: self.header().at(revision), id, ttl }))
    }

    /// One keepalive: here if this member leads, else forwarded to the leader.
    async fn keep_alive_once(&self, id: i64) -> Result<pb::LeaseKeepAliveResponse, Status> {
        let revision = self.engine.revision();
        match self.engine.lease_keep_alive(LeaseId(id)).await {
            Ok(ttl) => {
                Ok(pb::LeaseKeepAliveResponse { header: self.header().at(revision), id, ttl })
            }
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

/// Requests a keepalive stream reads ahead of its answers: reading promptly keeps hyper from
/// closing the connection over unread frames (`streams.rs`).
const READ_AHEAD: usize = 16 * 1024;
/// Keepalives of one stream forwarded or left to the driver at once; the rest wait their turn.
const SLOW_IN_FLIGHT: usize = 64;

type Answer = Result<pb::LeaseKeepAliveResponse, Status>;

/// The answers of one LeaseKeepAlive stream, in the order of its requests. It is the response
/// body itself: whenever hyper polls it, it reads every request that has arrived, takes one
/// ticket for them all for the next round that confirms this member leads (etcd's
/// `ensureLeadership`, shared with every stream: `Engine::lease_round`), and once that round
/// ends renews them on the lease clock, on the connection's own task. A keepalive thus costs no
/// task of its own, no channel and no wake-up beyond the connection's, while a stream with many
/// requests in flight still has them read promptly (see `streams.rs`) and answered
/// in turn. Those that must wait for more (forwarded to the leader, or left to the driver) run
/// as tasks, `SLOW_IN_FLIGHT` at a time, and hold up the answers behind them, so the order is
/// kept.
struct KeepAlives {
    ctx: Ctx,
    /// None once the client's requests ended (or failed: the failure is the last answer).
    requests: Option<Streaming<pb::LeaseKeepAliveRequest>>,
    /// Polled once to register this stream's task, which the stop then wakes; later polls
    /// only read whether the flag changed, since polling the future each time cost 4% of the
    /// server's CPU per keepalive (measured).
    stopping: Pin<Box<dyn Future<Output = ()> + Send>>,
    armed: bool,
    /// Answers in request order; None while one is under way.
    answers: VecDeque<Option<Answer>>,
    /// The sequence number of `answers[0]`.
    first: u64,
    /// Keepalives waiting for their round, in order: (sequence number, lease id, round).
    confirming: VecDeque<(u64, i64, LeaseRound)>,
    /// Keepalives not yet started that must wait: (sequence number, lease id).
    deferred: VecDeque<(u64, i64)>,
    waiting: JoinSet<(u64, Answer)>,
    /// An error was answered, or the server is stopping: nothing more.
    done: bool,
}

impl KeepAlives {
    fn new(ctx: Ctx, requests: Streaming<pb::LeaseKeepAliveRequest>) -> KeepAlives {
        let stopping = Box::pin(crate::streams::stopped(ctx.stopping.clone()));
        KeepAlives {
            ctx,
            requests: Some(requests),
            stopping,
            armed: false,
            answers: VecDeque::new(),
            first: 0,
            confirming: VecDeque::new(),
            deferred: VecDeque::new(),
            waiting: JoinSet::new(),
            done: false,
        }
    }

    /// Reads every request that arrived, up to `READ_AHEAD` answers pending, and takes one
    /// ticket for them all once read, so that their round is issued after each arrived.
    fn read(&mut self, cx: &mut Context<'_>) {
        let mut read = Vec::new();
        while self.answers.len() < READ_AHEAD {
            let Some(requests) = self.requests.as_mut() else { break };
            match Pin::new(requests).poll_next(cx) {
                Poll::Pending => break,
                Poll::Ready(Some(Ok(req))) => {
                    read.push((self.first + self.answers.len() as u64, req.id));
                    self.answers.push_back(None);
                }
                // A request that does not decode fails the stream.
                Poll::Ready(Some(Err(e))) => {
                    self.answers.push_back(Some(Err(e)));
                    self.requests = None;
                }
                Poll::Ready(None) => self.requests = None,
            }
        }
        if read.is_empty() {
            return;
        }
        match self.ctx.engine.lease_round() {
            Ok(round) => {
                self.confirming.extend(read.into_iter().map(|(seq, id)| (seq, id, round)));
            }
            // Not the leader (forwarded), or stopping: the slow way answers.
            Err(_) => self.deferred.extend(read),
        }
    }

    /// Renews the keepalives whose round confirmed the leadership, in order; those it did not
    /// confirm, or that the clock cannot take, go the slow way.
    fn confirm(&mut self, cx: &mut Context<'_>) {
        let mut last: Option<(LeaseRound, Option<LeaseConfirmed>)> = None;
        while let Some(&(seq, id, round)) = self.confirming.front() {
            let confirmed = match last {
                Some((r, confirmed)) if r == round => confirmed,
                _ => match self.ctx.engine.poll_lease_round(round, cx) {
                    Poll::Pending => return,
                    Poll::Ready(confirmed) => confirmed,
                },
            };
            last = Some((round, confirmed));
            self.confirming.pop_front();
            let answer = confirmed.and_then(|c| self.ctx.keep_alive_now(id, c));
            match answer {
                Some(answer) => self.fill(seq, answer),
                None => self.deferred.push_back((seq, id)),
            }
        }
    }

    /// Files the answer to request `seq`.
    fn fill(&mut self, seq: u64, answer: Answer) {
        if let Some(slot) =
            usize::try_from(seq - self.first).ok().and_then(|i| self.answers.get_mut(i))
        {
            *slot = Some(answer);
        }
    }

    /// Starts what may start of the keepalives that wait, and files the answers of those done.
    fn settle(&mut self, cx: &mut Context<'_>) -> Result<(), Status> {
        while self.waiting.len() < SLOW_IN_FLIGHT {
            let Some((seq, id)) = self.deferred.pop_front() else { break };
            let ctx = self.ctx.clone();
            self.waiting.spawn(async move { (seq, ctx.keep_alive_once(id).await) });
        }
        while let Poll::Ready(Some(joined)) = self.waiting.poll_join_next(cx) {
            let (seq, answer) =
                joined.map_err(|e| Status::internal(format!("a keepalive failed: {e}")))?;
            self.fill(seq, answer);
        }
        Ok(())
    }
}

impl Stream for KeepAlives {
    type Item = Answer;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Answer>> {
        let me = self.get_mut();
        if me.done {
            return Poll::Ready(None);
        }
        // A dropped sender is a stop too (the future resolves then).
        let check = !me.armed || me.ctx.stopping.has_changed().unwrap_or(true);
        me.armed = true;
        if check && me.stopping.as_mut().poll(cx).is_ready() {
            me.done = true;
            return Poll::Ready(Some(Err(crate::errors::server_stopped())));
        }
        me.read(cx);
        me.confirm(cx);
        // Finished tasks make room for deferred ones: start them until none defer or no room.
        loop {
            if let Err(e) = me.settle(cx) {
                me.done = true;
                return Poll::Ready(Some(Err(e)));
            }
            if me.deferred.is_empty() || me.waiting.len() >= SLOW_IN_FLIGHT {
                break;
            }
        }
        match me.answers.front() {
            Some(Some(_)) => {
                let answer = me.answers.pop_front().flatten();
                me.first += 1;
                me.done = answer.as_ref().is_some_and(|a| a.is_err());
                Poll::Ready(answer)
            }
            None if me.requests.is_none() => {
                me.done = true;
                Poll::Ready(None)
            }
            _ => Poll::Pending,
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
        let caller = self.caller(&req)?;
        let id = LeaseId(req.into_inner().id);
        let revision = self.engine.lease_revoke_as(caller, id).await.map_err(status)?;
        Ok(Response::new(pb::LeaseRevokeResponse { header: self.header().at(revision) }))
    }

    type LeaseKeepAliveStream = BoxStream<pb::LeaseKeepAliveResponse>;

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        self.check_leader(&req)?;
        Ok(Response::new(Box::pin(KeepAlives::new(self.clone(), req.into_inner()))))
    }

    async fn lease_time_to_live(
        &self,
        req: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        self.check_leader(&req)?;
        // etcd checks read on every attached key when they are asked for (and only then).
        let caller = if req.get_ref().keys { self.caller(&req)? } else { None };
        if caller.as_ref().is_some_and(|c| c.revision == 0) {
            return Err(auth_status(cairn_kv::auth::AuthError::UserEmpty));
        }
        let r = req.into_inner();
        let resp = match self.engine.lease_time_to_live(LeaseId(r.id), r.keys).await {
            Ok(t) => pb::LeaseTimeToLiveResponse {
                header: self.header().at(t.revision),
                id: r.id,
                ttl: t.ttl,
                granted_ttl: t.granted_ttl,
                keys: t.keys.into_iter().map(|k| k.to_vec()).collect(),
            },
            Err(EngineError::NotLeader) => {
                self.leader_lease_client()?.lease_time_to_live(r).await?.into_inner()
            }
            Err(e) => return Err(status(e)),
        };
        if let Some(c) = &caller {
            let state = self.engine.auth_state();
            for key in &resp.keys {
                state.check(c, key, b"", cairn_kv::auth::PermType::Read).map_err(auth_status)?;
            }
        }
        Ok(Response::new(resp))
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
