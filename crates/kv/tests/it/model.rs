//! The store against the executable model: random commands and reads over a small key space,
//! with restarts (index rebuilt from the backend) and physical compaction mixed in. Every
//! response and error must be identical.

use crate::common;

use bytes::Bytes;
use cairn_kv::backend::MemBackend;
use cairn_kv::model::Model;
use cairn_kv::*;
use common::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Step {
    Cmd(Command),
    Read(RangeRequest),
    Restart,
    PhysicalCompaction,
    /// Commit every execution not yet committed.
    Flush,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => put_req().prop_map(|p| Step::Cmd(Command::Put(p))),
        2 => delete_req().prop_map(|d| Step::Cmd(Command::DeleteRange(d))),
        4 => txn(1).prop_map(|t| Step::Cmd(Command::Txn(t))),
        1 => (0i64..30).prop_map(|r| Step::Cmd(Command::Compact(CompactRequest { revision: Revision(r), physical: false }))),
        1 => publish().prop_map(Step::Cmd),
        2 => lease_cmd().prop_map(Step::Cmd),
        5 => range_req().prop_map(Step::Read),
        1 => Just(Step::Restart),
        1 => Just(Step::PhysicalCompaction),
        2 => Just(Step::Flush),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Commands run through `execute` with commits deferred and grouped, as the engine does.
    /// Outcomes must match the model at once and reads see every execution; a restart loses the
    /// uncommitted executions, and replaying them (as the WAL would) gives the same outcomes.
    #[test]
    fn store_matches_the_model(steps in prop::collection::vec(step(), 1..80)) {
        let backend = Shared::default();
        let mut store = Store::open(backend.clone()).unwrap();
        let mut model = Model::default();
        let mut published = Model::default();
        let mut raft_index = 0u64;
        let mut pending = Vec::new();
        let mut uncommitted: Vec<(u64, Command, Outcome)> = Vec::new();
        for s in steps {
            match s {
                Step::Cmd(cmd) => {
                    raft_index += 1;
                    let (mut outs, prepared) = store.execute(&[(raft_index, Some(&cmd))]).unwrap();
                    let got = outs.pop().flatten().expect("an outcome");
                    let want = model.apply_at(raft_index, &cmd);
                    prop_assert_eq!(&got, &want, "command {:?}", cmd);
                    pending.push(prepared);
                    uncommitted.push((raft_index, cmd, Some(got)));
                }
                Step::Flush => {
                    store.commit(std::mem::take(&mut pending)).unwrap();
                    uncommitted.clear();
                    published = model.clone();
                    prop_assert_eq!(store.current_revision(), model.current());
                    prop_assert_eq!(&store.members(), model.members());
                    leases_match(&store, &model)?;
                }
                Step::Read(req) => prop_assert_eq!(store.range(&req), model.range(&req), "read {:?}", req),
                Step::Restart => {
                    drop(store);
                    pending.clear();
                    store = Store::open(backend.clone()).unwrap();
                    prop_assert_eq!(store.current_revision(), published.current());
                    prop_assert_eq!(store.range(&everything()), published.range(&everything()));
                    prop_assert_eq!(&store.members(), published.members());
                    leases_match(&store, &published)?;
                    for (i, cmd, outcome) in &uncommitted {
                        let (mut outs, prepared) = store.execute(&[(*i, Some(cmd))]).unwrap();
                        prop_assert_eq!(&outs.pop().flatten(), outcome, "replay of {} differs", i);
                        pending.push(prepared);
                    }
                }
                Step::PhysicalCompaction => {
                    store.compact_step(2).unwrap();
                }
            }
        }
        store.commit(pending).unwrap();
        while store.compact_step(3).unwrap() {}
        prop_assert_eq!(store.applied_index(), raft_index);
        prop_assert_eq!(store.range(&everything()), model.range(&everything()));
        prop_assert_eq!(&store.members(), model.members());
        leases_match(&store, &model)?;
    }
}

/// Every lease and the keys each holds are the model's.
fn leases_match<B: backend::Backend>(
    store: &Store<B>,
    model: &model::Model,
) -> Result<(), TestCaseError> {
    let leases: Vec<Lease> = model.leases().values().copied().collect();
    prop_assert_eq!(store.leases(), leases);
    for id in model.leases().keys() {
        prop_assert_eq!(store.lease_keys(*id), model.lease_keys(*id), "keys of lease {:?}", id);
    }
    Ok(())
}

