//! The replica driven by hand: one input, then exactly the work it asks for. Members are wired
//! by a lossless in-test network that can cut a member off, over in-memory disks.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use cairn_kv::backend::MemBackend;
use cairn_kv::{
    Command, CommandResponse, KvError, LeaseId, MemberAttributes, PutRequest, PutResponse,
    Revision, Store,
};
use cairn_node::committer::Committer;
use cairn_node::metrics::EngineMetrics;
use cairn_node::{
    prepare, Bootstrap, EngineError, Limits, Replica, ReplicaConfig, Reply, RequestId, RequestIds,
    StorageError,
};
use cairn_raft::{ConfState, Config, LogIndex, Message, MessageBody, NodeId, Role};
use cairn_storage::faulty::FaultyDir;

pub(crate) type R = Replica<FaultyDir, MemBackend, u64>;
pub(crate) type Answer = (u64, Result<Reply, EngineError>);

const LIMITS: Limits = Limits { max_request_bytes: 1 << 20, max_txn_ops: 128 };

pub(crate) struct Member {
    pub(crate) replica: R,
    pub(crate) committer: Committer<MemBackend>,
    pub(crate) disk: FaultyDir,
    ids: RequestIds,
    pub(crate) answers: Vec<Answer>,
    metrics: Arc<EngineMetrics>,
}

pub(crate) fn member(id: u64, voters: &[u64], snapshot_entries: u64) -> Member {
    member_from(id, voters, config(id, snapshot_entries))
}

fn member_with(
    id: u64,
    voters: &[u64],
    snapshot_entries: u64,
    publish: Option<MemberAttributes>,
) -> Member {
    let mut cfg = config(id, snapshot_entries);
    cfg.publish = publish;
    member_from(id, voters, cfg)
}

/// A member's configuration. It keeps no margin behind compactions and no entries for
/// followers catching up (`log_retention.rs` tests those), so the log is compacted every
/// `snapshot_entries` entries right up to what the store made durable, and a member cut off
/// for a few entries needs a snapshot.
pub(crate) fn config(id: u64, snapshot_entries: u64) -> ReplicaConfig {
    let mut raft = Config::new(NodeId(id));
    raft.seed = 7;
    let mut cfg = ReplicaConfig::new(raft);
    cfg.request_timeout_ticks = 60;
    cfg.snapshot_entries = snapshot_entries;
    cfg.snapshot_catchup_entries = 0;
    cfg.snapshot_catchup_max = 0;
    cfg
}

fn member_from(id: u64, voters: &[u64], mut cfg: ReplicaConfig) -> Member {
    let metrics = Arc::new(EngineMetrics::default());
    cfg.metrics = Some(metrics.clone());
    let store = Arc::new(Store::open(MemBackend::default()).unwrap());
    let disk = FaultyDir::default();
    let conf = ConfState::with_voters(voters.iter().map(|v| NodeId(*v)));
    let replica =
        Replica::open(cfg, disk.clone(), store.clone(), Bootstrap::Founding(conf), id << 20)
            .unwrap();
    let committer = Committer::new(store);
    let ids = RequestIds::new(id, id << 20);
    Member { replica, committer, disk, ids, answers: Vec::new(), metrics }
}

pub(crate) fn put(key: &str, value: &str) -> Command {
    let (key, value) = (key.to_string().into(), value.to_string().into());
    Command::Put(PutRequest { key, value, ..PutRequest::default() })
}

impl Member {
    pub(crate) fn propose(&mut self, cmd: &Command, token: u64) -> RequestId {
        let id = self.ids.next_id();
        let data = prepare(id, cmd, LIMITS).unwrap();
        self.replica.handle_propose(id, data, token);
        id
    }
}

