//! Ranges read in steps (`Store::range_begin` / `range_step`) give exactly the answer of a read
//! under one lock at the moment they began, whatever runs between their steps: writes,
//! deletes, compactions above the read's revision, physical compaction, and commits of records
//! that were in the overlay of uncommitted records when the read began.

use crate::common;

use cairn_kv::*;
use common::*;
use proptest::prelude::*;

/// What runs between two steps of a read.
#[derive(Clone, Debug)]
enum Between {
    /// Executed, its records left in the overlay until a `Commit`.
    Cmd(Command),
    /// Commits what was executed.
    Commit,
    /// A compaction at the current revision: above the read's once anything was written.
    CompactToCurrent,
    /// Sheds index history and removes records, as the committer does between its commits.
    PhysicalCompaction,
    Nothing,
}

fn between() -> impl Strategy<Value = Between> {
    // Compactions up to 60: above the revision of any read, which the pins must hold off.
    let compact = |r| Command::Compact(CompactRequest { revision: Revision(r), physical: false });
    prop_oneof![
        4 => command().prop_map(Between::Cmd),
        2 => Just(Between::Commit),
        3 => (0i64..60).prop_map(move |r| Between::Cmd(compact(r))),
        2 => Just(Between::CompactToCurrent),
        3 => Just(Between::PhysicalCompaction),
        1 => Just(Between::Nothing),
    ]
}

#[derive(Default)]
struct Applier {
    raft_index: u64,
    /// Executed and not yet committed, in execution order.
    pending: Vec<Prepared>,
}

