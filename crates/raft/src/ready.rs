//! What the core asks of its driver, and in what order.

use crate::config::PlantedBugSwitch;
use crate::log::LogMark;
use crate::message::{Message, MessageBody};
use crate::raft::Raft;
use crate::tracker::apply_conf_change;
use crate::types::{
    ConfChange, Entry, EntryPayload, HardState, LeaveJoint, LogIndex, NodeId, ReadCtx, Role,
    Snapshot,
};

/// A read that is now linearizable: serve it once the state machine has applied `index`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadState {
    pub index: LogIndex,
    pub ctx: ReadCtx,
}

/// The role and known leader, reported when they change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoftState {
    pub role: Role,
    pub leader: Option<NodeId>,
}

/// Everything the driver must do after the core changed state. Handle the fields in this order,
/// then call [`Raft::advance`] before asking for the next `Ready`:
///
/// 1. Send `messages_now`. They may go out before, or while, step 2 runs.
/// 2. Persist, durably (fsync) and atomically enough that a crash leaves either the old or new
///    state of each item: `snapshot`, then `entries`, then `hard_state`. A snapshot replaces the
///    whole persisted log. `entries[0]` may start at or below the last persisted index: discard
///    the persisted suffix from there first.
/// 3. Send `messages_after_persist`. They promise what step 2 wrote (votes, acknowledgements),
///    so they must never leave before it is durable.
/// 4. Apply `snapshot` (if any), then `committed_entries`, in order, to the state machine.
/// 5. Serve each of `read_states` once the state machine has applied its index.
#[derive(Debug, Default)]
#[must_use = "a Ready must be handled and then advanced"]
pub struct Ready {
    /// Messages that may be sent at once. Only a leader's replication traffic lands here
    /// (thesis §10.2.1): the leader counts its own log toward commit only after `advance`.
    pub messages_now: Vec<Message>,
    /// A snapshot from the leader that replaces the state machine and the log up to its index.
    pub snapshot: Option<Snapshot>,
    /// Log entries to append durably.
    pub entries: Vec<Entry>,
    /// Term, vote and commit index, when they changed.
    pub hard_state: Option<HardState>,
    /// Messages to send only after everything above is durable.
    pub messages_after_persist: Vec<Message>,
    /// Entries known committed, to apply in order. Membership changes among them take effect in
    /// the core when `advance` is called.
    pub committed_entries: Vec<Entry>,
    /// Reads now safe to serve, once their index is applied.
    pub read_states: Vec<ReadState>,
    /// The role or leader, when either changed.
    pub soft_state: Option<SoftState>,
    /// Whether the driver may write this `Ready` and make it durable later
    /// ([`Raft::advance_written`], then [`Raft::log_synced`]): it changes neither term nor vote
    /// and installs no snapshot.
    may_sync_later: bool,
}

impl Ready {
    /// Whether the driver may write this `Ready`'s entries, advance it with
    /// [`Raft::advance_written`] and sync them later. False when it changes term or vote or
    /// installs a snapshot: the core acts on those at once, so they must be durable first.
    pub fn may_sync_later(&self) -> bool {
        self.may_sync_later
    }

    /// Every message of this Ready, for drivers that persist synchronously before sending.
    pub fn all_messages(&self) -> impl Iterator<Item = &Message> {
        self.messages_now.iter().chain(&self.messages_after_persist)
    }
}

/// What a handed-out `Ready` contained, so `advance` knows what is now durable and applied.
#[derive(Debug)]
pub(crate) struct ReadyMark {
    log: LogMark,
    hard_state: HardState,
    /// The `Ready` neither changed term or vote nor installed a snapshot.
    may_sync_later: bool,
    conf_changes: Vec<(LogIndex, ConfChange)>,
}

impl Raft {
    /// Whether [`Raft::ready`] would return anything.
    pub fn has_ready(&self) -> bool {
        self.pending_ready.is_none()
            && (!self.msgs_now.is_empty()
                || !self.msgs_after_persist.is_empty()
                || !self.read_states.is_empty()
                || self.needs_bcast
                || self.reads.has_queued()
                || !self.forward_reads.is_empty()
                || self.log.has_ready()
                || self.hard_state() != self.last_hard_state
                || (self.role, self.leader) != self.last_soft)
    }

    /// Collects what the driver must do next; see [`Ready`] for the order.
    ///
    /// # Panics
    /// If the previous `Ready` was not advanced.
    pub fn ready(&mut self) -> Ready {
        assert!(self.pending_ready.is_none(), "ready() called before advance()");
        self.flush();
        let (snapshot, entries, committed_entries, log_mark) = self.log.take_ready();
        let hs = self.hard_state();
        let hard_state = (hs != self.last_hard_state).then_some(hs);
        let may_sync_later = snapshot.is_none()
            && (hs.term, hs.vote) == (self.last_hard_state.term, self.last_hard_state.vote);
        self.last_hard_state = hs;
        let soft = (self.role, self.leader);
        let soft_state =
            (soft != self.last_soft).then_some(SoftState { role: soft.0, leader: soft.1 });
        self.last_soft = soft;
        let conf_changes = committed_entries
            .iter()
            .filter_map(|e| match &e.payload {
                EntryPayload::ConfChange(cc) => Some((e.index, cc.clone())),
                EntryPayload::Normal(_) => None,
            })
            .collect();
        self.pending_ready =
            Some(ReadyMark { log: log_mark, hard_state: hs, may_sync_later, conf_changes });
        Ready {
            messages_now: std::mem::take(&mut self.msgs_now),
            snapshot,
            entries,
            hard_state,
            messages_after_persist: std::mem::take(&mut self.msgs_after_persist),
            committed_entries,
            read_states: std::mem::take(&mut self.read_states),
            soft_state,
            may_sync_later,
        }
    }