/// Members on a lossless network; `cut` members send and receive nothing, `mute` members
/// receive but what they send is lost. Snapshot messages to a member in `park` wait in
/// `parked` until the test delivers them (a transfer and install that take a while); every
/// snapshot message sent to a member is counted in `snapshots`, and every store sync a member
/// asks for in `syncs`.
pub(crate) struct Net {
    pub(crate) members: BTreeMap<u64, Member>,
    pub(crate) cut: BTreeSet<u64>,
    mute: BTreeSet<u64>,
    pub(crate) park: BTreeSet<u64>,
    pub(crate) parked: Vec<Message>,
    pub(crate) snapshots: BTreeMap<u64, usize>,
    pub(crate) syncs: BTreeMap<u64, usize>,
}

impl Net {
    pub(crate) fn new(voters: &[u64], snapshot_entries: u64) -> Net {
        Net::with_configs(voters, |id| config(id, snapshot_entries))
    }

    /// Members configured by `cfg` (from [`config`], changed as a test needs).
    pub(crate) fn with_configs(voters: &[u64], cfg: impl Fn(u64) -> ReplicaConfig) -> Net {
        let members = voters.iter().map(|&id| (id, member_from(id, voters, cfg(id)))).collect();
        Net::of(members)
    }

    fn of(members: BTreeMap<u64, Member>) -> Net {
        let (cut, mute, park) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        let (parked, snapshots, syncs) = (Vec::new(), BTreeMap::new(), BTreeMap::new());
        Net { members, cut, mute, park, parked, snapshots, syncs }
    }

    /// Members that publish their attributes ([`attributes`]).
    fn publishing(voters: &[u64], snapshot_entries: u64) -> Net {
        let member = |id| member_with(id, voters, snapshot_entries, Some(attributes(id)));
        let members = voters.iter().map(|&id| (id, member(id))).collect();
        Net::of(members)
    }

    pub(crate) fn get(&mut self, id: u64) -> &mut Member {
        self.members.get_mut(&id).unwrap()
    }

    /// Processes every member and delivers messages until nothing moves. The committer runs
    /// after every round and syncs when asked, as its thread would.
    pub(crate) fn stabilize(&mut self) {
        for _ in 0..1000 {
            let mut moved = false;
            let mut mail = Vec::new();
            for (id, m) in &mut self.members {
                m.replica.process().unwrap();
                let work = m.replica.work();
                moved |= !work.messages.is_empty();
                if !self.cut.contains(id) && !self.mute.contains(id) {
                    mail.append(&mut work.messages);
                }
                work.messages.clear();
                m.answers.append(&mut work.answers);
                work.commits.drain(..).for_each(|b| m.committer.push(b));
                if work.store_sync.take().is_some() {
                    *self.syncs.entry(*id).or_default() += 1;
                    m.committer.want_sync();
                }
                if let Some(durable) = m.committer.commit().unwrap() {
                    m.replica.handle_store_durable(durable);
                    moved = true;
                }
            }
            for msg in mail {
                let to = msg.to.0;
                if self.cut.contains(&to) {
                    continue;
                }
                if matches!(msg.body, MessageBody::Snapshot { .. }) {
                    *self.snapshots.entry(to).or_default() += 1;
                    if self.park.contains(&to) {
                        self.parked.push(msg);
                        continue;
                    }
                }
                self.get(to).replica.handle_message(msg);
            }
            if !moved {
                return;
            }
        }
        panic!("the members did not settle");
    }

    pub(crate) fn tick_all(&mut self, ticks: usize) {
        for _ in 0..ticks {
            for m in self.members.values_mut() {
                m.replica.handle_tick();
            }
            self.stabilize();
        }
    }

    /// Stops parking snapshots and hands the parked ones to their members (the transfer and
    /// install the test held back are done), without settling the network.
    pub(crate) fn deliver_parked(&mut self) {
        self.park.clear();
        for msg in std::mem::take(&mut self.parked) {
            self.get(msg.to.0).replica.handle_message(msg);
        }
    }

    pub(crate) fn elect(&mut self, id: u64) {
        self.get(id).replica.campaign();
        self.stabilize();
        assert_eq!(self.get(id).replica.raft().role(), Role::Leader);
    }
}

