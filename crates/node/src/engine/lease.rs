//! The engine's lease API: grant, revoke, keepalive (one at a time, or a handle that renews in
//! the background), time to live, and the list.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_kv::{Command, CommandResponse, KvError, Lease, LeaseId, Revision, MAX_LEASE_TTL};

use super::Engine;
use crate::driver::Input;
use crate::error::EngineError;
use crate::replica::Reply;

/// A lease's state as etcd's `LeaseTimeToLive` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseTimeToLive {
    /// The lease asked about.
    pub id: LeaseId,
    /// Seconds left, rounded down; -1 when the lease does not exist.
    pub ttl: i64,
    /// Seconds granted (0 when the lease does not exist).
    pub granted_ttl: i64,
    /// The keys it holds, in key order, when asked for.
    pub keys: Vec<Bytes>,
    /// The store's revision.
    pub revision: Revision,
}

impl Engine {
    /// The shortest TTL a lease gets, in seconds: one and a half election timeouts, rounded up
    /// (etcd's `minTTL`), so a lease outlives a leader change. Shorter requests get this.
    pub fn min_lease_ttl(&self) -> i64 {
        let tick = u64::try_from(self.cfg.tick_interval.as_micros()).unwrap_or(u64::MAX);
        crate::config::min_lease_ttl(tick, self.cfg.election_ticks)
    }

    /// Grants a lease of `ttl` seconds (raised to [`Engine::min_lease_ttl`]) under `id`, or under
    /// an id the engine picks when `id` is 0. Answers the lease as granted and the revision
    /// (which a grant does not move).
    pub async fn lease_grant(
        &self,
        id: LeaseId,
        ttl: i64,
    ) -> Result<(Lease, Revision), EngineError> {
        if ttl > MAX_LEASE_TTL {
            return Err(KvError::LeaseTtlTooLarge.into());
        }
        let id = if id.0 != 0 { id } else { self.fresh_lease_id() };
        let ttl = ttl.max(self.min_lease_ttl());
        match self.propose(Command::LeaseGrant { id, ttl }).await? {
            CommandResponse::LeaseGrant { revision, lease } => Ok((lease, revision)),
            _ => Err(EngineError::Internal("a lease grant answered with another response")),
        }
    }

    /// A positive id no member picks twice: request ids are unique across members and lives.
    fn fresh_lease_id(&self) -> LeaseId {
        loop {
            let id = (self.ids.next_id().0 & (i64::MAX as u64)) as i64;
            if id != 0 {
                return LeaseId(id);
            }
        }
    }

    /// Revokes a lease: it and every key it holds are gone, in one revision (answered).
    pub async fn lease_revoke(&self, id: LeaseId) -> Result<Revision, EngineError> {
        self.lease_revoke_as(None, id).await
    }

    /// Renews a lease for its full TTL from now; answers the TTL. Only the leader keeps lease
    /// time: elsewhere this fails with [`EngineError::NotLeader`] (the server forwards it). A
    /// keepalive for a lease that expired waits for its revoke and fails `LeaseNotFound`.
    ///
    /// This is the driver's way, a round trip each; a server with many keepalives takes
    /// [`Engine::lease_round`] and [`Engine::lease_keep_alive_now`] instead.
    pub async fn lease_keep_alive(&self, id: LeaseId) -> Result<i64, EngineError> {
        match self.ask(|reply| Input::LeaseRenew { id, reply }).await? {
            Reply::LeaseRenewed { ttl } => Ok(ttl),
            _ => Err(EngineError::Internal("a keepalive answered as something else")),
        }
    }

