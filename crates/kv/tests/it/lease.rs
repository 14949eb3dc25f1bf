//! Lease checkpoints against grants: a checkpoint the leader took for one grant of a lease id
//! must not land on a later grant of the same id, in the store (also once reopened) and in the
//! model alike.

use cairn_kv::model::Model;
use cairn_kv::*;

use crate::common::Shared;

const X: LeaseId = LeaseId(7);
const Y: LeaseId = LeaseId(8);

/// `commands` applied at Raft indexes 1, 2, … to a store and to the model, each outcome the
/// model's; the store's leases and the model's after them.
fn run(commands: &[Command]) -> (Vec<Lease>, Vec<Lease>) {
    let backend = Shared::default();
    let store = Store::open(backend.clone()).unwrap();
    let mut model = Model::default();
    for (i, cmd) in commands.iter().enumerate() {
        let index = i as u64 + 1;
        let got = store.apply(&[(index, Some(cmd))]).unwrap().pop().flatten();
        assert_eq!(got, Some(model.apply_at(index, cmd)), "command {cmd:?} at {index}");
    }
    let leases = store.lease_page(LeaseId(i64::MIN), 10);
    let reopened = Store::open(backend).unwrap().lease_page(LeaseId(i64::MIN), 10);
    assert_eq!(leases, reopened, "the store reads back what it wrote");
    (leases, model.leases().values().copied().collect())
}

fn checkpoint(id: LeaseId, grant_index: u64, remaining: i64) -> GrantCheckpoint {
    GrantCheckpoint { id, grant_index, remaining }
}

fn lease(id: LeaseId, grant_index: u64, remaining_ttl: i64) -> Lease {
    Lease { id, ttl: 60, remaining_ttl, grant_index }
}

/// A checkpoint proposed for grant A of lease X, committed after a client revoked X and granted
/// it again (grant B): B's remaining TTL stays its own, since B's clock started with B; the
/// other lease in the batch is checkpointed all the same.
#[test]
fn a_checkpoint_of_an_earlier_grant_leaves_a_new_grant_of_the_same_id_alone() {
    let commands = [
        Command::LeaseGrant { id: Y, ttl: 60 },
        Command::LeaseGrant { id: X, ttl: 60 }, // grant A, at index 2
        Command::LeaseRevoke { id: X },
        Command::LeaseGrant { id: X, ttl: 60 }, // grant B, at index 4
        // Taken for A (and for Y) by a leader that had not applied the revoke and grant.
        Command::LeaseGrantCheckpoint {
            checkpoints: vec![checkpoint(X, 2, 7), checkpoint(Y, 1, 9)],
        },
    ];
    let (store, model) = run(&commands);
    let want = vec![lease(X, 4, 0), lease(Y, 1, 9)];
    assert_eq!(store, want, "the store");
    assert_eq!(model, want, "the model");
}

/// A keepalive's clear taken for grant A leaves grant B's own checkpoint as it is; B's own
/// checkpoints and clears apply.
#[test]
fn a_clear_of_an_earlier_grant_leaves_a_new_grants_checkpoint_alone() {
    let mut commands = vec![
        Command::LeaseGrant { id: X, ttl: 60 }, // grant A, at index 1
        Command::LeaseRevoke { id: X },
        Command::LeaseGrant { id: X, ttl: 60 }, // grant B, at index 3
        Command::LeaseGrantCheckpoint { checkpoints: vec![checkpoint(X, 3, 20)] },
        Command::LeaseGrantCheckpoint { checkpoints: vec![checkpoint(X, 1, 0)] },
    ];
    let (store, model) = run(&commands);
    assert_eq!((store, model), (vec![lease(X, 3, 20)], vec![lease(X, 3, 20)]));
    commands.push(Command::LeaseGrantCheckpoint { checkpoints: vec![checkpoint(X, 3, 0)] });
    let (store, model) = run(&commands);
    assert_eq!((store, model), (vec![lease(X, 3, 0)], vec![lease(X, 3, 0)]));
}

/// A checkpoint by id alone, as an older cairn wrote them to its log, still applies to
/// whichever grant holds the id, as it did when it was written.
#[test]
fn a_checkpoint_by_id_applies_as_before() {
    let commands = [
        Command::LeaseGrant { id: X, ttl: 60 },
        Command::LeaseRevoke { id: X },
        Command::LeaseGrant { id: X, ttl: 60 },
        Command::LeaseCheckpoint { checkpoints: vec![(X, 5), (Y, 3)] },
    ];
    let (store, model) = run(&commands);
    assert_eq!((store, model), (vec![lease(X, 3, 5)], vec![lease(X, 3, 5)]));
}