#[test]
fn a_sole_voter_elects_itself_and_answers_a_put_with_exactly_its_work() {
    let mut m = member(1, &[1], 100);
    m.replica.process().unwrap();
    assert!(m.replica.is_sole_voter());
    m.replica.campaign();
    m.replica.process().unwrap();
    assert!(m.replica.is_sole_voter_leader());
    let work = m.replica.work();
    work.commits.clear();
    assert_eq!(work.leadership.take().map(|l| l.leader), Some(Some(NodeId(1))));
    m.propose(&put("a", "1"), 42);
    m.replica.process().unwrap();
    let work = m.replica.work();
    assert!(work.messages.is_empty(), "a sole voter has no one to tell");
    assert_eq!(work.commits.len(), 1, "one executed batch for the committer");
    assert_eq!(work.store_sync, None);
    let resp = CommandResponse::Put(PutResponse { revision: Revision(2), prev_kv: None });
    assert_eq!(work.answers, vec![(42, Ok(Reply::Command(resp)))]);
    // Visible to reads at once, before the committer commits it.
    assert_eq!(m.replica.store().current_revision(), Revision(2));
}

#[test]
fn a_proposal_or_read_without_a_leader_is_refused_at_once() {
    let mut m = member(1, &[1, 2, 3], 100);
    m.replica.process().unwrap();
    m.propose(&put("a", "1"), 1);
    m.replica.handle_read(2);
    m.replica.process().unwrap();
    let mut answers: Vec<Answer> = m.replica.work().answers.drain(..).collect();
    answers.sort_by_key(|a| a.0);
    assert_eq!(answers, vec![(1, Err(EngineError::NoLeader)), (2, Err(EngineError::NoLeader))]);
    // The write failed to commit; a read is no proposal.
    assert_eq!(EngineMetrics::get(&m.metrics.proposals_failed), 1);
}

#[test]
fn a_cut_off_leader_answers_reads_leader_changed_and_writes_with_a_timeout() {
    let mut net = Net::new(&[1, 2, 3], 100);
    net.stabilize();
    net.elect(1);
    net.cut.insert(1);
    net.get(1).propose(&put("a", "1"), 10);
    net.get(1).replica.handle_read(11);
    net.stabilize();
    assert!(net.get(1).answers.is_empty(), "nothing is known yet");
    // Check-quorum deposes it after an election timeout: the read asked of its leadership is
    // answered; the write may still commit under a new leader, so it waits for its deadline.
    net.tick_all(25);
    assert_eq!(net.get(1).replica.raft().role(), Role::Follower);
    assert_eq!(net.get(1).answers, vec![(11, Err(EngineError::LeaderChanged))]);
    net.tick_all(40);
    let timeout = net.get(1).answers.pop().unwrap();
    assert!(
        matches!(timeout, (10, Err(EngineError::Timeout | EngineError::TimeoutDueToLeaderFail))),
        "{timeout:?}"
    );
    assert_eq!(EngineMetrics::get(&net.get(1).metrics.proposals_failed), 1);
    assert_eq!(net.get(1).replica.waiting(), (0, 0, 0), "no caller left waiting");
}

#[test]
fn a_proposal_replaced_by_a_new_leaders_entry_is_answered_leader_changed() {
    let mut net = Net::new(&[1, 2, 3], 100);
    net.stabilize();
    net.elect(1);
    net.cut.insert(1);
    net.get(1).propose(&put("lost", "x"), 10);
    net.stabilize();
    // The others elect a new leader once they stop hearing from 1, and commit their own entry
    // where 1 had appended its proposal, well before the proposal's deadline.
    net.tick_all(25);
    let leader = [2, 3]
        .into_iter()
        .find(|id| net.get(*id).replica.raft().role() == Role::Leader)
        .expect("a new leader");
    net.get(leader).propose(&put("kept", "y"), 20);
    net.stabilize();
    assert!(matches!(net.get(leader).answers[..], [(20, Ok(_))]));
    net.cut.clear();
    net.tick_all(3);
    assert_eq!(net.get(1).answers, vec![(10, Err(EngineError::LeaderChanged))]);
    let store = net.get(1).replica.store().clone();
    let lost = cairn_kv::RangeRequest { key: "lost".into(), ..Default::default() };
    let got = store.range(&lost);
    assert!(got.unwrap().kvs.is_empty(), "the replaced proposal never applied");
}

