//! Watch against the executable model: random histories with compactions, commits and restarts,
//! and watchers created at any moment from any revision (past, present or future), with any
//! range and filters, read in runs of any length through a ring of any size. Every watcher must
//! receive exactly the model's changes for it: in order, each once, whole revisions per reply,
//! with the right prev_kv; or be canceled with the compaction revision when its history went.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use cairn_kv::watch::group::{WatchGroup, WatchReply};
use cairn_kv::watch::{EventKind, WatchSpec};
use cairn_kv::*;
use common::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Step {
    Cmd(Command),
    Flush,
    Restart,
    PhysicalCompaction,
    Watch(WatchSpec),
    Cancel(usize),
    /// Read events for the watchers, at most this many revisions per read.
    Pump(usize),
}

fn spec() -> impl Strategy<Value = WatchSpec> {
    (key(), range_end(), -1i64..40, any::<bool>(), 0u8..4).prop_map(
        |(key, range_end, start, prev_kv, filter)| WatchSpec {
            key,
            range_end,
            start_revision: Revision(start.max(0)),
            prev_kv,
            no_put: filter == 1,
            no_delete: filter == 2,
            ..WatchSpec::default()
        },
    )
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => put_req().prop_map(|p| Step::Cmd(Command::Put(p))),
        2 => delete_req().prop_map(|d| Step::Cmd(Command::DeleteRange(d))),
        3 => txn(1).prop_map(|t| Step::Cmd(Command::Txn(t))),
        1 => (0i64..30).prop_map(|r| Step::Cmd(Command::Compact(CompactRequest { revision: Revision(r), physical: false }))),
        2 => lease_cmd().prop_map(Step::Cmd),
        2 => Just(Step::Flush),
        1 => Just(Step::Restart),
        1 => Just(Step::PhysicalCompaction),
        3 => spec().prop_map(Step::Watch),
        1 => (0usize..8).prop_map(Step::Cancel),
        4 => (1usize..6).prop_map(Step::Pump),
    ]
}

/// What the test knows of one watcher.
#[derive(Debug)]
struct Watcher {
    spec: WatchSpec,
    /// The first revision it must receive.
    start: Revision,
    /// (revision, key, kind, kv, prev_kv) as received.
    got: Vec<(Revision, Bytes, EventKind, KeyValue, Option<KeyValue>)>,
    /// Revisions already received, for atomicity.
    revisions: BTreeSet<Revision>,
    /// The header revision of its last reply.
    header: Revision,
    compacted_at: Option<Revision>,
    canceled: bool,
}

fn pump<B: backend::Backend>(store: &Store<B>, group: &mut WatchGroup, max: usize) {
    let head = store.current_revision();
    let mut from = Revision(i64::MIN);
    while let Some(wanted) = group.wanted(from, head) {
        match store.events(wanted, max).unwrap() {
            History::Compacted(c) => group.compacted(c),
            History::Events(None) => panic!("revision {wanted} <= head {head} has no run"),
            History::Events(Some(run)) => {
                assert_eq!(run.first, wanted);
                group.deliver(&run);
                from = run.last.next();
            }
        }
    }
}

fn take(
    group: &mut WatchGroup,
    watchers: &mut BTreeMap<i64, Watcher>,
) -> Result<(), TestCaseError> {
    while let Some(r) = group.pop() {
        let WatchReply { watch_id, revision, canceled, compact_revision, events, prev_kv, .. } = r;
        let w = watchers.get_mut(&watch_id).expect("a reply for a known watcher");
        prop_assert!(!w.canceled, "a reply after cancelation");
        if canceled {
            w.canceled = true;
            if compact_revision.0 != 0 {
                w.compacted_at = Some(compact_revision);
            }
            continue;
        }
        prop_assert!(!events.is_empty(), "event replies carry events");
        let mut in_reply = BTreeSet::new();
        for e in &events {
            let rev = e.revision();
            prop_assert!(rev <= revision, "header {} runs behind event {}", revision, rev);
            prop_assert!(
                rev > w.header,
                "event {} at or below an earlier header {}",
                rev,
                w.header
            );
            prop_assert!(!w.revisions.contains(&rev), "revision {} split across replies", rev);
            in_reply.insert(rev);
            let prev = if prev_kv { e.prev_kv.clone() } else { None };
            w.got.push((rev, e.kv.key.clone(), e.kind, e.kv.clone(), prev));
        }
        w.revisions.extend(in_reply);
        w.header = revision;
    }
    Ok(())
}