/// Publishing attributes moves neither the revision nor HashKV, leaves Range alone, and the
/// attributes outlive a restart once committed.
#[test]
fn published_attributes_live_beside_the_key_space() {
    let backend = Shared::default();
    let store = Store::open(backend.clone()).unwrap();
    let put = Command::Put(PutRequest {
        key: Bytes::from_static(b"k"),
        value: Bytes::from_static(b"v"),
        ..PutRequest::default()
    });
    store.apply(&[(1, Some(&put))]).unwrap();
    let before = (store.current_revision(), store.hash_kv(Revision(0)), store.range(&everything()));
    let attributes = MemberAttributes {
        name: "m1".to_string(),
        client_urls: vec!["http://127.0.0.1:2379".to_string()],
        ..Default::default()
    };
    let publish = Command::PublishMember { member: 7, attributes: attributes.clone() };
    let outcome = store.apply(&[(2, Some(&publish))]).unwrap();
    assert_eq!(outcome, vec![Some(Ok(CommandResponse::PublishMember))]);
    let after = (store.current_revision(), store.hash_kv(Revision(0)), store.range(&everything()));
    assert_eq!(after, before, "the key space did not change");
    assert_eq!(store.applied_index(), 2);
    assert_eq!(store.member(7), Some(attributes.clone()));
    // A later publish replaces the attributes; executed, it is visible before it is committed.
    let moved =
        MemberAttributes { client_urls: vec!["http://10.0.0.1:2379".to_string()], ..attributes };
    let again = Command::PublishMember { member: 7, attributes: moved.clone() };
    let (_, prepared) = store.execute(&[(3, Some(&again))]).unwrap();
    assert_eq!(store.member(7), Some(moved.clone()));
    store.commit(vec![prepared]).unwrap();
    drop(store);
    let reopened = Store::open(backend).unwrap();
    assert_eq!(reopened.applied_index(), 3);
    assert_eq!(reopened.members(), [(7, moved)].into_iter().collect());
    assert_eq!(reopened.current_revision(), before.0);
}

#[test]
fn the_membership_keeps_peer_urls_apart_from_what_members_publish() {
    let backend = Shared::default();
    let store = Store::open(backend.clone()).expect("open");
    let peers = vec!["http://127.0.0.1:2380".to_string()];
    let add = Command::Membership { peers: vec![(9, peers.clone())], removed: vec![] };
    let attributes = MemberAttributes {
        name: "n9".into(),
        client_urls: vec!["http://127.0.0.1:2379".into()],
        ..Default::default()
    };
    let publish = Command::PublishMember { member: 9, attributes: attributes.clone() };
    store.apply(&[(1, Some(&add)), (2, Some(&publish))]).expect("apply");
    let joined = MemberAttributes { peer_urls: peers.clone(), ..attributes.clone() };
    assert_eq!(store.member(9), Some(joined.clone()), "publishing keeps the peer URLs");
    let remove = Command::Membership { peers: vec![], removed: vec![9] };
    store.apply(&[(3, Some(&remove)), (4, Some(&publish))]).expect("apply");
    let gone = MemberAttributes { removed: true, ..Default::default() };
    assert_eq!(store.member(9), Some(gone.clone()), "a removed member's late publish is ignored");
    drop(store);
    let reopened = Store::open(backend).expect("reopen");
    assert_eq!(reopened.member(9), Some(gone));
    // Attributes stored before peer URLs existed end after the client URLs.
    let old = MemberAttributes { peer_urls: vec![], ..joined };
    assert_eq!(MemberAttributes::decode(&old.encode()).expect("decode"), old);
    let mut raw = old.encode();
    raw.push(7);
    assert!(MemberAttributes::decode(&raw).is_err(), "a stray byte is not a removed flag");
}

#[test]
fn replayed_entries_are_not_applied_twice() {
    let store = Store::open(MemBackend::default()).unwrap();
    let put = Command::Put(PutRequest {
        key: Bytes::from_static(b"k"),
        value: Bytes::from_static(b"v"),
        ..PutRequest::default()
    });
    store.apply(&[(1, Some(&put)), (2, None), (3, Some(&put))]).unwrap();
    assert_eq!(store.current_revision(), Revision(3));
    let again = store.apply(&[(2, None), (3, Some(&put)), (4, Some(&put))]).unwrap();
    assert_eq!(again[1], None, "index 3 was applied before");
    assert!(matches!(again[2], Some(Ok(_))));
    assert_eq!(store.current_revision(), Revision(4));
    assert_eq!(store.applied_index(), 4);
}