/// Three members led by member 1, which compacts every `snapshot_entries` entries, after 40
/// puts that member 3 was cut off from (it still is).
pub(crate) fn member_3_cut_off_for_40_puts(snapshot_entries: u64) -> Net {
    let mut net = Net::new(&[1, 2, 3], snapshot_entries);
    net.stabilize();
    net.elect(1);
    net.cut.insert(3);
    for i in 0..40 {
        net.get(1).propose(&put(&format!("k{i:02}"), &format!("v{i}")), i);
        net.stabilize();
    }
    net
}

#[test]
fn a_member_cut_off_past_compaction_catches_up_from_a_snapshot_of_the_store() {
    let mut net = member_3_cut_off_for_40_puts(5);
    assert!(net.get(1).replica.compacted_index() > LogIndex(10), "the leader compacted its log");
    assert!(net.get(3).replica.store().current_revision() < Revision(5));
    net.cut.clear();
    net.tick_all(3);
    let hashes: Vec<_> =
        (1..=3).map(|id| net.get(id).replica.store().hash_kv(Revision(0)).unwrap()).collect();
    assert_eq!(hashes[0].revision, Revision(41));
    assert!(hashes.iter().all(|h| *h == hashes[0]), "{hashes:?}");
    assert!(net.get(3).replica.compacted_index() > LogIndex(10), "member 3 installed a snapshot");
}

#[test]
fn a_storage_failure_stops_the_replica_for_good() {
    let mut m = member(1, &[1], 100);
    m.replica.process().unwrap();
    m.replica.campaign();
    m.replica.process().unwrap();
    m.disk.fail_after(0);
    m.propose(&put("a", "1"), 1);
    let err = m.replica.process().unwrap_err();
    assert!(matches!(err, StorageError::Wal(_)), "{err:?}");
    assert_eq!(m.replica.process().unwrap_err(), err, "stopped for good");
    m.replica.fail_all(&EngineError::Stopped(cairn_node::StopCause::Storage(err)));
    let answers = &m.replica.work().answers;
    assert!(matches!(answers[..], [(1, Err(EngineError::Stopped(_)))]), "{answers:?}");
}

#[test]
fn a_leaders_appends_leave_before_its_fsync_and_a_followers_ack_only_after_its_own() {
    let mut net = Net::new(&[1, 2, 3], 100);
    net.stabilize();
    net.elect(1);
    let leader = net.get(1);
    leader.propose(&put("a", "1"), 10);
    let disk = leader.disk.clone();
    let (mut early, mut ops_when_sent) = (Vec::new(), 0);
    leader
        .replica
        .process_with(&mut |msgs| {
            ops_when_sent = disk.op_count();
            early.append(msgs);
        })
        .unwrap();
    let appends = early
        .iter()
        .filter(|m| matches!(&m.body, MessageBody::Append { entries, .. } if !entries.is_empty()))
        .count();
    assert_eq!(appends, 2, "both followers' appends were handed over early: {early:?}");
    assert!(disk.op_count() > ops_when_sent, "the leader wrote its own copy after sending");
    let follower = net.get(2);
    for m in early.iter().filter(|m| m.to == NodeId(2)) {
        follower.replica.handle_message(m.clone());
    }
    // The ack leaves early too (before the follower applies), but only once its log is durable.
    let (disk, before) = (follower.disk.clone(), follower.disk.op_count());
    let mut acked_unsynced = Vec::new();
    follower
        .replica
        .process_with(&mut |msgs| {
            if msgs.iter().any(|m| matches!(m.body, MessageBody::AppendResp { .. })) {
                acked_unsynced.push((disk.op_count() - before, disk.unsynced_ops()));
            }
            msgs.clear();
        })
        .unwrap();
    match acked_unsynced[..] {
        [(written, 0)] if written > 0 => {}
        _ => panic!("an ack promises durability: (ops written, unsynced) {acked_unsynced:?}"),
    }
}