impl Applier {
    fn run<B: backend::Backend>(&mut self, store: &Store<B>, b: &Between) {
        match b {
            Between::Cmd(cmd) => {
                self.raft_index += 1;
                let (_, prepared) = store.execute(&[(self.raft_index, Some(cmd))]).expect("exec");
                self.pending.push(prepared);
            }
            Between::Commit => store.commit(std::mem::take(&mut self.pending)).expect("commit"),
            Between::CompactToCurrent => {
                let revision = store.current_revision();
                let compact = Command::Compact(CompactRequest { revision, physical: false });
                self.run(store, &Between::Cmd(compact));
            }
            Between::PhysicalCompaction => {
                // Only a committed compaction is cleaned up, as the committer does it.
                self.run(store, &Between::Commit);
                while store.compact_step(2).expect("compact step") {}
            }
            Between::Nothing => {}
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn a_stepped_read_answers_as_one_read_at_its_start(
        history in prop::collection::vec(command(), 0..40),
        req in range_req(),
        step_keys in 1usize..3,
        step_bytes in 1u64..100,
        meanwhile in prop::collection::vec(prop::collection::vec(between(), 0..4), 0..20),
    ) {
        let store = Store::open(Shared::default()).expect("open");
        let mut applier = Applier::default();
        for cmd in &history {
            applier.run(&store, &Between::Cmd(cmd.clone()));
        }
        let whole = store.range(&req);
        let stepped = (|| {
            let mut read = store.range_begin(&req, step_keys, step_bytes)?;
            let mut meanwhile = meanwhile.iter();
            while !read.done() {
                for b in meanwhile.next().into_iter().flatten() {
                    applier.run(&store, b);
                }
                store.range_step(&mut read, step_keys, step_bytes)?;
            }
            Ok::<_, KvError>(read.finish())
        })();
        prop_assert_eq!(stepped, whole);
    }
}

/// The plan counts what the answer will hold before any value is read.
#[test]
fn the_plan_says_how_many_bytes_the_answer_holds() {
    let store = Store::open(Shared::default()).expect("open");
    let mut raft_index = 0;
    for i in 0..100u32 {
        raft_index += 1;
        let put = PutRequest {
            key: format!("k{i:03}").into(),
            value: vec![b'v'; i as usize].into(),
            ..PutRequest::default()
        };
        store.apply(&[(raft_index, Some(&Command::Put(put)))]).expect("put");
    }
    let req = RangeRequest::prefix("k");
    let mut read = store.range_begin(&req, 10, u64::MAX).expect("begin");
    let mut steps = 1;
    while !read.planned() {
        store.range_step(&mut read, 10, u64::MAX).expect("plan step");
        steps += 1;
    }
    assert_eq!(steps, 10, "100 keys planned 10 at a time");
    let want: u64 = (0..100u64).map(|i| 4 + i + KV_OVERHEAD_BYTES).sum();
    assert_eq!(read.bytes(), want);
    while !read.done() {
        store.range_step(&mut read, 7, 300).expect("read step");
    }
    let resp = read.finish();
    assert_eq!(resp.kvs.len(), 100);
    assert_eq!(resp.count, 100);
    assert_eq!(resp.kvs[99].value.len(), 99);
}

/// A read spanning an install (a snapshot replacing the state) fails rather than mixing two
/// states.
#[test]
fn a_read_across_an_install_is_interrupted() {
    let store = Store::open(Shared::default()).expect("open");
    for i in 0..20u64 {
        let put = PutRequest { key: format!("k{i:02}").into(), ..PutRequest::default() };
        store.apply(&[(i + 1, Some(&Command::Put(put)))]).expect("put");
    }
    let image = store.image().expect("image");
    let mut read = store.range_begin(&RangeRequest::prefix("k"), 5, u64::MAX).expect("begin");
    store.install(&image).expect("install");
    assert_eq!(store.range_step(&mut read, 5, u64::MAX), Err(KvError::Interrupted));
}

/// The case the pins exist for: a key changed after the read began, a compaction above the
/// read's revision, and its physical cleanup, all before the read reaches the key.
#[test]
fn a_compaction_above_the_read_waits_for_it() {
    let store = Store::open(Shared::default()).expect("open");
    let mut a = Applier::default();
    let put = |k: &str, v: &str| {
        Between::Cmd(Command::Put(PutRequest {
            key: k.to_string().into(),
            value: v.to_string().into(),
            ..PutRequest::default()
        }))
    };
    for k in ["a", "b", "c"] {
        a.run(&store, &put(k, "old"));
    }
    let req = RangeRequest::prefix("");
    let whole = store.range(&req).expect("whole");
    let mut read = store.range_begin(&req, 1, u64::MAX).expect("begin");
    for b in [put("c", "new"), Between::CompactToCurrent, Between::PhysicalCompaction] {
        a.run(&store, &b);
    }
    while !read.done() {
        store.range_step(&mut read, 1, u64::MAX).expect("step");
    }
    assert_eq!(read.finish(), whole);
    // Once the read is gone, the compaction completes.
    a.run(&store, &Between::PhysicalCompaction);
    assert!(store.physically_compacted());
}

/// While a pinned read holds a compaction's cleanup, there is no compaction work to do (the
/// committer loops while there is, and would spin); once the read ends, there is again.
#[test]
fn a_held_compaction_is_no_work_until_the_read_ends() {
    let store = Store::open(Shared::default()).expect("open");
    let mut a = Applier::default();
    for v in ["1", "2"] {
        let put = PutRequest { key: "k".into(), value: v.into(), ..PutRequest::default() };
        a.run(&store, &Between::Cmd(Command::Put(put)));
    }
    let read = store.range_begin(&RangeRequest::prefix(""), 1, u64::MAX).expect("begin");
    let put = PutRequest { key: "k".into(), value: "3".into(), ..PutRequest::default() };
    a.run(&store, &Between::Cmd(Command::Put(put)));
    a.run(&store, &Between::CompactToCurrent);
    a.run(&store, &Between::Commit);
    assert!(!store.compaction_work(), "held by the read at an older revision");
    assert!(!store.compact_step(10).expect("step"));
    assert!(!store.physically_compacted());
    drop(read);
    assert!(store.compaction_work());
    a.run(&store, &Between::PhysicalCompaction);
    assert!(store.physically_compacted());
}
