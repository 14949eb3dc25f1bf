//! The simulator must catch real protocol bugs: each test plants one behind the core's test-only
//! switch and asserts that the matching checker reports it within a bounded number of seeds.
//! A simulator whose checkers were broken would pass every seed and fail these tests.

use cairn_raft::{PlantedBug, ReadMode};
use cairn_sim::{run, Failure, Options};

/// Runs `seeds` with the bug planted; returns the first failure.
fn first_failure(
    seeds: std::ops::RangeInclusive<u64>,
    tune: impl Fn(&mut Options),
) -> Option<Failure> {
    // The core reports a failed assertion by panicking; the simulator catches it. Silence the
    // default hook's backtrace spam for the expected panics.
    std::panic::set_hook(Box::new(|_| {}));
    let found = seeds.into_iter().find_map(|seed| {
        let mut o = Options::for_seed(seed);
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
    let f = first_failure(1..=300, |o| {
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
    let f = first_failure(1..=100, |o| o.bug = Some(PlantedBug::VoteIgnoresLog))
        .expect("the simulator must find votes granted to stale logs");
    assert!(!f.what.contains("liveness"), "expected a safety violation, got {f:?}");
}

#[test]
fn catches_reads_served_without_a_quorum() {
    let f = first_failure(1..=300, |o| {
        o.bug = Some(PlantedBug::ReadSkipsQuorum);
        o.read_mode = ReadMode::Safe;
    })
    .expect("the simulator must find stale reads");
    assert!(f.what.contains("linearizable read"), "unexpected failure: {f:?}");
}

#[test]
fn failures_replay_identically_from_their_seed() {
    let tune = |o: &mut Options| o.bug = Some(PlantedBug::VoteIgnoresLog);
    let f = first_failure(1..=100, tune).expect("a failing seed");
    let mut o = Options::for_seed(f.seed);
    tune(&mut o);
    std::panic::set_hook(Box::new(|_| {}));
    let again = run(o).expect_err("the same seed fails again");
    let _ = std::panic::take_hook();
    assert_eq!((again.time, again.what), (f.time, f.what));
}