fn attributes(id: u64) -> MemberAttributes {
    MemberAttributes {
        name: format!("m{id}"),
        client_urls: vec![format!("http://m{id}:2379")],
        ..Default::default()
    }
}

/// The members whose attributes the entries in `r`'s log (since its last compaction) publish.
fn publishes_in_log(r: &R) -> Vec<u64> {
    let entries = r.raft().log_entries().iter();
    let data = entries.filter_map(|e| match &e.payload {
        cairn_raft::EntryPayload::Normal(d) if !d.is_empty() => Some(d.clone()),
        _ => None,
    });
    let decoded = data.map(|d| cairn_node::command::decode(&d).unwrap().1);
    decoded
        .filter_map(|c| match c {
            Command::PublishMember { member, .. } => Some(member),
            _ => None,
        })
        .collect()
}

/// Whose attributes member `id`'s store shows.
fn shown(net: &mut Net, id: u64) -> BTreeMap<u64, MemberAttributes> {
    net.get(id).replica.store().members()
}

fn all_attributes(ids: &[u64]) -> BTreeMap<u64, MemberAttributes> {
    ids.iter().map(|&id| (id, attributes(id))).collect()
}

#[test]
fn members_publish_once_they_know_a_leader_and_never_again_once_applied() {
    let mut net = Net::publishing(&[1, 2, 3], 100);
    net.tick_all(3);
    assert!(publishes_in_log(&net.get(1).replica).is_empty(), "no leader, nothing proposed");
    let revision = net.get(1).replica.store().current_revision();
    net.elect(1);
    for id in [1, 2, 3] {
        assert_eq!(shown(&mut net, id), all_attributes(&[1, 2, 3]), "member {id}");
    }
    let mut published = publishes_in_log(&net.get(1).replica);
    published.sort();
    assert_eq!(published, vec![1, 2, 3], "one publish each");
    // Well past every backoff: nothing is proposed again, and the key space never moved.
    net.tick_all(200);
    assert_eq!(publishes_in_log(&net.get(1).replica).len(), 3);
    assert_eq!(net.get(1).replica.store().current_revision(), revision);
    assert_eq!(net.get(1).replica.store().hash_kv(Revision(0)).unwrap().revision, revision);
}

#[test]
fn a_lost_publish_is_proposed_again_after_a_backoff() {
    let mut net = Net::publishing(&[1, 2, 3], 100);
    net.stabilize();
    net.mute.insert(3);
    net.elect(1);
    assert_eq!(shown(&mut net, 1), all_attributes(&[1, 2]), "member 3's proposal was lost");
    net.mute.clear();
    // The first retry waits an election timeout (10 ticks) after the lost proposal.
    net.tick_all(5);
    assert_eq!(shown(&mut net, 1), all_attributes(&[1, 2]), "too early to try again");
    net.tick_all(10);
    for id in [1, 2, 3] {
        assert_eq!(shown(&mut net, id), all_attributes(&[1, 2, 3]), "member {id}");
    }
    assert_eq!(publishes_in_log(&net.get(1).replica).iter().filter(|m| **m == 3).count(), 1);
}