    /// The driver has handled the last `Ready`: its writes, and every write handed out before
    /// them, are durable, and its committed entries applied.
    ///
    /// # Panics
    /// If there is no outstanding `Ready`.
    pub fn advance(&mut self) {
        self.advance_inner(true);
    }

    /// The driver has handled the last `Ready` but only written its entries, not yet made them
    /// durable (etcd raft's asynchronous storage writes): it holds `messages_after_persist`
    /// until a sync covers the write, then reports it with [`Raft::log_synced`]. Until then a
    /// leader does not count its own copy toward commit, and no node applies those entries.
    /// Meanwhile the driver may take and write the next `Ready`s, so one fsync covers many.
    ///
    /// Only with [`crate::Config::async_storage_writes`], and only for a `Ready` that
    /// [`Ready::may_sync_later`] allows: a new term or vote, or an
    /// installed snapshot, must be durable before the core acts on it, so such a `Ready` is
    /// synced and then [`Raft::advance`]d.
    ///
    /// # Panics
    /// If there is no outstanding `Ready`, or it may not sync later.
    pub fn advance_written(&mut self) {
        assert!(self.cfg.async_storage_writes, "advance_written() without async_storage_writes");
        let mark = self.pending_ready.as_ref().expect("advance_written() without a ready()");
        assert!(mark.may_sync_later, "a Ready that changes term, vote or snapshot must be synced");
        self.advance_inner(false);
    }

    /// The driver made the log durable up to `index`, which held an entry of `term` when written
    /// (the last entry of a `Ready` advanced with [`Raft::advance_written`], or any entry
    /// before it). A report for an entry the log has since replaced is ignored.
    pub fn log_synced(&mut self, index: LogIndex, term: crate::types::Term) {
        if self.log.synced_to(index, term) {
            self.count_own_log();
        }
        self.check_invariants_debug();
    }

    fn advance_inner(&mut self, synced: bool) {
        let mark = self.pending_ready.take().expect("advance() without a ready()");
        self.log.advance(mark.log, synced);
        self.durable_term = self.durable_term.max(mark.hard_state.term);
        for (index, cc) in mark.conf_changes {
            self.apply_committed_conf_change(index, &cc);
        }
        self.count_own_log();
        self.check_invariants_debug();
    }

    /// A leader's own copy counts toward commit once it is durable.
    fn count_own_log(&mut self) {
        if self.role != Role::Leader {
            return;
        }
        let synced = if self.cfg.has_bug(PlantedBugSwitch::CountUnsyncedOwnCopy) {
            self.log.last_index()
        } else {
            self.log.synced()
        };
        if let Some(pr) = self.tracker.progress_mut(self.id) {
            pr.maybe_update(synced);
        }
        if self.maybe_commit() {
            self.needs_bcast = true;
        }
    }

    fn apply_committed_conf_change(&mut self, index: LogIndex, cc: &ConfChange) {
        if index <= self.conf_applied_index {
            return;
        }
        self.conf_applied_index = index;
        // Each change was validated against this same configuration when proposed, so this
        // fails only for a change a deposed leader appended; every node skips it alike.
        let Ok(next) = apply_conf_change(self.tracker.conf(), cc) else {
            return;
        };
        let auto_leave = next.is_joint() && next.auto_leave;
        self.conf_history.push((index, next.clone()));
        self.tracker.set_conf(next, self.log.last_index().next());
        if self.role != Role::Leader {
            return;
        }
        // The lease was earned from a quorum of the old configuration; earn it again.
        self.reads.revoke_lease();
        if !self.tracker.is_voter(self.id) {
            // Removed or demoted: a leader outside the configuration steps down, first handing
            // leadership to the voter left with the most complete log, so the cluster does not
            // wait an election timeout for its next leader.
            self.hand_off_before_leaving();
            self.become_follower(self.term, None);
            return;
        }
        if auto_leave && self.pending_conf_index <= self.log.applied() {
            let leave = ConfChange {
                changes: Vec::new(),
                leave_joint: LeaveJoint::Auto,
                ..ConfChange::default()
            };
            self.append_payloads(vec![EntryPayload::ConfChange(leave)]);
        }
        // New members start probing now rather than at the next proposal, and a shrunken
        // quorum may commit more.
        self.maybe_commit();
        self.needs_bcast = true;
    }

    /// A leader leaving the configuration tells the voter with its whole log to campaign at
    /// once (thesis §3.10's TimeoutNow). A voter behind it would lose that election, so then
    /// the cluster elects as usual.
    fn hand_off_before_leaving(&mut self) {
        let last = self.log.last_index();
        let me = self.id;
        let target =
            self.tracker.conf().voters.iter().copied().find(|v| {
                *v != me && self.tracker.progress(*v).is_some_and(|p| p.matched() == last)
            });
        if let Some(target) = target {
            self.send_timeout_now(target);
        }
    }

    fn flush(&mut self) {
        if self.role == Role::Leader {
            self.flush_leader();
        } else if !self.forward_reads.is_empty() {
            let ctxs = std::mem::take(&mut self.forward_reads);
            match self.leader {
                Some(leader) => {
                    self.send(leader, crate::types::Term(0), MessageBody::ReadIndex { ctxs });
                }
                // The leader was lost since the reads were accepted; the driver's request times
                // out and retries, as with any read the old leader never answered.
                None => drop(ctxs),
            }
        }
    }
}
