//! The safety properties checked after every simulation step. Each names its source.

use std::collections::BTreeMap;

use cairn_raft::{Entry, LogIndex, NodeId, Raft, Role, Snapshot, Term};

use crate::node::{payload_hash, SmState};

/// A violated property, with what was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

macro_rules! violation {
    ($($arg:tt)*) => { return Err(Violation(format!($($arg)*))) };
}

#[derive(Debug, Default)]
pub struct Checker {
    /// Election safety: the leader of each term.
    leaders: BTreeMap<Term, NodeId>,
    /// Log matching: (index, term) -> (payload hash, term of the previous entry).
    entries: BTreeMap<(LogIndex, Term), (u64, Option<Term>)>,
    /// Leader completeness: the term of every entry known committed.
    committed: BTreeMap<LogIndex, Term>,
    /// State-machine safety: the state after applying each index.
    applied: BTreeMap<LogIndex, SmState>,
    /// The highest commit index any node has reached: every entry at or below it is committed.
    pub max_commit: LogIndex,
    /// Acknowledged proposals: client id -> index it was applied at.
    pub acked: BTreeMap<u64, LogIndex>,
    pub reads_checked: u64,
    pub elections: u64,
}

impl Checker {
    /// Election safety (Raft §5.2, Figure 3): at most one leader per term.
    pub fn check_leader(&mut self, raft: &Raft) -> Result<(), Violation> {
        if raft.role() != Role::Leader {
            return Ok(());
        }
        match self.leaders.get(&raft.term()) {
            Some(&other) if other != raft.id() => {
                violation!(
                    "election safety: {} and {} both lead term {}",
                    other,
                    raft.id(),
                    raft.term()
                )
            }
            Some(_) => Ok(()),
            None => {
                self.leaders.insert(raft.term(), raft.id());
                self.elections += 1;
                self.check_leader_completeness(raft)
            }
        }
    }

    /// Leader completeness (§5.4, Figure 3): a new leader's log holds every committed entry.
    fn check_leader_completeness(&self, raft: &Raft) -> Result<(), Violation> {
        let from = raft.snapshot_meta().index.next();
        for (&index, &term) in self.committed.range(from..) {
            if raft.term_at(index) != Some(term) {
                violation!(
                    "leader completeness: leader {} of term {} lacks committed entry {index} (term {term}), has {:?}",
                    raft.id(),
                    raft.term(),
                    raft.term_at(index)
                );
            }
        }
        Ok(())
    }

    /// Records entries a node just appended. Log matching (§5.3, Figure 3): entries with equal
    /// index and term carry the same payload and follow the same previous entry, so by induction
    /// the logs agree on everything before them.
    pub fn check_appended(&mut self, raft: &Raft, entries: &[Entry]) -> Result<(), Violation> {
        for e in entries {
            let prev =
                if e.index.0 > 1 { raft.term_at(LogIndex(e.index.0 - 1)) } else { Some(Term(0)) };
            let seen = (payload_hash(e), prev);
            match self.entries.get(&(e.index, e.term)) {
                Some(&(hash, prev_seen)) => {
                    if hash != seen.0 {
                        violation!(
                            "log matching: two entries at index {} term {}",
                            e.index,
                            e.term
                        );
                    }
                    if let (Some(a), Some(b)) = (prev_seen, seen.1) {
                        if a != b {
                            violation!(
                                "log matching: entry {} term {} follows terms {a} and {b}",
                                e.index,
                                e.term
                            );
                        }
                    }
                }
                None => {
                    self.entries.insert((e.index, e.term), seen);
                }
            }
        }
        Ok(())
    }

    /// Records a node's commit index, and checks it never moves back within a lifetime and never
    /// disagrees with what was committed before (§5.4.3).
    pub fn check_commit(&mut self, raft: &Raft, seen: &mut LogIndex) -> Result<(), Violation> {
        let commit = raft.commit_index();
        if commit < *seen {
            violation!("monotonic commit: node {} went from {} to {commit}", raft.id(), *seen);
        }
        let from = (*seen).max(raft.snapshot_meta().index).next();
        let mut i = from;
        while i <= commit {
            if let Some(term) = raft.term_at(i) {
                match self.committed.get(&i) {
                    Some(&t) if t != term => {
                        violation!(
                            "committed entry {i} changed term from {t} to {term} on node {}",
                            raft.id()
                        )
                    }
                    Some(_) => {}
                    None => {
                        self.committed.insert(i, term);
                    }
                }
            }
            i = i.next();
        }
        *seen = commit;
        self.max_commit = self.max_commit.max(commit);
        Ok(())
    }

    /// State-machine safety (§5.4.3, Figure 3): no two nodes apply different entries at an index.
    /// The hash chain makes this cover the whole applied prefix, snapshots included. Replays the
    /// node's Ready from its state `before` and checks it ends at `after`.
    pub fn check_applied(
        &mut self,
        node: NodeId,
        before: SmState,
        snapshot: Option<&Snapshot>,
        applied: &[Entry],
        after: SmState,
    ) -> Result<(), Violation> {
        let mut sm = before;
        if let Some(snap) = snapshot {
            sm = SmState { applied: snap.meta.index, ..SmState::decode(&snap.data) };
            if sm.applied < before.applied {
                violation!(
                    "node {node} installed snapshot {} below applied {}",
                    sm.applied,
                    before.applied
                );
            }
            self.record_state(node, sm)?;
        }
        for e in applied {
            if e.index != sm.applied.next() {
                violation!("node {node} applied {} after {}", e.index, sm.applied);
            }
            sm.apply(e);
            self.record_state(node, sm)?;
        }
        if sm != after {
            violation!("node {node} state machine disagrees with the entries it applied");
        }
        Ok(())
    }

    fn record_state(&mut self, node: NodeId, state: SmState) -> Result<(), Violation> {
        match self.applied.get(&state.applied) {
            Some(s) if s.hash != state.hash => violation!(
                "state-machine safety: node {node} has a different state at index {}",
                state.applied
            ),
            Some(_) => Ok(()),
            None => {
                self.applied.insert(state.applied, state);
                Ok(())
            }
        }
    }

    /// Linearizable reads (thesis §6.4): a read served at `index` must reflect every entry that
    /// was committed anywhere before the read began.
    pub fn check_read(
        &mut self,
        node: NodeId,
        index: LogIndex,
        commit_at_start: LogIndex,
    ) -> Result<(), Violation> {
        self.reads_checked += 1;
        if index < commit_at_start {
            violation!(
                "linearizable read: node {node} served a read at {index}, but {commit_at_start} was committed before it began"
            );
        }
        Ok(())
    }

    /// The state every node must reach after applying `index`, if anyone applied it.
    pub fn state_after(&self, index: LogIndex) -> Option<SmState> {
        self.applied.get(&index).copied()
    }
}