#[test]
fn a_member_restored_from_a_snapshot_learns_the_attributes_published_while_it_was_away() {
    let mut net = Net::publishing(&[1, 2, 3], 5);
    net.stabilize();
    net.cut.insert(3);
    net.elect(1);
    assert_eq!(shown(&mut net, 2), all_attributes(&[1, 2]));
    let publishes_at = net.get(1).replica.raft().last_index();
    for i in 0..40 {
        net.get(1).propose(&put(&format!("k{i:02}"), &format!("v{i}")), i);
        net.stabilize();
    }
    assert!(net.get(1).replica.compacted_index() > publishes_at, "the publishes are compacted");
    assert!(shown(&mut net, 3).is_empty());
    net.cut.clear();
    net.tick_all(3);
    let installed = net.get(3).replica.compacted_index();
    assert!(installed > publishes_at, "member 3 installed a snapshot past the publishes");
    // It learned 1's and 2's attributes from the image, then published its own.
    for id in [1, 2, 3] {
        assert_eq!(shown(&mut net, id), all_attributes(&[1, 2, 3]), "member {id}");
    }
    let own: Vec<u64> = publishes_in_log(&net.get(3).replica);
    assert_eq!(own, vec![3], "only its own publish is in its log, after the snapshot");
}

/// Grants lease `id` of `ttl` seconds through leader 1 and waits until it is applied.
fn grant(net: &mut Net, id: i64, ttl: i64) {
    net.get(1).propose(&Command::LeaseGrant { id: LeaseId(id), ttl }, 1);
    net.stabilize();
    assert!(net.get(1).replica.store().lease(LeaseId(id)).is_some());
    net.get(1).answers.clear();
}

/// Simulator stack seed 4 found a keepalive renewing a lease whose revoke was already proposed:
/// the client was told its lease runs a full TTL more, and lost it at once. A keepalive of an
/// expired lease waits for the revoke and is answered `LeaseNotFound`, as etcd answers.
#[test]
fn a_keepalive_of_an_expired_lease_waits_for_its_revoke() {
    let mut net = Net::new(&[1, 2, 3], 100);
    net.stabilize();
    net.elect(1);
    grant(&mut net, 7, 1);
    // Only the leader's clock matters for leases; tick it until it proposes the revoke.
    for _ in 0..20 {
        let last = net.get(1).replica.raft().last_index();
        net.get(1).replica.handle_tick();
        net.get(1).replica.process().unwrap();
        if net.get(1).replica.raft().last_index() > last {
            break;
        }
        net.stabilize();
    }
    net.get(1).replica.handle_lease_renew(LeaseId(7), 99);
    net.stabilize();
    assert_eq!(net.get(1).replica.store().lease(LeaseId(7)), None, "revoked");
    let answer = net.get(1).answers.iter().find(|a| a.0 == 99).cloned();
    assert_eq!(answer, Some((99, Err(EngineError::Kv(KvError::LeaseNotFound)))));
}

/// Simulator stack seed 312 found a leader cut off from the others renewing leases from its
/// stale store while a new leader expired them by its own clock. A keepalive is answered only
/// once a heartbeat round confirms the leadership (etcd's `ensureLeadership`).
#[test]
fn a_cut_off_leader_does_not_renew_leases() {
    let mut net = Net::new(&[1, 2, 3], 100);
    net.stabilize();
    net.elect(1);
    grant(&mut net, 8, 10);
    net.get(1).replica.handle_lease_renew(LeaseId(8), 98);
    net.stabilize();
    assert_eq!(net.get(1).answers, vec![(98, Ok(Reply::LeaseRenewed { ttl: 10 }))]);
    net.get(1).answers.clear();
    net.cut.insert(1);
    net.get(1).replica.handle_lease_renew(LeaseId(8), 99);
    net.get(1).replica.handle_lease_ttl(LeaseId(8), 100);
    net.stabilize();
    assert!(net.get(1).answers.is_empty(), "not confirmed: {:?}", net.get(1).answers);
    // Check-quorum deposes it: they are answered as reads asked of a leadership that is gone.
    net.tick_all(25);
    let changed = Err(EngineError::LeaderChanged);
    assert_eq!(net.get(1).answers, vec![(99, changed.clone()), (100, changed)]);
}
