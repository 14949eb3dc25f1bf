//! Handling one `Ready`: persisting to the log, executing committed entries, answering callers.

use bytes::Bytes;
use cairn_kv::backend::Backend;
use cairn_kv::{Command, CommandResponse, KvError, Outcome};
use cairn_raft::{Entry, EntryPayload, LogIndex, Message, ReadState, Ready, Role, SoftState};
use cairn_storage::fs::Dir;

use super::{decode_entry, Leadership, Observed, Proposal, ReadFor, Replica, Reply};
use crate::config::Bug;
use crate::error::{EngineError, StorageError};
use crate::ids::RequestId;

/// A committed entry as one member applied it (reported with `observe`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppliedEntry {
    /// The entry.
    pub entry: Entry,
    /// The request id and command a normal entry carries; `None` for a membership change or a
    /// leader's empty entry.
    pub request: Option<(RequestId, Command)>,
    /// What executing it produced; `None` without a command, or when the store already held
    /// it (a replay after a restart).
    pub outcome: Outcome,
}

impl<D: Dir, B: Backend, T> Replica<D, B, T> {
    /// Carries out one `Ready` in the order its contract gives, then advances the core.
    pub(super) fn handle_ready(
        &mut self,
        rd: Ready,
        early: &mut dyn FnMut(&mut Vec<Message>),
    ) -> Result<(), StorageError> {
        // Asynchronous writes: entries are written now and synced by the driver later, while
        // this member goes on. A new term or vote, or a snapshot, is made durable here first.
        let sync_later =
            self.syncs.sync_later && self.cfg.raft.async_storage_writes && rd.may_sync_later();
        let Ready {
            messages_now,
            snapshot,
            entries,
            hard_state,
            messages_after_persist,
            committed_entries,
            read_states,
            soft_state,
            ..
        } = rd;
        // 1. A leader's replication traffic may leave before its own write is durable.
        self.send(messages_now)?;
        if !self.work.messages.is_empty() {
            early(&mut self.work.messages);
        }
        // 2. Persist: an installed snapshot (the store, then the log's marker), then entries and
        //    hard state, with one fsync (now, or later by the driver).
        if let Some(snap) = &snapshot {
            self.install_snapshot(&snap.meta)?;
        }
        // 3. What promises durable state (votes, acknowledgements) leaves only once it is
        //    durable, and before the apply: a leader's round waits for these, not for this
        //    member's apply. Deferred, it waits for the sync that covers this write.
        let acknowledges = if sync_later {
            self.write(entries, hard_state)?;
            self.hold_until_synced(messages_after_persist)?
        } else {
            let synced = self.persist(entries, hard_state)? || snapshot.is_some();
            // A sync covers every write before it too: what waited on them may leave, first.
            self.all_synced(synced)?;
            let acknowledges = !messages_after_persist.is_empty();
            self.send(messages_after_persist)?;
            acknowledges
        };
        if acknowledges {
            early(&mut self.work.messages);
        }
        // 4. Apply.
        self.apply(committed_entries)?;
        // 5. Reads confirmed by this Ready, before any leadership change it reports (they
        //    were confirmed while the old leadership held).
        self.accept_read_states(read_states);
        if let Some(ss) = soft_state {
            self.on_soft_state(ss);
        }
        if sync_later {
            self.raft.advance_written();
        } else {
            self.raft.advance();
        }
        Ok(())
    }

    /// Writes and syncs; returns whether it synced.
    fn persist(
        &mut self,
        entries: Vec<Entry>,
        hard_state: Option<cairn_raft::HardState>,
    ) -> Result<bool, StorageError> {
        // As etcd's MustSync: entries, term and vote must be durable before anything that
        // depends on them; a commit index alone need not be (after a crash it is learned
        // again). So a hard state that moves only the commit index is not even written now: it
        // rides with the next write (a write system call saved on every commit's path, between
        // the fsync and the answer), and a later hard state supersedes it.
        let term_vote = hard_state.map(|h| (h.term, h.vote));
        let must_sync =
            !entries.is_empty() || term_vote.is_some_and(|tv| tv != self.synced_term_vote);
        if !must_sync {
            if hard_state.is_some() {
                self.lazy_hard_state = hard_state;
            }
            return Ok(false);
        }
        self.append(entries, hard_state)?;
        if self.cfg.has_bug(Bug::AckBeforeFsync) {
            return Ok(false);
        }
        self.sync_wal()?;
        if let Some(tv) = term_vote {
            self.synced_term_vote = tv;
        }
        Ok(true)
    }

