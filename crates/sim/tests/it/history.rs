//! The history checker on small hand-built histories, one correct and the others each breaking
//! one rule, and on random executions built to be linearizable against the model, which must
//! pass until one answer in them is changed.

use std::collections::BTreeMap;

use bytes::Bytes;
use cairn_kv::model::Model;
use cairn_kv::*;
use cairn_sim::checker::Violation;
use cairn_sim::history::{History, HistoryStats, OpId, OpKind, Outcome};
use cairn_sim::rng::Rng;

type WriteResult = Result<CommandResponse, KvError>;
/// A log entry's request, and the model's result for it.
type Entry = (Option<(OpId, Command)>, Option<WriteResult>);

fn put(key: &str, value: &str) -> Command {
    Command::Put(PutRequest { key: b(key), value: b(value), ..PutRequest::default() })
}

fn get(key: &str) -> RangeRequest {
    RangeRequest { key: b(key), ..RangeRequest::default() }
}

fn get_at(key: &str, rev: i64) -> RangeRequest {
    RangeRequest { revision: Revision(rev), ..get(key) }
}

fn compact(rev: i64) -> Command {
    Command::Compact(CompactRequest { revision: Revision(rev), physical: false })
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// A hand-built history, with the test's own replay of the log to produce the answers a
/// correct cluster would give.
struct Run {
    h: History,
    t: u64,
    model: Model,
    /// The model's (current, compacted) after each index; `[0]` is the empty log.
    states: Vec<(Revision, Revision)>,
    sent: BTreeMap<OpId, Command>,
    asked: BTreeMap<OpId, RangeRequest>,
    results: BTreeMap<OpId, WriteResult>,
}

impl Run {
    fn new() -> Run {
        Run {
            h: History::default(),
            t: 0,
            model: Model::default(),
            states: vec![(Revision::INITIAL, Revision::NEVER_COMPACTED)],
            sent: BTreeMap::new(),
            asked: BTreeMap::new(),
            results: BTreeMap::new(),
        }
    }

    fn tick(&mut self) -> u64 {
        self.t += 1;
        self.t
    }

    fn write(&mut self, op: OpId, cmd: Command) {
        self.sent.insert(op, cmd.clone());
        let at = self.tick();
        self.h.invoke(op, OpKind::Write(cmd), at);
    }

    fn read(&mut self, op: OpId, req: RangeRequest) {
        self.asked.insert(op, req.clone());
        let at = self.tick();
        self.h.invoke(op, OpKind::Read(req), at);
    }

    /// Commits `op`'s command at the next index; members 1 and 2 apply it. Returns the index.
    fn commit(&mut self, op: OpId) -> u64 {
        let cmd = self.sent[&op].clone();
        self.append(Some((op, cmd)))
    }

    fn append(&mut self, entry: Option<(OpId, Command)>) -> u64 {
        let index = self.states.len() as u64;
        let result = entry.as_ref().map(|(_, cmd)| self.model.apply_at(index, cmd));
        self.states.push((self.model.current(), self.model.compacted()));
        for member in [1, 2] {
            let applied = self.h.applied(member, index, entry.clone(), result.clone());
            applied.unwrap_or_else(|v| panic!("index {index} on member {member}: {}", v.0));
        }
        if let (Some((op, _)), Some(r)) = (&entry, result) {
            self.results.insert(*op, r);
        }
        index
    }

    /// Answers a write with the model's result for it.
    fn ack(&mut self, op: OpId) {
        let result = self.results[&op].clone();
        self.answer(op, Outcome::Write(result));
    }

    fn answer(&mut self, op: OpId, outcome: Outcome) {
        let at = self.tick();
        self.h.complete(op, outcome, at);
    }

    fn expected(&self, req: &RangeRequest, at_index: u64) -> Result<RangeResponse, KvError> {
        let (current, compacted) = self.states[at_index as usize];
        self.model.range_as_of(req, current, compacted)
    }

    /// Answers a read as a store that had executed the log through `at_index`.
    fn serve(&mut self, op: OpId, at_index: u64) {
        self.served(op, at_index).ok();
    }

    /// Answers a read as `serve` does; returns the answer.
    fn served(&mut self, op: OpId, at_index: u64) -> Result<RangeResponse, KvError> {
        let result = self.expected(&self.asked[&op], at_index);
        self.answer(op, Outcome::Read { result: result.clone(), at_index });
        result
    }
}

/// The check fails, and its message names what was violated.
fn fails_with<T: std::fmt::Debug>(r: Result<T, Violation>, words: &[&str]) {
    match r {
        Ok(t) => panic!("expected a violation naming {words:?}, but it passed: {t:?}"),
        Err(Violation(what)) => {
            for w in words {
                assert!(what.contains(w), "{what:?} does not mention {w:?}");
            }
        }
    }
}

fn value_of(r: &Result<RangeResponse, KvError>) -> Option<Bytes> {
    r.as_ref().expect("read succeeds").kvs.first().map(|kv| kv.value.clone())
}

/// If `key` holds `from`, it gets `to`; otherwise `key` is read.
fn cas(key: &str, from: &str, to: &str) -> Command {
    let when = Compare {
        key: b(key),
        range_end: Bytes::new(),
        target: CompareTarget::Value(b(from)),
        result: CompareResult::Equal,
    };
    let then = PutRequest { key: b(key), value: b(to), ..PutRequest::default() };
    Command::Txn(TxnRequest {
        compare: vec![when],
        success: vec![RequestOp::Put(then)],
        failure: vec![RequestOp::Range(get(key))],
    })
}

/// Writes, reads, a transaction, compactions, historical reads and unknown writes, with
/// operations overlapping, answered as a correct cluster would.
#[test]
fn a_correct_concurrent_history_passes() {
    let mut r = Run::new();
    // Writes 1 and 2 and read 3 overlap; the read is placed between the two writes.
    r.write(1, put("a", "1"));
    r.write(2, put("b", "1"));
    r.read(3, get("a"));
    r.commit(2); // index 1, revision 2
    assert_eq!(value_of(&r.served(3, 1)), None);
    r.commit(1); // index 2, revision 3
    r.ack(1);
    r.ack(2);
    r.write(4, cas("a", "1", "2"));
    r.append(None); // index 3: a new leader's empty entry
    r.commit(4); // index 4, revision 4
    r.ack(4);
    assert!(matches!(&r.results[&4], Ok(CommandResponse::Txn(t)) if t.succeeded));
    unknowns_compactions_and_historical_reads(&mut r);
    // A member's own entry (index 9) is no client's request, though its id is one of theirs:
    // each member draws ids from its own counter.
    let attributes =
        MemberAttributes { name: "m2".into(), client_urls: vec!["u".into()], ..Default::default() };
    r.append(Some((4, Command::PublishMember { member: 2, attributes })));
    let stats = r.h.check().unwrap_or_else(|v| panic!("{}", v.0));
    let want = HistoryStats {
        writes_acked: 6,
        writes_failed: 1,
        writes_unknown: 3,
        unknown_applied: 1,
        reads_checked: 4,
        reads_unanswered: 1,
        log_entries: 9,
        publishes: 1,
        executions_checked: 17,
        ..HistoryStats::default()
    };
    assert_eq!(stats, want);
}

/// The second half of the correct history, from index 5 on.
fn unknowns_compactions_and_historical_reads(r: &mut Run) {
    // Write 5's client gave up, but it was applied; write 6's was not; 7 never heard back;
    // 8 was refused before it was proposed.
    r.write(5, put("c", "1"));
    r.write(6, put("d", "1"));
    r.write(7, put("e", "1"));
    r.write(8, put("f", "1"));
    r.answer(5, Outcome::Unknown);
    r.answer(8, Outcome::Failed);
    r.commit(5); // index 5, revision 5
    r.answer(6, Outcome::Unknown);
    let ignore = PutRequest { key: b("zz"), ignore_value: true, ..PutRequest::default() };
    r.write(9, Command::Put(ignore));
    r.commit(9); // index 6: refused at apply time
    r.ack(9);
    assert_eq!(r.results[&9], Err(KvError::KeyNotFound));
    r.write(10, compact(3));
    r.commit(10); // index 7
    r.ack(10);
    r.write(11, compact(2));
    r.commit(11); // index 8: below the floor
    r.ack(11);
    assert_eq!(r.results[&11], Err(KvError::Compacted));
    // Historical reads after the compaction, one after another; reads may share a point.
    r.read(12, get_at("a", 2));
    assert_eq!(r.served(12, 8), Err(KvError::Compacted));
    r.read(13, get_at("a", 3));
    assert_eq!(value_of(&r.served(13, 8)), Some(b("1")));
    r.read(14, get("a"));
    assert_eq!(value_of(&r.served(14, 8)), Some(b("2")));
    // A member that installed a snapshot at 6 resumes at 7; one whose store already held 8.
    let outcome = Some(r.results[&10].clone());
    r.h.applied(3, 7, Some((10, compact(3))), outcome).expect("resumes after a snapshot");
    r.h.applied(3, 8, Some((11, compact(2))), None).expect("a replay is not compared");
    // A read whose member crashed before it answered.
    r.read(15, get("a"));
}

#[test]
fn a_stale_read_is_caught() {
    let mut r = Run::new();
    r.write(1, put("a", "1"));
    r.commit(1);
    r.ack(1);
    r.read(2, get("a"));
    r.serve(2, 0);
    fails_with(r.h.check(), &["real-time order", "write 1", "read 2", "after index 0"]);
}

#[test]
fn a_read_answered_otherwise_than_the_model_is_caught() {
    let mut r = Run::new();
    r.write(1, put("a", "1"));
    r.commit(1);
    r.ack(1);
    r.read(2, get("a"));
    let mut wrong = r.expected(&get("a"), 1).expect("read succeeds");
    wrong.kvs[0].value = b("0");
    r.answer(2, Outcome::Read { result: Ok(wrong), at_index: 1 });
    fails_with(r.h.check(), &["read 2", "after index 1", "the model gives"]);
}

#[test]
fn a_lost_write_is_caught() {
    let mut r = Run::new();
    r.write(1, put("a", "1"));
    let resp = PutResponse { revision: Revision(2), prev_kv: None };
    r.answer(1, Outcome::Write(Ok(CommandResponse::Put(resp))));
    fails_with(r.h.check(), &["acknowledged write 1", "lost"]);
}

#[test]
fn a_write_answered_otherwise_than_the_model_is_caught() {
    let mut r = Run::new();
    r.write(1, put("a", "1"));
    r.commit(1);
    let resp = PutResponse { revision: Revision(3), prev_kv: None };
    r.answer(1, Outcome::Write(Ok(CommandResponse::Put(resp))));
    fails_with(r.h.check(), &["write 1 at index 1", "the model gives"]);
}

#[test]
fn a_write_applied_twice_is_caught() {
    let mut r = Run::new();
    r.write(1, put("a", "1"));
    r.commit(1);
    let again = r.h.applied(1, 2, Some((1, put("a", "1"))), None);
    fails_with(again, &["request 1", "twice", "index 1", "index 2"]);
}

#[test]
fn a_failed_write_in_the_log_is_caught() {
    let mut r = Run::new();
    r.write(1, put("a", "1"));
    r.commit(1);
    r.answer(1, Outcome::Failed);
    fails_with(r.h.check(), &["write 1", "failed", "index 1"]);
}

#[test]
fn writes_in_an_order_against_real_time_are_caught() {
    let mut r = Run::new();
    r.write(1, put("a", "1"));
    // Write 2 lands first in the log, yet its client asks only after write 1 was answered.
    r.sent.insert(2, put("b", "1"));
    r.commit(2);
    r.commit(1);
    r.ack(1);
    r.write(2, put("b", "1"));
    r.ack(2);
    fails_with(r.h.check(), &["real-time order", "write 1", "write 2", "at index 1"]);
}

#[test]
fn a_read_after_a_read_going_back_in_time_is_caught() {
    let mut r = Run::new();
    // Write 1 is never answered, so only the reads order anything.
    r.write(1, put("a", "1"));
    r.commit(1);
    r.read(2, get("a"));
    r.serve(2, 1);
    r.read(3, get("a"));
    r.serve(3, 0);
    fails_with(r.h.check(), &["real-time order", "read 2", "read 3", "after index 0"]);
}

#[test]
fn members_applying_different_entries_at_an_index_are_caught() {
    let mut h = History::default();
    h.applied(1, 1, Some((1, put("a", "1"))), None).expect("first sighting");
    let other = h.applied(2, 1, Some((2, put("a", "2"))), None);
    fails_with(other, &["state-machine safety", "member 2", "index 1", "request 2", "request 1"]);
    let empty = h.applied(3, 1, None, None);
    fails_with(empty, &["state-machine safety", "member 3", "without a command"]);
}

#[test]
fn a_member_executing_otherwise_than_the_model_is_caught() {
    let mut h = History::default();
    let right = Model::default().apply(&put("a", "1"));
    h.applied(1, 1, Some((1, put("a", "1"))), Some(right)).expect("the model's result");
    let resp = PutResponse { revision: Revision(3), prev_kv: None };
    let wrong = h.applied(2, 1, Some((1, put("a", "1"))), Some(Ok(CommandResponse::Put(resp))));
    fails_with(wrong, &["member 2 executed index 1", "the model gives"]);
}

#[test]
fn log_reports_outside_the_rules_are_caught() {
    let mut h = History::default();
    fails_with(h.applied(1, 2, None, None), &["member 1", "index 2", "gap"]);
    h.applied(1, 1, Some((7, put("a", "1"))), None).expect("first sighting");
    fails_with(h.check(), &["index 1", "request 7", "no client sent"]);
    h.invoke(7, OpKind::Write(put("a", "2")), 1);
    fails_with(h.check(), &["index 1", "request 7", "client sent"]);
    h.invoke(7, OpKind::Write(put("a", "1")), 2);
    fails_with(h.check(), &["misrecorded", "operation 7 invoked twice"]);
}

/// One recorded event, so a generated execution can be replayed with one answer changed.
#[derive(Clone, Debug)]
enum Event {
    Invoke(OpId, OpKind),
    Complete(OpId, Outcome),
    Applied {
        member: u64,
        index: u64,
        entry: Option<(OpId, Command)>,
        outcome: Option<WriteResult>,
    },
}

/// Feeds events to a history, one time unit each, and judges it.
fn feed(events: &[Event]) -> Result<HistoryStats, Violation> {
    let mut h = History::default();
    for (at, e) in (1..).zip(events.iter().cloned()) {
        match e {
            Event::Invoke(op, kind) => h.invoke(op, kind, at),
            Event::Complete(op, outcome) => h.complete(op, outcome, at),
            Event::Applied { member, index, entry, outcome } => {
                h.applied(member, index, entry, outcome)?
            }
        }
    }
    h.check()
}

#[derive(Clone, Debug)]
enum InFlight {
    /// A write, and its index once it is committed.
    Write { op: OpId, cmd: Command, index: Option<u64> },
    /// A read, and the log's length when it was invoked.
    Read { op: OpId, req: RangeRequest, since: u64 },
}

/// Builds random executions that are linearizable by construction: writes enter the log after
/// they are invoked and are answered after they are in it; a read is answered as of an index
/// between the log's length when it was invoked and its length when it is answered.
struct Gen {
    rng: Rng,
    model: Model,
    /// The model's (current, compacted) after each index; `[0]` is the empty log.
    states: Vec<(Revision, Revision)>,
    log: Vec<Entry>,
    events: Vec<Event>,
    next_op: OpId,
    clients: Vec<Option<InFlight>>,
    /// Writes whose clients gave up before they were committed; they may be committed later.
    orphans: Vec<(OpId, Command)>,
    /// How far members 2 and 3 have applied; member 1 applies each entry at once.
    lagging: [u64; 2],
    /// Serve some reads at any index, not only those after their invocation: no longer
    /// linearizable by construction, for comparing the real-time check with its definition.
    stale_reads: bool,
}

impl Gen {
    fn new(seed: u64, clients: usize) -> Gen {
        Gen {
            rng: Rng::new(seed),
            model: Model::default(),
            states: vec![(Revision::INITIAL, Revision::NEVER_COMPACTED)],
            log: Vec::new(),
            events: Vec::new(),
            next_op: 1,
            clients: vec![None; clients],
            orphans: Vec::new(),
            lagging: [0, 0],
            stale_reads: false,
        }
    }

    fn len(&self) -> u64 {
        self.log.len() as u64
    }

    /// The sequential execution of `ops` steps of one client.
    fn sequential(seed: u64, ops: usize) -> Vec<Event> {
        let mut g = Gen::new(seed, 1);
        for _ in 0..ops {
            g.step_client(0);
            if g.rng.chance(0.4) {
                g.catch_up_any();
            }
        }
        g.finish()
    }

    /// A concurrent execution of `g`'s clients.
    fn concurrent(mut g: Gen, steps: usize) -> Vec<Event> {
        let clients = g.clients.len();
        for _ in 0..steps {
            match g.rng.between(0, 9) {
                0..=5 => {
                    let c = g.rng.between(0, clients as u64 - 1) as usize;
                    g.step_client(c);
                }
                6 => _ = g.append(None),
                7 if !g.orphans.is_empty() => {
                    let k = g.rng.between(0, g.orphans.len() as u64 - 1) as usize;
                    let orphan = g.orphans.swap_remove(k);
                    g.append(Some(orphan));
                }
                _ => g.catch_up_any(),
            }
        }
        g.finish()
    }

    /// Lagging members catch up; operations still in flight are never answered.
    fn finish(mut self) -> Vec<Event> {
        for m in 0..2 {
            while self.lagging[m] < self.len() {
                self.catch_up(m);
            }
        }
        self.events
    }

    fn append(&mut self, entry: Option<(OpId, Command)>) -> u64 {
        let index = self.len() + 1;
        let outcome = entry.as_ref().map(|(_, cmd)| self.model.apply_at(index, cmd));
        self.states.push((self.model.current(), self.model.compacted()));
        self.log.push((entry.clone(), outcome.clone()));
        self.events.push(Event::Applied { member: 1, index, entry, outcome });
        index
    }

    fn catch_up_any(&mut self) {
        let m = self.rng.between(0, 1) as usize;
        self.catch_up(m);
    }

    /// Member `m + 2` applies its next entry, sometimes after installing a snapshot (member 3),
    /// sometimes skipping execution because its store already held the entry.
    fn catch_up(&mut self, m: usize) {
        if m == 1 && self.rng.chance(0.1) {
            self.lagging[1] = self.rng.between(self.lagging[1], self.len());
        }
        if self.lagging[m] == self.len() {
            return;
        }
        self.lagging[m] += 1;
        let index = self.lagging[m];
        let (entry, outcome) = self.log[index as usize - 1].clone();
        let outcome = outcome.filter(|_| !self.rng.chance(0.2));
        self.events.push(Event::Applied { member: m as u64 + 2, index, entry, outcome });
    }

    fn complete(&mut self, op: OpId, outcome: Outcome) {
        self.events.push(Event::Complete(op, outcome));
    }

    /// Client `c` takes its next step: invoke, commit, answer or give up.
    fn step_client(&mut self, c: usize) {
        match self.clients[c].take() {
            None => self.invoke(c),
            Some(InFlight::Write { op, cmd, index: None }) => match self.rng.between(0, 9) {
                0..=6 => {
                    let index = Some(self.append(Some((op, cmd.clone()))));
                    self.clients[c] = Some(InFlight::Write { op, cmd, index });
                }
                7 | 8 => {
                    self.complete(op, Outcome::Unknown);
                    self.orphans.push((op, cmd));
                }
                _ => self.complete(op, Outcome::Failed),
            },
            Some(InFlight::Write { op, index: Some(i), .. }) => {
                let outcome = match self.log[i as usize - 1].1.clone() {
                    Some(result) if self.rng.chance(0.9) => Outcome::Write(result),
                    _ => Outcome::Unknown,
                };
                self.complete(op, outcome);
            }
            Some(InFlight::Read { op, req, since }) => {
                let outcome = if self.rng.chance(0.9) {
                    let lo = if self.stale_reads && self.rng.chance(0.1) { 0 } else { since };
                    let at_index = self.rng.between(lo, self.len());
                    let (current, compacted) = self.states[at_index as usize];
                    let result = self.model.range_as_of(&req, current, compacted);
                    Outcome::Read { result, at_index }
                } else {
                    Outcome::Unknown
                };
                self.complete(op, outcome);
            }
        }
    }

    fn invoke(&mut self, c: usize) {
        let op = self.next_op;
        self.next_op += 1;
        let current = self.model.current().0;
        if self.rng.chance(0.6) {
            let cmd = random_write(&mut self.rng, current);
            self.events.push(Event::Invoke(op, OpKind::Write(cmd.clone())));
            self.clients[c] = Some(InFlight::Write { op, cmd, index: None });
        } else {
            let req = random_read(&mut self.rng, current);
            self.events.push(Event::Invoke(op, OpKind::Read(req.clone())));
            self.clients[c] = Some(InFlight::Read { op, req, since: self.len() });
        }
    }
}

fn key(rng: &mut Rng) -> Bytes {
    b(["a", "b", "c", "d"][rng.between(0, 3) as usize])
}

/// Puts (some refused at apply time), deletions of a key or a range, transactions and
/// compactions (some below the floor or in the future).
fn random_write(rng: &mut Rng, current: i64) -> Command {
    let key = key(rng);
    match rng.between(0, 9) {
        0..=3 => Command::Put(PutRequest {
            key,
            value: b(&rng.between(0, 99).to_string()),
            prev_kv: rng.chance(0.5),
            ..PutRequest::default()
        }),
        4 => Command::Put(PutRequest { key, ignore_value: true, ..PutRequest::default() }),
        5 | 6 => {
            let range_end = if rng.chance(0.5) { b("d") } else { Bytes::new() };
            Command::DeleteRange(DeleteRangeRequest { key, range_end, prev_kv: rng.chance(0.5) })
        }
        7 | 8 => Command::Txn(random_txn(rng, key)),
        _ => {
            let revision = Revision(rng.between(0, current as u64 + 1) as i64);
            Command::Compact(CompactRequest { revision, physical: rng.chance(0.5) })
        }
    }
}

fn random_txn(rng: &mut Rng, key: Bytes) -> TxnRequest {
    let target = if rng.chance(0.5) {
        CompareTarget::Value(b(&rng.between(0, 99).to_string()))
    } else {
        CompareTarget::Version(rng.between(0, 2) as i64)
    };
    let result = [CompareResult::Equal, CompareResult::Greater, CompareResult::NotEqual]
        [rng.between(0, 2) as usize];
    let compare = vec![Compare { key: key.clone(), range_end: Bytes::new(), target, result }];
    let value = b(&rng.between(0, 99).to_string());
    let mut success = vec![
        RequestOp::Put(PutRequest { key: key.clone(), value, ..PutRequest::default() }),
        RequestOp::Range(RangeRequest { key: b("a"), range_end: b("\0"), ..Default::default() }),
    ];
    if rng.chance(0.3) {
        let del = DeleteRangeRequest { key: b("z"), range_end: Bytes::new(), prev_kv: true };
        let nested = TxnRequest {
            compare: vec![],
            success: vec![RequestOp::DeleteRange(del)],
            failure: vec![],
        };
        success.push(RequestOp::Txn(nested));
    }
    let del = DeleteRangeRequest { key, range_end: Bytes::new(), prev_kv: true };
    let failure = vec![RequestOp::DeleteRange(del), RequestOp::Range(get("b"))];
    TxnRequest { compare, success, failure }
}

/// Reads of a key or a range, at the current revision or an older one, with limits, sorting,
/// `keys_only` and `count_only`.
fn random_read(rng: &mut Rng, current: i64) -> RangeRequest {
    let mut req = get("a");
    req.key = key(rng);
    if rng.chance(0.4) {
        req.range_end = b("\0");
        req.limit = rng.between(0, 2) as i64;
    }
    if rng.chance(0.3) {
        req.revision = Revision(rng.between(1, current as u64) as i64);
    }
    if rng.chance(0.2) {
        req.sort_order = SortOrder::Descend;
        req.sort_target = SortTarget::Mod;
    }
    req.keys_only = rng.chance(0.1);
    req.count_only = rng.chance(0.1);
    req
}

/// Changes one answer, or one member's execution, so that it differs from the model's; returns
/// the words the violation must name.
fn mutate(events: &mut [Event], rng: &mut Rng) -> String {
    let candidates: Vec<usize> = (0..events.len())
        .filter(|&i| match &events[i] {
            Event::Complete(_, o) => matches!(o, Outcome::Write(_) | Outcome::Read { .. }),
            Event::Applied { outcome, .. } => outcome.is_some(),
            Event::Invoke(..) => false,
        })
        .collect();
    let &i = rng.pick(&candidates).expect("something to change");
    match &mut events[i] {
        Event::Complete(op, Outcome::Write(result)) => {
            *result = changed_write(result);
            format!("write {op} ")
        }
        Event::Complete(op, Outcome::Read { result, .. }) => {
            *result = match result {
                Ok(resp) => Ok(RangeResponse { count: resp.count + 1, ..resp.clone() }),
                Err(_) => Ok(RangeResponse::default()),
            };
            format!("read {op} ")
        }
        Event::Applied { member, index, outcome: Some(result), .. } => {
            *result = changed_write(result);
            format!("member {member} executed index {index} ")
        }
        other => unreachable!("not a candidate: {other:?}"),
    }
}

fn changed_write(result: &WriteResult) -> WriteResult {
    let bump = |r: Revision| Revision(r.0 + 1);
    match result.clone() {
        Ok(CommandResponse::Put(p)) => {
            Ok(CommandResponse::Put(PutResponse { revision: bump(p.revision), ..p }))
        }
        Ok(CommandResponse::DeleteRange(d)) => {
            Ok(CommandResponse::DeleteRange(DeleteRangeResponse { deleted: d.deleted + 1, ..d }))
        }
        Ok(CommandResponse::Txn(t)) => {
            Ok(CommandResponse::Txn(TxnResponse { succeeded: !t.succeeded, ..t }))
        }
        Ok(CommandResponse::Compact(c)) => {
            Ok(CommandResponse::Compact(CompactResponse { revision: bump(c.revision) }))
        }
        Ok(CommandResponse::LeaseRevoke { revision }) => {
            Ok(CommandResponse::LeaseRevoke { revision: bump(revision) })
        }
        Ok(CommandResponse::LeaseGrant { revision, lease }) => {
            Ok(CommandResponse::LeaseGrant { revision: bump(revision), lease })
        }
        Ok(
            CommandResponse::PublishMember
            | CommandResponse::Membership
            | CommandResponse::LeaseCheckpoint
            | CommandResponse::Alarm(_),
        ) => Err(KvError::Compacted),
        Ok(CommandResponse::Auth { revision, auth_revision }) => {
            Ok(CommandResponse::Auth { revision, auth_revision: auth_revision + 1 })
        }
        Err(KvError::Compacted) => Err(KvError::FutureRev),
        Err(_) => Err(KvError::Compacted),
    }
}

/// Each execution passes; with one answer changed, it fails naming that answer.
fn passes_until_changed(seed: u64, events: Vec<Event>, total: &mut HistoryStats) {
    let stats = feed(&events).unwrap_or_else(|v| panic!("seed {seed}: {}", v.0));
    total.add(&stats);
    let mut changed = events;
    let what = mutate(&mut changed, &mut Rng::new(seed ^ 0x5eed));
    match feed(&changed) {
        Ok(_) => panic!("seed {seed}: changing the answer of {what}went unnoticed"),
        Err(Violation(msg)) => assert!(msg.contains(&what), "seed {seed}: {msg:?} lacks {what:?}"),
    }
}

#[test]
fn random_sequential_histories_pass_until_an_answer_changes() {
    let mut total = HistoryStats::default();
    for seed in 0..40 {
        passes_until_changed(seed, Gen::sequential(seed, 80), &mut total);
    }
    assert!(total.writes_acked > 300 && total.reads_checked > 300, "{total:?}");
    assert!(total.executions_checked > total.log_entries, "{total:?}");
}

#[test]
fn random_concurrent_histories_pass_until_an_answer_changes() {
    let mut total = HistoryStats::default();
    for seed in 0..40 {
        passes_until_changed(seed, Gen::concurrent(Gen::new(seed, 4), 300), &mut total);
    }
    assert!(total.writes_acked > 500 && total.reads_checked > 300, "{total:?}");
    assert!(total.unknown_applied > 10 && total.writes_failed > 10, "{total:?}");
    assert!(total.reads_unanswered > 0, "{total:?}");
}

/// With reads served at any index, the check fails exactly when some pair of operations is
/// out of real-time order by the pairwise definition.
#[test]
fn the_real_time_check_agrees_with_every_pair() {
    let (mut caught, mut passed) = (0, 0);
    for seed in 0..200 {
        let g = Gen { stale_reads: true, ..Gen::new(seed, 3) };
        let events = Gen::concurrent(g, 60);
        match (feed(&events), out_of_order_pair(&events)) {
            (Ok(_), None) => passed += 1,
            (Err(Violation(msg)), Some(_)) if msg.contains("real-time order") => caught += 1,
            (verdict, pair) => panic!("seed {seed}: the check says {verdict:?}, pairs {pair:?}"),
        }
    }
    assert!(caught > 20 && passed > 20, "{caught} caught, {passed} passed");
}

/// Some (A, B) with A answered before B was invoked but placed after it, found by trying every
/// pair: the definition the checker's sort-and-search must agree with.
fn out_of_order_pair(events: &[Event]) -> Option<(OpId, OpId)> {
    let (mut invoked, mut answered, mut point) =
        (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for (at, e) in (1u64..).zip(events) {
        match e {
            Event::Invoke(op, _) => _ = invoked.insert(*op, at),
            Event::Complete(op, Outcome::Write(_)) => _ = answered.insert(*op, at),
            Event::Complete(op, Outcome::Read { at_index, .. }) => {
                answered.insert(*op, at);
                point.insert(*op, 2 * at_index + 1);
            }
            Event::Applied { member: 1, index, entry: Some((op, _)), .. } => {
                point.insert(*op, 2 * index);
            }
            _ => {}
        }
    }
    for (&a, &finished) in &answered {
        for (&b, &began) in &invoked {
            let (Some(&pa), Some(&pb)) = (point.get(&a), point.get(&b)) else { continue };
            if finished < began && !(pa < pb || (pa == pb && pb % 2 == 1)) {
                return Some((a, b));
            }
        }
    }
    None
}