    /// A ticket for keepalives that arrived by now: the heartbeat round that will confirm
    /// this member still leads, shared with every keepalive that arrives before it is issued.
    /// `NotLeader` where this member does not lead (forward them).
    pub fn lease_round(&self) -> Result<LeaseRound, EngineError> {
        if self.shared.failed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(self.stopped());
        }
        let (round, first) = self.lease_clock.want_confirmation()?;
        if first {
            // One wake-up of the driver per round, however many keepalives share it; the
            // replica issues the round on the turn this causes.
            self.tx.send(Input::LeaseRound).map_err(|_| self.stopped())?;
        }
        Ok(LeaseRound(round))
    }

    /// Whether the leadership is confirmed for `round`: Ready(Some) once it is, which lets
    /// [`Engine::lease_keep_alive_now`] renew; Ready(None) when the keepalives must go to
    /// [`Engine::lease_keep_alive`] instead (the round failed, this member stopped leading, or
    /// the confirmation is too old to lean on); Pending wakes the task when the round ends.
    pub fn poll_lease_round(
        &self,
        round: LeaseRound,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<LeaseConfirmed>> {
        let now = std::time::Instant::now();
        self.lease_clock.poll_round(round.0, now, cx).map(|ok| ok.then_some(LeaseConfirmed(())))
    }

    /// [`Engine::lease_keep_alive`] on the caller's thread, without waiting, once a round has
    /// confirmed the leadership for it: the answer, or None when only the driver can give it
    /// (then call [`Engine::lease_keep_alive`]). Most keepalives are answered here.
    pub fn lease_keep_alive_now(
        &self,
        id: LeaseId,
        _confirmed: LeaseConfirmed,
    ) -> Option<Result<i64, EngineError>> {
        if self.shared.failed.load(std::sync::atomic::Ordering::SeqCst) {
            return Some(Err(self.stopped()));
        }
        let store = &self.shared.store;
        let (lease, executed) = (store.lease(id), store.executed_index());
        self.lease_clock.renew(id, lease, executed, std::time::Instant::now()).transpose()
    }

    /// A lease's remaining and granted TTL, and its keys if `keys`; as the leader's clock has it
    /// ([`EngineError::NotLeader`] elsewhere).
    pub async fn lease_time_to_live(
        &self,
        id: LeaseId,
        keys: bool,
    ) -> Result<LeaseTimeToLive, EngineError> {
        let (granted_ttl, ttl) = match self.ask(|reply| Input::LeaseTtl { id, reply }).await? {
            Reply::LeaseTtl { granted, remaining } => (granted, remaining),
            _ => return Err(EngineError::Internal("a lease TTL answered as something else")),
        };
        let store = &self.shared.store;
        let keys = if keys && ttl >= 0 { store.lease_keys(id) } else { Vec::new() };
        Ok(LeaseTimeToLive { id, ttl, granted_ttl, keys, revision: store.current_revision() })
    }

    /// Every lease, in id order, as this member has applied them.
    pub fn leases(&self) -> Vec<Lease> {
        self.shared.store.leases()
    }

    /// Keeps a lease alive from a thread of its own, renewing it at a third of its TTL, until
    /// the handle is dropped or the lease is gone. Needs no async runtime.
    pub fn keep_lease_alive(self: &Arc<Self>, id: LeaseId, ttl: i64) -> KeepAlive {
        let (stop, stopped) = mpsc::channel::<()>();
        let engine = Arc::downgrade(self);
        let every = Duration::from_secs(u64::try_from(ttl.max(1)).unwrap_or(1)) / 3;
        let _ = std::thread::Builder::new().name(format!("cairn-keepalive-{:x}", id.0)).spawn(
            move || loop {
                if stopped.recv_timeout(every) != Err(mpsc::RecvTimeoutError::Timeout) {
                    return;
                }
                let Some(engine) = engine.upgrade() else { return };
                let renewed = block_on(engine.lease_keep_alive(id));
                if matches!(renewed, Err(EngineError::Kv(KvError::LeaseNotFound))) {
                    return;
                }
            },
        );
        KeepAlive { _stop: stop }
    }
}

/// Renews a lease in the background while it lives ([`Engine::keep_lease_alive`]).
#[derive(Debug)]
pub struct KeepAlive {
    _stop: mpsc::Sender<()>,
}

/// Runs a future that needs no runtime (the engine's answer arrives on a channel) to its end
/// on this thread.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

/// A keepalive's place in the leadership confirmations ([`Engine::lease_round`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRound(u64);

/// Proof that a round confirmed the leadership for a keepalive ([`Engine::poll_lease_round`]),
/// without which [`Engine::lease_keep_alive_now`] does not renew.
#[derive(Clone, Copy, Debug)]
pub struct LeaseConfirmed(());