/// The model's changes a watcher must receive, in the form it receives them.
fn expected(
    model: &model::Model,
    w: &Watcher,
) -> Vec<(Revision, Bytes, EventKind, KeyValue, Option<KeyValue>)> {
    let range = w.spec.range();
    let changes = model.changes_from(w.start).expect("not compacted");
    let mut out = Vec::new();
    for (rev, key, after, before) in changes {
        let (kind, kv) = match after {
            Some(kv) => (EventKind::Put, kv),
            None => (
                EventKind::Delete,
                KeyValue { key: key.clone(), mod_revision: rev, ..KeyValue::default() },
            ),
        };
        let filtered = match kind {
            EventKind::Put => w.spec.no_put,
            EventKind::Delete => w.spec.no_delete,
        };
        if filtered || !range.contains(&key) {
            continue;
        }
        let prev = if w.spec.prev_kv { before } else { None };
        out.push((rev, key, kind, kv, prev));
    }
    out
}

/// Compares what a watcher got with what it should have: events in the same order (within a
/// revision, the store's order is the request's; compared by key), and prev_kv equal, or absent
/// where history read later had it compacted.
fn check(model: &model::Model, compacted: Revision, w: &Watcher) -> Result<(), TestCaseError> {
    let mut want = expected(model, w);
    let mut got = w.got.clone();
    if w.compacted_at.is_some() {
        want.truncate(got.len());
    }
    let by_rev_key =
        |a: &(Revision, Bytes, EventKind, KeyValue, Option<KeyValue>),
         b: &(Revision, Bytes, EventKind, KeyValue, Option<KeyValue>)| {
            (a.0, &a.1).cmp(&(b.0, &b.1))
        };
    prop_assert!(got.windows(2).all(|p| p[0].0 <= p[1].0), "events out of revision order");
    got.sort_by(by_rev_key);
    want.sort_by(by_rev_key);
    prop_assert_eq!(got.len(), want.len(), "{:?}: got {:?}, want {:?}", w.spec, got, want);
    for (g, x) in got.iter().zip(&want) {
        prop_assert_eq!((&g.0, &g.1, &g.2, &g.3), (&x.0, &x.1, &x.2, &x.3));
        let compacted_prev = g.4.is_none() && Revision(g.0 .0 - 1) < compacted;
        prop_assert!(g.4 == x.4 || compacted_prev, "prev_kv {:?}, want {:?}", g.4, x.4);
    }
    Ok(())
}

/// The store, the models and the watchers of one run.
struct World {
    backend: Shared,
    store: Store<Shared>,
    ring: usize,
    model: model::Model,
    /// The same history never compacted: what watchers that read before a compaction got.
    full: model::Model,
    group: WatchGroup,
    watchers: BTreeMap<i64, Watcher>,
    raft_index: u64,
    pending: Vec<Prepared>,
    uncommitted: Vec<(u64, Command)>,
}

impl World {
    fn new(ring: usize) -> World {
        let backend = Shared::default();
        let store = Store::open(backend.clone()).unwrap();
        store.set_event_ring_bytes(ring);
        World {
            backend,
            store,
            ring,
            model: model::Model::default(),
            full: model::Model::default(),
            group: WatchGroup::new(),
            watchers: BTreeMap::new(),
            raft_index: 0,
            pending: Vec::new(),
            uncommitted: Vec::new(),
        }
    }

    fn command(&mut self, cmd: Command) -> Result<(), TestCaseError> {
        self.raft_index += 1;
        let (_, prepared) = self.store.execute(&[(self.raft_index, Some(&cmd))]).unwrap();
        // What failed changed nothing (perhaps only because of a compaction `full` never
        // saw); what succeeded changes `full` the same way.
        let at = self.raft_index;
        if self.model.apply_at(at, &cmd).is_ok() && !matches!(cmd, Command::Compact(_)) {
            prop_assert!(self.full.apply_at(at, &cmd).is_ok());
        }
        self.pending.push(prepared);
        self.uncommitted.push((self.raft_index, cmd));
        Ok(())
    }

