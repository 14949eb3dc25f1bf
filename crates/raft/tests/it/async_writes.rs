//! Asynchronous storage writes (`Config::async_storage_writes`): a `Ready`'s entries may be
//! written and made durable later. What must hold: a leader counts its own copy only once
//! durable, no node applies an entry it has not made durable, a report for a replaced entry
//! is ignored, and a new term or vote can never be deferred.

use bytes::Bytes;
use cairn_raft::testkit::Cluster;
use cairn_raft::{Config, Entry, EntryPayload, LogIndex, Message, MessageBody, NodeId, Term};

fn cfg(id: NodeId) -> Config {
    Config { seed: 7, async_storage_writes: true, ..Config::new(id) }
}

/// A cluster of three with node 1 leading and every node quiet.
fn led_by_1() -> Cluster {
    let mut c = Cluster::new(&[1, 2, 3], cfg);
    c.elect(1);
    c
}

/// Handles node `id`'s `Ready` by writing it only. Returns its messages to send now, those
/// that must wait for the sync, and its committed entries.
fn write_only(c: &mut Cluster, id: u64) -> (Vec<Message>, Vec<Message>, Vec<cairn_raft::Entry>) {
    let raft = c.raft(id);
    let rd = raft.ready();
    assert!(rd.may_sync_later(), "a Ready of appends only may be synced later");
    let committed = rd.committed_entries.clone();
    let now = rd.messages_now.clone();
    let after = rd.messages_after_persist.clone();
    raft.advance_written();
    (now, after, committed)
}

/// Node 2 receives, from node 1, one entry after its last, in its current term, with commit
/// `commit` (or the new entry's index). Returns the entry.
fn one_more_entry(c: &mut Cluster, data: &'static [u8], commit: Option<LogIndex>) -> Entry {
    let last = c.raft(2).last_index();
    let term = c.raft(2).term();
    let entry =
        Entry { index: last.next(), term, payload: EntryPayload::Normal(Bytes::from_static(data)) };
    c.raft(2).step(Message {
        from: NodeId(1),
        to: NodeId(2),
        term,
        body: MessageBody::Append {
            prev_index: last,
            prev_term: term,
            entries: vec![entry.clone()],
            commit: commit.unwrap_or(entry.index),
        },
    });
    entry
}

#[test]
fn a_leader_counts_its_own_copy_only_once_synced() {
    let mut c = led_by_1();
    let before = c.raft(1).commit_index();
    c.raft(1).propose(Bytes::from_static(b"x")).unwrap();
    let (now, after, _) = write_only(&mut c, 1);
    assert!(after.is_empty());
    let last = c.raft(1).last_index();
    let term = c.raft(1).term();
    // Node 2 alone acknowledges: with node 1's copy not yet durable, that is one of three.
    c.isolate(3);
    c.in_flight.extend(now);
    c.deliver_all();
    assert!(c.process_ready(NodeId(2)));
    c.deliver_all();
    assert_eq!(c.raft(1).commit_index(), before, "an unsynced leader copy must not count");
    c.raft(1).log_synced(last, term);
    assert_eq!(c.raft(1).commit_index(), last, "durable on the leader and node 2: committed");
}

#[test]
fn a_follower_applies_only_what_it_made_durable() {
    let mut c = led_by_1();
    c.raft(1).propose(Bytes::from_static(b"y")).unwrap();
    c.stabilize();
    let applied = c.raft(2).applied_index();
    // A fresh append that also commits itself (as after a leader's retry).
    let entry = one_more_entry(&mut c, b"z", None);
    let term = entry.term;
    let (_, after, committed) = write_only(&mut c, 2);
    assert!(!after.is_empty(), "the acknowledgement waits for the sync");
    assert!(
        committed.iter().all(|e| e.index < entry.index),
        "an unsynced entry was handed out to apply"
    );
    // Whatever else was applied, nothing at the new index is until the sync.
    while c.raft(2).has_ready() {
        let _ = write_only(&mut c, 2);
    }
    assert!(c.raft(2).applied_index() < entry.index);
    assert!(c.raft(2).applied_index() >= applied);
    c.raft(2).log_synced(entry.index, term);
    let rd = c.raft(2).ready();
    assert_eq!(rd.committed_entries.last().map(|e| e.index), Some(entry.index));
    c.raft(2).advance();
    assert_eq!(c.raft(2).applied_index(), entry.index);
}

#[test]
fn a_sync_of_an_entry_since_replaced_counts_for_nothing() {
    let mut c = led_by_1();
    // Node 2 writes an entry of term t that the next leader replaces.
    let last = c.raft(2).last_index();
    let term = c.raft(2).term();
    let stale = one_more_entry(&mut c, b"lost", Some(last));
    let _ = write_only(&mut c, 2);
    // A leader of a later term makes itself known (a new term: synced at once)...
    let newer = Term(term.0 + 1);
    c.raft(2).step(Message {
        from: NodeId(3),
        to: NodeId(2),
        term: newer,
        body: MessageBody::Heartbeat { commit: last, seq: Default::default() },
    });
    let rd = c.raft(2).ready();
    assert!(!rd.may_sync_later(), "a new term must be durable before it is acted on");
    c.raft(2).advance();
    // ...then overwrites the stale entry and commits its own there; only written so far.
    let replacement =
        Entry { index: stale.index, term: newer, payload: EntryPayload::Normal(Bytes::new()) };
    c.raft(2).step(Message {
        from: NodeId(3),
        to: NodeId(2),
        term: newer,
        body: MessageBody::Append {
            prev_index: last,
            prev_term: term,
            entries: vec![replacement],
            commit: stale.index,
        },
    });
    let _ = write_only(&mut c, 2);
    // The stale write's sync reports late: it says nothing about the replacement.
    c.raft(2).log_synced(stale.index, term);
    assert!(!c.raft(2).has_ready(), "the replacement must not be applied before its own sync");
    assert!(c.raft(2).applied_index() < stale.index);
    c.raft(2).log_synced(stale.index, newer);
    assert!(c.raft(2).has_ready());
}

#[test]
fn a_vote_cannot_be_deferred() {
    let mut c = led_by_1();
    let last = c.raft(2).last_index();
    let term = c.raft(2).term();
    c.raft(2).step(Message {
        from: NodeId(3),
        to: NodeId(2),
        term: Term(term.0 + 5),
        body: MessageBody::Vote {
            pre_vote: false,
            last_index: last,
            last_term: term,
            transfer: true,
        },
    });
    let rd = c.raft(2).ready();
    assert!(!rd.may_sync_later(), "a vote must be durable before it is sent");
    let raft = c.raft(2);
    let deferred =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| raft.advance_written()));
    let msg = deferred.expect_err("advance_written must refuse a Ready with a vote");
    let msg = msg.downcast_ref::<&str>().copied().unwrap_or_default();
    assert!(msg.contains("must be synced"), "{msg}");
}
