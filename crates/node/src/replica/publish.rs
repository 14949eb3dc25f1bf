//! Publishing this member's attributes (its name and client URLs) through the log, as etcd's
//! `publish` does, so every member's `MemberList` shows every member's client URLs.
//!
//! A member proposes its attributes once it is ready: it knows a leader, belongs to the
//! configuration, and has applied everything it knows to be committed, so the store shows the
//! attributes the cluster already holds for it. If those equal its own, it proposes nothing (a
//! restart with the same URLs adds no entry); if they differ (a first start, new URLs, or an
//! older life's publish that committed late over a newer one), it proposes them. Nothing waits
//! for the answer: the applied attributes are the answer. A proposal lost to a leader change or
//! a dropped message is retried after a backoff that starts at an election timeout and doubles
//! up to the request timeout, and the check runs again whenever an applied entry or an
//! installed snapshot may have changed this member's attributes.

use cairn_kv::backend::Backend;
use cairn_kv::{Command, MemberAttributes};
use cairn_raft::{ConfState, NodeId};
use cairn_storage::fs::Dir;

use super::Replica;

/// This member's attributes and how far publishing them got.
#[derive(Debug)]
pub(super) struct Publisher {
    attributes: MemberAttributes,
    /// The applied attributes were these at the last look, and nothing applied since could
    /// have changed them: nothing to do until something does.
    settled: bool,
    /// The tick before which no proposal is made: the last one may still be on its way.
    retry_at: u64,
    /// Ticks to wait after the next proposal.
    backoff: u64,
    first_backoff: u64,
    max_backoff: u64,
}

impl Publisher {
    pub(super) fn new(attributes: MemberAttributes, election: u64, request: u64) -> Publisher {
        let first_backoff = election.max(1);
        Publisher {
            attributes,
            settled: false,
            retry_at: 0,
            backoff: first_backoff,
            first_backoff,
            max_backoff: request.max(first_backoff),
        }
    }

    /// Something applied may have changed this member's attributes: look again.
    pub(super) fn unsettle(&mut self) {
        self.settled = false;
    }
}

impl<D: Dir, B: Backend, T> Replica<D, B, T> {
    /// Proposes this member's attributes if it is ready and the applied ones differ (see the
    /// module's comment); returns whether it proposed. Cheap when settled: one flag.
    pub(super) fn maybe_publish(&mut self) -> bool {
        if self.publisher.as_ref().is_none_or(|p| p.settled) {
            return false;
        }
        let id = self.raft.id();
        let ready = self.raft.leader().is_some()
            && self.raft.applied_index() >= self.raft.commit_index()
            && names(self.raft.conf_state(), id);
        if !ready {
            return false;
        }
        let applied = self.store.member(id.0);
        let ticks = self.ticks;
        let Some(p) = &mut self.publisher else { return false };
        // Peer URLs are the membership's, not published: only name and client URLs count, and
        // a removed member has nothing left to publish.
        let same = applied.as_ref().is_some_and(|a| {
            a.removed || (a.name == p.attributes.name && a.client_urls == p.attributes.client_urls)
        });
        if same {
            p.settled = true;
            p.backoff = p.first_backoff;
            return false;
        }
        if ticks < p.retry_at {
            return false;
        }
        let cmd = Command::PublishMember { member: id.0, attributes: p.attributes.clone() };
        p.retry_at = ticks + p.backoff;
        p.backoff = (p.backoff * 2).min(p.max_backoff);
        let data = crate::command::encode(self.own_ids.next_id().0, &cmd);
        // A refusal (no leader after all, or a leadership transfer) is retried like a lost
        // proposal: after the backoff.
        self.raft.propose(data).is_ok()
    }

    /// An applied entry or snapshot may have changed this member's attributes.
    pub(super) fn unsettle_publisher(&mut self) {
        if let Some(p) = &mut self.publisher {
            p.unsettle();
        }
    }
}

/// Whether `conf` names `id`, voter or learner (`ConfState::members` without building the set,
/// since this runs on every `process` until the attributes are applied).
fn names(conf: &ConfState, id: NodeId) -> bool {
    [&conf.voters, &conf.voters_outgoing, &conf.learners, &conf.learners_next]
        .iter()
        .any(|set| set.contains(&id))
}