    /// Executes committed entries in the store (visible to reads at once; the committer makes
    /// them durable later) and answers the proposals among them.
    fn apply(&mut self, entries: Vec<Entry>) -> Result<(), StorageError> {
        let Some(last) = entries.last() else { return Ok(()) };
        let last = last.index;
        let mut decoded = Vec::with_capacity(entries.len());
        for e in &entries {
            decoded.push(match &e.payload {
                EntryPayload::Normal(data) if !data.is_empty() => {
                    Some(decode_entry(e.index, data)?)
                }
                EntryPayload::ConfChange(cc) => {
                    self.work.membership = true;
                    (!cc.context.is_empty())
                        .then(|| decode_entry(e.index, &cc.context))
                        .transpose()?
                }
                _ => None,
            });
        }
        let batch: Vec<_> = entries
            .iter()
            .zip(&decoded)
            .map(|(e, d)| (e.index.0, d.as_ref().map(|(_, cmd)| cmd)))
            .collect();
        let (outcomes, prepared) = self.store.execute(&batch)?;
        self.hold_batch(prepared);
        let me = self.raft.id().0;
        if decoded.iter().flatten().any(|(_, c)| matches!(c, Command::Membership { .. })) {
            self.work.membership = true;
        }
        if decoded
            .iter()
            .flatten()
            .any(|(_, c)| matches!(c, Command::PublishMember { member, .. } if *member == me))
        {
            self.unsettle_publisher();
        }
        for ((entry, request), outcome) in entries.into_iter().zip(decoded).zip(outcomes) {
            if let (Some((id, cmd)), Some(result)) = (&request, &outcome) {
                self.lessor_applied(cmd, result);
                self.answer_proposal(*id, &entry, cmd, result);
            }
            if self.cfg.observe {
                let applied = AppliedEntry { entry, request, outcome };
                self.work.observed.push(Observed::Applied(applied));
            }
        }
        self.fail_lost_proposals(last);
        Ok(())
    }

    /// The lease clock follows what was applied: grants start it, revokes stop it, cleared
    /// checkpoints of the grants keepalives renewed let those be answered.
    fn lessor_applied(&mut self, cmd: &Command, result: &Result<CommandResponse, KvError>) {
        match (cmd.without_caller(), result) {
            (_, Ok(CommandResponse::LeaseGrant { lease, .. })) => self.lessor_granted(*lease),
            (Command::LeaseRevoke { id } | Command::LeaseExpire { id, .. }, Ok(_)) => {
                self.lessor_revoked(*id)
            }
            (Command::LeaseGrantCheckpoint { checkpoints }, Ok(_)) => {
                self.lessor_checkpointed(checkpoints)
            }
            // Checkpoints by id alone come only from an older cairn's log: no keepalive here
            // waits for one (keepalives wait only for clears this process proposed).
            (Command::LeaseCheckpoint { .. }, _) => {}
            // One line per compaction, as etcd logs it (every member applies it).
            (Command::Compact(c), Ok(_)) => {
                tracing::info!(revision = %c.revision, physical = c.physical, "compacted the store")
            }
            _ => {}
        }
    }