    fn restart(&mut self) {
        self.pending.clear();
        self.store = Store::open(self.backend.clone()).unwrap();
        self.store.set_event_ring_bytes(self.ring);
        for (i, cmd) in &self.uncommitted {
            let (_, prepared) = self.store.execute(&[(*i, Some(cmd))]).unwrap();
            self.pending.push(prepared);
        }
    }

    fn watch(&mut self, spec: WatchSpec) -> Result<(), TestCaseError> {
        let head = self.store.current_revision();
        let start = match spec.start_revision {
            Revision(0) => head.next(),
            s => s,
        };
        if let Ok(id) = self.group.create(spec.clone(), head) {
            let created = self.group.pop().expect("a created reply");
            prop_assert!(created.created && created.watch_id == id && created.revision == head);
            let w = Watcher {
                spec,
                start,
                got: Vec::new(),
                revisions: BTreeSet::new(),
                header: Revision(0),
                compacted_at: None,
                canceled: false,
            };
            self.watchers.insert(id, w);
        } else {
            let refused = self.group.pop().expect("a refusal");
            prop_assert!(refused.created && refused.canceled);
        }
        Ok(())
    }

    fn cancel(&mut self, i: usize) -> Result<(), TestCaseError> {
        let live = self.watchers.iter().filter(|(_, w)| !w.canceled);
        let ids: Vec<i64> = live.map(|(id, _)| *id).collect();
        if let Some(id) = ids.get(i % ids.len().max(1)) {
            self.group.cancel(*id, self.store.current_revision());
            take(&mut self.group, &mut self.watchers)?;
            prop_assert!(self.watchers[id].canceled, "cancel acknowledged");
            self.watchers.remove(id);
        }
        Ok(())
    }

    fn step(&mut self, s: Step) -> Result<(), TestCaseError> {
        match s {
            Step::Cmd(cmd) => self.command(cmd)?,
            Step::Flush => {
                self.store.commit(std::mem::take(&mut self.pending)).unwrap();
                self.uncommitted.clear();
            }
            Step::Restart => self.restart(),
            Step::PhysicalCompaction => {
                self.store.compact_step(2).unwrap();
            }
            Step::Watch(spec) => self.watch(spec)?,
            Step::Cancel(i) => self.cancel(i)?,
            Step::Pump(max) => {
                pump(&self.store, &mut self.group, max);
                take(&mut self.group, &mut self.watchers)?;
            }
        }
        Ok(())
    }

    /// Catches every watcher up and checks what each received.
    fn finish(mut self) -> Result<(), TestCaseError> {
        pump(&self.store, &mut self.group, 1000);
        take(&mut self.group, &mut self.watchers)?;
        for w in self.watchers.values() {
            if let Some(c) = w.compacted_at {
                prop_assert!(c > w.start || w.got.last().is_some_and(|e| e.0.next() < c));
            }
            check(&self.full, self.model.compacted(), w)?;
        }
        // Every watcher is caught up now: a progress request is answered at the head, unless
        // one waits for a future revision (etcd then holds it back too).
        let head = self.store.current_revision();
        let live: Vec<&Watcher> = self.watchers.values().filter(|w| !w.canceled).collect();
        if !live.is_empty() {
            self.group.request_progress();
            self.group.settle(head);
            let p = self.group.pop();
            if live.iter().all(|w| w.start <= head.next()) {
                prop_assert!(p.is_some_and(|p| p.watch_id == -1 && p.revision == head));
            } else {
                prop_assert!(p.is_none(), "progress claimed below a future watcher's start");
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn watchers_receive_exactly_the_models_changes(
        steps in prop::collection::vec(step(), 1..120),
        ring in prop_oneof![Just(0usize), Just(300), Just(1 << 20)],
    ) {
        let mut world = World::new(ring);
        for s in steps {
            world.step(s)?;
        }
        world.finish()?;
    }
}
