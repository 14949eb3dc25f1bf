//! The simulator must catch real bugs: each test plants one behind a test-only switch (in the
//! consensus core or in the replica) and asserts that the matching checker reports it within a
//! bounded number of seeds. A simulator whose checkers were broken would pass every seed and
//! fail these tests.

use cairn_node::ReplicaBug;
use cairn_raft::{PlantedBug, ReadMode};
use cairn_sim::{run, Failure, Options};

/// Runs `seeds` with the bug planted; returns the first failure.
fn first_failure(
    seeds: std::ops::RangeInclusive<u64>,
    base: fn(u64) -> Options,
    tune: impl Fn(&mut Options),
) -> Option<Failure> {
    // A failed assertion in the core panics, and the simulator catches it. Silence the
    // default hook's backtrace spam for the expected panics.
    std::panic::set_hook(Box::new(|_| {}));
    let found = seeds.into_iter().find_map(|seed| {
        let mut o = base(seed);
        tune(&mut o);
        run(o).err()
    });
    let _ = std::panic::take_hook();
    found
}

#[test]
fn catches_commit_of_previous_term_entry_figure_8() {
    // Counting replicas of an earlier term's entry (§5.4.2) shows once leaders change often and
    // entries travel one per message, so an old entry can reach a majority on its own.
    let f = first_failure(1..=300, Options::for_seed, |o| {
        o.bug = Some(PlantedBug::CommitPreviousTerm);
        o.voters = 3;
        o.max_msg_bytes = 1;
        o.chaos = 20.0;
    })
    .expect("the simulator must find the Figure 8 bug");
    assert!(
        f.what.contains("leader completeness")
            || f.what.contains("state-machine safety")
            || f.what.contains("committed"),
        "unexpected failure: {f:?}"
    );
}

#[test]
fn catches_votes_that_ignore_the_log() {
    let f = first_failure(1..=100, Options::for_seed, |o| {
        o.bug = Some(PlantedBug::VoteIgnoresLog);
    })
    .expect("the simulator must find votes granted to stale logs");
    assert!(!f.what.contains("liveness"), "expected a safety violation, got {f:?}");
}

#[test]
fn catches_reads_served_without_a_quorum() {
    let f = first_failure(1..=300, Options::for_seed, |o| {
        o.bug = Some(PlantedBug::ReadSkipsQuorum);
        o.read_mode = ReadMode::Safe;
    })
    .expect("the simulator must find stale reads");
    assert!(f.what.contains("linearizable read"), "unexpected failure: {f:?}");
}

#[test]
fn catches_acknowledgements_before_the_log_is_durable() {
    let f = first_failure(1..=100, Options::stack_for_seed, |o| {
        o.replica_bug = Some(ReplicaBug::AckBeforeFsync);
    })
    .expect("the stack simulator must find writes acknowledged before their fsync");
    assert!(!f.what.contains("liveness"), "expected lost data, got {f:?}");
}

#[test]
fn catches_linearizable_reads_served_without_read_index() {
    let f = first_failure(1..=100, Options::stack_for_seed, |o| {
        o.replica_bug = Some(ReplicaBug::ReadWithoutIndex);
    })
    .expect("the stack simulator must find stale reads");
    assert!(
        f.what.contains("linearizable read") || f.what.contains("real-time"),
        "unexpected failure: {f:?}"
    );
}

#[test]
fn catches_snapshots_sent_without_the_store() {
    let f = first_failure(1..=100, Options::stack_for_seed, |o| {
        o.replica_bug = Some(ReplicaBug::EmptySnapshot);
    })
    .expect("the stack simulator must find snapshots that lose the store");
    assert!(!f.what.contains("liveness"), "expected divergence, got {f:?}");
}

#[test]
fn catches_leases_expired_before_their_ttl() {
    let f = first_failure(1..=30, Options::stack_for_seed, |o| {
        o.replica_bug = Some(ReplicaBug::LeaseExpiresEarly);
    })
    .expect("the stack simulator must find leases revoked early");
    assert!(f.what.contains("revoked as expired"), "unexpected failure: {f:?}");
}

#[test]
fn catches_expired_leases_never_revoked() {
    let f = first_failure(1..=30, Options::stack_for_seed, |o| {
        o.replica_bug = Some(ReplicaBug::LeaseNeverExpires);
    })
    .expect("the stack simulator must find leases that outlive their TTL");
    assert!(f.what.contains("liveness") && f.what.contains("leases left"), "{f:?}");
}

#[test]
fn failures_replay_identically_from_their_seed() {
    let tune = |o: &mut Options| o.replica_bug = Some(ReplicaBug::ReadWithoutIndex);
    let f = first_failure(1..=100, Options::stack_for_seed, tune).expect("a failing seed");
    let mut o = Options::stack_for_seed(f.seed);
    tune(&mut o);
    let again = run(o).expect_err("the same seed fails again");
    assert_eq!((again.time, again.what), (f.time, f.what));
}

#[test]
fn catches_a_leader_counting_its_own_copy_before_the_sync() {
    // Under asynchronous writes the leader's copy counts only once synced: counted at the
    // write, an entry committed by the leader and one follower is lost when the leader crashes
    // before its sync and the others elect one without it. Slow syncs widen that window; the
    // bug shows in about one seed in eighty.
    let f = first_failure(1..=400, Options::for_seed, |o| {
        o.bug = Some(PlantedBug::CountUnsyncedOwnCopy);
        o.async_writes = true;
        o.sync_rate = 0.01;
        o.voters = 3;
        o.chaos = 5.0;
    })
    .expect("the simulator must find commits counted on an unsynced leader copy");
    assert!(!f.what.contains("liveness"), "expected a safety violation, got {f:?}");
}