    /// Answers the caller of the proposal `id`, if this member made it. The entry must be the
    /// one proposed, not another member's that happens to carry the same id.
    fn answer_proposal(
        &mut self,
        id: RequestId,
        entry: &Entry,
        cmd: &Command,
        result: &Result<CommandResponse, KvError>,
    ) {
        let data = match &entry.payload {
            EntryPayload::Normal(data) => data,
            EntryPayload::ConfChange(cc) => &cc.context,
        };
        let ours = self.proposals.get_mut(&id).is_some_and(|p| same_bytes(&p.data, data));
        if !ours {
            return;
        }
        let Some(Proposal { token, .. }) = self.proposals.take(&id) else { return };
        if self.proposal_index.get(&entry.index) == Some(&id) {
            self.proposal_index.remove(&entry.index);
        }
        let physical = matches!(cmd, Command::Compact(c) if c.physical);
        match result {
            Ok(resp) if physical => self.physical.push((token, resp.clone())),
            Ok(resp) => self.work.answers.push((token, Ok(Reply::Command(resp.clone())))),
            Err(e) => self.work.answers.push((token, Err(EngineError::Kv(e.clone())))),
        }
    }

    /// Proposals this member appended as leader at or below `applied` that were not answered
    /// were replaced by another leader's entries: they will never apply.
    fn fail_lost_proposals(&mut self, applied: LogIndex) {
        while let Some((&index, &id)) = self.proposal_index.first_key_value() {
            if index > applied {
                break;
            }
            self.proposal_index.remove(&index);
            if let Some(p) = self.proposals.take(&id) {
                self.count_failed(1);
                self.work.answers.push((p.token, Err(EngineError::LeaderChanged)));
            }
        }
    }

    fn accept_read_states(&mut self, read_states: Vec<ReadState>) {
        for rs in read_states {
            let Some(id) = RequestId::from_ctx(&rs.ctx) else { continue };
            if let Some(read) = self.reads.get_mut(&id) {
                read.index = Some(rs.index);
                self.reads_at.entry(rs.index).or_default().push(id);
            }
        }
    }

    /// Releases the reads whose index the store has executed.
    pub(super) fn release_reads(&mut self) {
        let executed = LogIndex(self.store.executed_index());
        while let Some(entry) = self.reads_at.first_entry() {
            if *entry.key() > executed {
                break;
            }
            for id in entry.remove() {
                let Some(read) = self.reads.take(&id) else { continue };
                match read.purpose {
                    ReadFor::Store(token) => self.work.answers.push((token, Ok(Reply::Read))),
                    ReadFor::Leases { round, term } => {
                        let led = term == self.raft.term() && self.raft.role() == Role::Leader;
                        let result = if led { Ok(()) } else { Err(EngineError::NotLeader) };
                        self.lease_round_ended(round, result);
                    }
                }
            }
        }
    }

    /// Answers physical compactions once the history below them is removed.
    pub(super) fn release_physical(&mut self) {
        if !self.physical.is_empty() && self.store.physically_compacted() {
            for (token, resp) in self.physical.drain(..) {
                self.work.answers.push((token, Ok(Reply::Command(resp))));
            }
        }
    }

    /// A new leader or term: reads still waiting for their read index were asked of a
    /// leadership that is gone, and may never be answered (etcd answers them
    /// `ErrLeaderChanged`; clients retry reads).
    fn on_soft_state(&mut self, ss: SoftState) {
        let now = Leadership { leader: ss.leader, term: self.raft.term() };
        if now == self.leadership {
            return;
        }
        let me = Some(self.raft.id());
        if now.leader == me && (self.leadership.leader != me || self.leadership.term != now.term) {
            self.lessor_promote();
        } else if now.leader != me && self.leadership.leader == me {
            self.lessor_demote();
        }
        self.leadership = now;
        self.work.leadership = Some(now);
        for read in self.reads.take_where(|r| r.index.is_none()) {
            self.read_failed(read, EngineError::LeaderChanged);
        }
        self.answer_moves();
    }
}

/// Whether two entry payloads are the same bytes; cheap when they are the same buffer, as on
/// the leader that proposed them.
fn same_bytes(a: &Bytes, b: &Bytes) -> bool {
    (a.as_ptr() == b.as_ptr() && a.len() == b.len()) || a == b
}
