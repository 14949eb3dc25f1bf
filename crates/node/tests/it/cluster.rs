//! Three engines in one process, connected over loopback TCP by the real peer transport: a
//! cluster forms, serves writes and linearizable reads on every member, survives losing its
//! leader, and brings a member that missed compacted history back with a snapshot; members are
//! added, promoted and removed through the membership API.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_kv::*;
use cairn_node::cluster::{ClusterConfig, ClusterState, JoinError, MemberSpec};
use cairn_node::metrics::EngineMetrics;
use cairn_node::{Engine, EngineConfig, EngineError, MembershipError, OpenError};

struct Member {
    name: String,
    cfg: EngineConfig,
    engine: Option<Engine>,
}

/// Stops the engine and removes its directory when the test ends, passed or failed.
impl Drop for Member {
    fn drop(&mut self) {
        stop(self);
        let _ = std::fs::remove_dir_all(&self.cfg.data_dir);
        // The last member out removes the cluster's directory (it fails while others remain).
        if let Some(parent) = self.cfg.data_dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// Every log line the engines of this process wrote (each test's members have ids of their
/// own, so a test picks out its lines by id).
fn logs() -> String {
    static LOGS: std::sync::OnceLock<std::sync::Arc<std::sync::Mutex<Vec<u8>>>> =
        std::sync::OnceLock::new();
    let buf = LOGS.get_or_init(|| {
        let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || LogSink(sink.clone()))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        buf
    });
    String::from_utf8_lossy(&buf.lock().expect("the log buffer")).into_owned()
}

struct LogSink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("the log buffer").extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cairn-cluster-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Free loopback ports, found by binding port 0 (the listeners close before the engines bind).
fn free_ports(n: usize) -> Vec<u16> {
    let ls: Vec<_> =
        (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind")).collect();
    ls.iter().map(|l| l.local_addr().expect("addr").port()).collect()
}

fn configs(tag: &str, n: usize, snapshot_entries: u64) -> Vec<Member> {
    let dir = temp_dir(tag);
    let ports = free_ports(n);
    let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let initial: Vec<String> = urls.iter().enumerate().map(|(i, u)| format!("m{i}={u}")).collect();
    let initial = initial.join(",");
    (0..n)
        .map(|i| {
            let name = format!("m{i}");
            let mut cfg = EngineConfig::new(&name, dir.join(&name));
            cfg.tick_interval = Duration::from_millis(20);
            cfg.request_timeout = Duration::from_secs(5);
            cfg.snapshot_entries = snapshot_entries;
            // Little kept behind compactions or for a follower catching up, so that a member
            // stopped for a few hundred writes needs a snapshot.
            cfg.snapshot_catchup_entries = snapshot_entries / 4;
            cfg.snapshot_catchup_max = 2 * snapshot_entries;
            let url = std::slice::from_ref(&urls[i]);
            let c = ClusterConfig::from_flags(&name, &initial, tag, url, url, ClusterState::New);
            cfg.cluster = Some(c.expect("flags"));
            Member { name, cfg, engine: None }
        })
        .collect()
}

fn start(m: &mut Member) {
    m.engine = Some(Engine::open(m.cfg.clone()).expect("open"));
}

fn stop(m: &mut Member) {
    if let Some(e) = m.engine.take() {
        e.stop();
    }
}

/// The index of the member every running member agrees leads, waiting up to 10 s.
fn leader(ms: &[Member]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let running: Vec<(usize, &Engine)> =
            ms.iter().enumerate().filter_map(|(i, m)| m.engine.as_ref().map(|e| (i, e))).collect();
        let leaders: Vec<Option<u64>> = running.iter().map(|(_, e)| e.leader()).collect();
        if let Some(Some(l)) = leaders.first() {
            if leaders.iter().all(|x| *x == Some(*l)) {
                if let Some((i, _)) = running.iter().find(|(_, e)| e.identity().1 == *l) {
                    return *i;
                }
            }
        }
        assert!(Instant::now() < deadline, "no agreed leader: {leaders:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn eng(m: &Member) -> &Engine {
    m.engine.as_ref().expect("running")
}

async fn put(e: &Engine, k: &str, v: &str) -> Result<PutResponse, EngineError> {
    let req = PutRequest {
        key: Bytes::from(k.to_string()),
        value: Bytes::from(v.to_string()),
        ..Default::default()
    };
    e.put(req).await
}

async fn get(e: &Engine, k: &str) -> Option<Bytes> {
    e.get(k.to_string()).await.expect("linearizable read").map(|kv| kv.value)
}

/// Retries a write while the cluster elects (a member may not know the leader yet).
async fn put_retrying(e: &Engine, k: &str, v: &str) -> PutResponse {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match put(e, k, v).await {
            Ok(r) => return r,
            Err(err) if Instant::now() < deadline => {
                let _ = err;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(err) => panic!("write {k} failed: {err:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_serve_every_request_on_every_member() {
    let mut ms = configs("serve", 3, 10_000);
    ms.iter_mut().for_each(start);
    let ids: Vec<(u64, u64)> = ms.iter().map(|m| eng(m).identity()).collect();
    assert!(ids.iter().all(|(c, _)| *c == ids[0].0), "one cluster id: {ids:?}");
    leader(&ms);
    // A write on each member, read back linearizably on every member.
    for (i, m) in ms.iter().enumerate() {
        put_retrying(eng(m), &format!("k{i}"), &m.name).await;
    }
    for m in &ms {
        for (i, w) in ms.iter().enumerate() {
            assert_eq!(get(eng(m), &format!("k{i}")).await, Some(Bytes::from(w.name.clone())));
        }
    }
    // The leader talked with both followers, both ways (followers need not talk to each other).
    let l = leader(&ms);
    let traffic = eng(&ms[l]).metrics().peers.totals();
    assert_eq!(traffic.len(), 2, "{traffic:?}");
    assert!(traffic.iter().all(|(_, s, r)| *s > 0 && *r > 0), "{traffic:?}");
    // The leader goes away; the other two elect one and keep serving.
    let l = leader(&ms);
    stop(&mut ms[l]);
    let l2 = leader(&ms);
    assert_ne!(l, l2);
    let changes = |m: &Member| EngineMetrics::get(&eng(m).metrics().leader_changes);
    assert!(changes(&ms[l2]) >= 2, "the first leader and the second were seen");
    for m in ms.iter().filter(|m| m.engine.is_some()) {
        put_retrying(eng(m), "after", &m.name).await;
    }
    // The old leader comes back as a follower and catches up.
    start(&mut ms[l]);
    leader(&ms);
    let seen = get(eng(&ms[l]), "after").await;
    assert!(seen.is_some(), "the returning member reads what was written while it was away");
    let revs: Vec<Revision> = ms.iter().map(|m| eng(m).status().revision).collect();
    let hashes: Vec<u32> = ms.iter().map(|m| eng(m).hash_kv(revs[0]).expect("hash").hash).collect();
    assert!(hashes.iter().all(|h| *h == hashes[0]), "members diverge: {hashes:?} at {revs:?}");
    ms.iter_mut().for_each(stop);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_behind_compacted_history_catches_up_by_snapshot() {
    logs();
    let mut ms = configs("snap", 3, 20);
    ms.iter_mut().for_each(start);
    let l = leader(&ms);
    let behind = (l + 1) % 3;
    let behind_id = eng(&ms[behind]).identity().1;
    stop(&mut ms[behind]);
    // Silent for more than an election timeout (200 ms), the member counts as away: the
    // leader keeps no entries for it and compacts past it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let writer = (l + 2) % 3;
    for i in 0..200 {
        put_retrying(eng(&ms[writer]), &format!("k{i:03}"), &i.to_string()).await;
    }
    // An alarm raised while the member is away, then enough deletes (which NOSPACE lets
    // through) that the log holding it is compacted: only the image can tell the member.
    let alarm = AlarmMember { member: behind_id, alarm: AlarmType::NoSpace };
    eng(&ms[writer]).alarm_activate(alarm).await.expect("raise NOSPACE");
    for i in 0..100 {
        eng(&ms[writer]).delete(format!("k{i:03}")).await.expect("delete");
    }
    // The leader compacted its log far past what the stopped member holds.
    start(&mut ms[behind]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let target = eng(&ms[writer]).status().revision;
    while eng(&ms[behind]).status().revision < target {
        assert!(Instant::now() < deadline, "the member never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(get(eng(&ms[behind]), "k199").await, Some(Bytes::from("199")));
    assert_eq!(get(eng(&ms[behind]), "k000").await, None);
    assert!(eng(&ms[behind]).raised_alarms().contains(&alarm), "the image carried the alarm");
    let refused = put(eng(&ms[behind]), "more", "x").await;
    assert!(matches!(refused, Err(EngineError::NoSpace)), "{refused:?}");
    let count = |m: &Member, c: fn(&EngineMetrics) -> &std::sync::atomic::AtomicU64| {
        EngineMetrics::get(c(eng(m).metrics()))
    };
    assert!(count(&ms[behind], |m| &m.snapshots_installed) >= 1);
    assert!(count(&ms[l], |m| &m.log_compactions) >= 1);
    // The leader hears how the send ended after the member installed it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(&ms[l], |m| &m.snapshots_sent) == 0 {
        assert!(Instant::now() < deadline, "the leader never counted the snapshot sent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let h: Vec<u32> = ms.iter().map(|m| eng(m).hash_kv(target).expect("hash").hash).collect();
    assert!(h.iter().all(|x| *x == h[0]), "members diverge: {h:?}");
    // One line for each snapshot sent, and for each installed (a single sent line: a snapshot
    // may be sent again only if the first send failed).
    let logs = logs();
    let sent = format!("sent a snapshot to member {behind_id:016x}");
    let sends = count(&ms[l], |m| &m.snapshots_sent);
    assert_eq!(logs.matches(&sent).count() as u64, sends, "{logs}");
    ms.iter_mut().for_each(stop);
}

#[test]
fn a_data_directory_keeps_its_member_and_cluster() {
    let ms = configs("identity", 3, 10_000);
    // m0's directory, opened with m1's flags, is refused.
    let e = Engine::open(ms[0].cfg.clone()).expect("open");
    e.stop();
    drop(e);
    let mut wrong = ms[1].cfg.clone();
    wrong.data_dir = ms[0].cfg.data_dir.clone();
    let err = Engine::open(wrong).expect_err("another member's directory");
    assert!(matches!(err, EngineError::Open(OpenError::OtherMember { .. })), "{err}");
    // The same member of another cluster (another token) is another member: refused too.
    let other = configs("identity-other", 3, 10_000);
    let mut foreign = other[0].cfg.clone();
    foreign.data_dir = ms[0].cfg.data_dir.clone();
    let err = Engine::open(foreign).expect_err("another cluster's directory");
    assert!(matches!(err, EngineError::Open(OpenError::OtherMember { .. })), "{err}");
    // The same member (same URL and token) in a cluster of other members is refused.
    let url = ms[0].cfg.cluster.as_ref().expect("cluster").members[0].peer_urls.clone();
    let solo = format!("m0={}", url[0]);
    let c = ClusterConfig::from_flags("m0", &solo, "identity", &url, &url, ClusterState::New);
    let mut regrouped = ms[0].cfg.clone();
    regrouped.cluster = Some(c.expect("flags"));
    let err = Engine::open(regrouped).expect_err("another cluster");
    assert!(matches!(err, EngineError::Open(OpenError::OtherCluster { .. })), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_moves_on_request_and_before_a_graceful_stop() {
    let mut ms = configs("move", 3, 10_000);
    ms.iter_mut().for_each(start);
    let l = leader(&ms);
    let (f1, f2) = ((l + 1) % 3, (l + 2) % 3);
    let target = eng(&ms[f1]).identity().1;
    // Only the leader moves leadership, and only to a voter.
    let err = eng(&ms[f2]).move_leader(target).await.expect_err("a follower cannot");
    assert_eq!(err, EngineError::NotLeader);
    let err = eng(&ms[l]).move_leader(0x1234).await.expect_err("not a member");
    assert_eq!(err, EngineError::BadLeaderTransferee);
    eng(&ms[l]).move_leader(target).await.expect("moved");
    assert_eq!(eng(&ms[l]).leader(), Some(target));
    assert_eq!(leader(&ms), f1);
    // The new leader hands over before it stops; a follower has nothing to hand over.
    eng(&ms[f2]).hand_over_leadership().await.expect("nothing to do");
    eng(&ms[f1]).hand_over_leadership().await.expect("handed over");
    let now = eng(&ms[f1]).leader();
    assert!(now.is_some() && now != Some(target), "another member leads: {now:?}");
    stop(&mut ms[f1]);
    put_retrying(eng(&ms[l]), "after", "handover").await;
    ms.iter_mut().for_each(stop);
}

/// Every member's attributes as `ms` configures them, by member id: what it publishes, and the
/// peer URLs the founding entry recorded.
fn configured(ms: &[Member]) -> std::collections::BTreeMap<u64, MemberAttributes> {
    ms.iter()
        .map(|m| {
            let id = m.engine.as_ref().expect("running").identity().1;
            let c = m.cfg.cluster.as_ref().expect("a cluster");
            let peers = c.members.iter().find(|s| s.id == id).expect("listed").peer_urls.clone();
            let attributes = MemberAttributes {
                name: m.name.clone(),
                client_urls: m.cfg.advertise_client_urls.clone(),
                peer_urls: peers,
                removed: false,
            };
            (id, attributes)
        })
        .collect()
}

/// Waits up to 10 s until every member shows every member's configured attributes.
async fn all_published(ms: &[Member]) {
    let want = configured(ms);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let shown: Vec<_> = ms.iter().map(|m| eng(m).members()).collect();
        if shown.iter().all(|s| *s == want) {
            return;
        }
        assert!(Instant::now() < deadline, "attributes never spread: {shown:#?}, want {want:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_publish_their_client_urls_and_a_restart_republishes_only_a_change() {
    let mut ms = configs("publish", 3, 10_000);
    for (i, m) in ms.iter_mut().enumerate() {
        m.cfg.advertise_client_urls = vec![format!("http://10.0.0.{i}:2379")];
    }
    ms.iter_mut().for_each(start);
    leader(&ms);
    all_published(&ms).await;
    let revision = eng(&ms[0]).status().revision;
    assert_eq!(revision, Revision(1), "publishing took no revision");
    // A follower restarts with the same URLs: once it has caught up, it proposes nothing.
    let l = leader(&ms);
    let f = (l + 1) % 3;
    // The committer makes the store durable within 25 ms; give it a margin.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let last = eng(&ms[l]).status().raft_index;
    stop(&mut ms[f]);
    start(&mut ms[f]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while eng(&ms[f]).status().raft_applied_index < last || eng(&ms[f]).leader().is_none() {
        assert!(Instant::now() < deadline, "the restarted member never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Well past its first backoff (an election timeout, 200 ms here).
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(leader(&ms), l, "leadership stayed, so no new leader's entry either");
    assert_eq!(eng(&ms[l]).status().raft_index, last, "the restart proposed nothing");
    all_published(&ms).await;
    // Restarted with new URLs, it publishes them, and every member shows them.
    stop(&mut ms[f]);
    ms[f].cfg.advertise_client_urls = vec!["http://10.0.1.1:2379".into(), "http://h:2379".into()];
    start(&mut ms[f]);
    all_published(&ms).await;
    assert!(eng(&ms[l]).status().raft_index > last);
    assert_eq!(eng(&ms[l]).status().revision, revision);
    ms.iter_mut().for_each(stop);
}

/// Leases across members: granted through a follower, kept alive only by the leader's clock
/// (a follower answers NotLeader; the server forwards), and expired by the next leader when
/// the one that kept it is gone, with the keys deleted on every member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_expires_the_leases_the_old_one_kept() {
    let mut ms = configs("lease", 3, 10_000);
    ms.iter_mut().for_each(start);
    let l = leader(&ms);
    let f = (l + 1) % 3;
    let min = eng(&ms[f]).min_lease_ttl();
    let (lease, _) = eng(&ms[f]).lease_grant(LeaseId(0), min).await.expect("grant via follower");
    let req = PutRequest {
        key: Bytes::from("held"),
        value: Bytes::from("v"),
        lease: lease.id,
        ..Default::default()
    };
    eng(&ms[f]).put(req).await.expect("put with the lease");
    assert_eq!(eng(&ms[f]).lease_keep_alive(lease.id).await, Err(EngineError::NotLeader));
    assert_eq!(eng(&ms[f]).lease_round(), Err(EngineError::NotLeader), "a follower forwards");
    assert_eq!(eng(&ms[l]).lease_keep_alive(lease.id).await, Ok(min));
    // The leader's callers renew on its clock once a heartbeat round confirmed it leads.
    let round = eng(&ms[l]).lease_round().expect("the leader takes a ticket");
    let confirmed = std::future::poll_fn(|cx| eng(&ms[l]).poll_lease_round(round, cx)).await;
    let renewed = eng(&ms[l]).lease_keep_alive_now(lease.id, confirmed.expect("a quorum"));
    assert_eq!(renewed, Some(Ok(min)));
    stop(&mut ms[l]);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let gone = ms.iter().filter_map(|m| m.engine.as_ref()).all(|e| e.leases().is_empty());
        if gone {
            break;
        }
        assert!(Instant::now() < deadline, "the new leader never expired the lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for m in ms.iter().filter(|m| m.engine.is_some()) {
        let read =
            RangeRequest { key: Bytes::from("held"), serializable: true, ..Default::default() };
        assert!(eng(m).range(read).await.expect("read").kvs.is_empty(), "{}", m.name);
    }
    ms.iter_mut().for_each(stop);
}

/// The membership error `r` failed with.
fn refusal<T: std::fmt::Debug>(r: Result<T, EngineError>) -> MembershipError {
    match r {
        Err(EngineError::Membership(m)) => m,
        other => panic!("expected a membership refusal, got {other:?}"),
    }
}

/// A member added to `ms`' cluster at a fresh peer URL, configured to join it.
fn joiner(ms: &[Member], tag: &str, id: u64, url: &str) -> Member {
    let c = ms[0].cfg.cluster.clone().expect("a cluster");
    let name = format!("m{}", ms.len());
    let mut cfg = ms[0].cfg.clone();
    cfg.name.clone_from(&name);
    cfg.data_dir = temp_dir(tag).join(&name);
    let me = MemberSpec { name: name.clone(), id, peer_urls: vec![url.to_string()] };
    let mut members = c.members.clone();
    members.push(me);
    let listen = vec![url.to_string()];
    let state = ClusterState::Existing;
    let cluster = ClusterConfig { local_id: id, members, state, listen_peer_urls: listen, ..c };
    cfg.cluster = Some(cluster);
    Member { name, cfg, engine: None }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_joins_catches_up_by_snapshot_is_promoted_and_removed() {
    logs();
    let mut ms = configs("grow", 1, 20);
    start(&mut ms[0]);
    leader(&ms);
    for i in 0..60 {
        put_retrying(eng(&ms[0]), &format!("k{i:02}"), &i.to_string()).await;
    }
    let e0 = eng(&ms[0]);
    let own = e0.member_list()[0].peer_urls.clone();
    assert_eq!(refusal(e0.member_add(own, true).await), MembershipError::PeerUrlExists);
    assert_eq!(refusal(e0.member_promote(42).await), MembershipError::IdNotFound);
    assert_eq!(refusal(e0.member_remove(e0.identity().1).await), MembershipError::NotEnoughStarted);
    assert_eq!(
        refusal(e0.member_add(vec!["10.0.0.1:1".into()], true).await),
        MembershipError::BadUrls
    );
    let url = format!("http://127.0.0.1:{}", free_ports(1)[0]);
    let added = e0.member_add(vec![url.clone()], true).await.expect("add a learner");
    let other = vec!["http://127.0.0.1:1".to_string()];
    assert_eq!(refusal(e0.member_add(other, true).await), MembershipError::TooManyLearners);
    assert_eq!(refusal(e0.member_promote(added.id).await), MembershipError::LearnerNotReady);
    let listed = e0.member_list();
    assert_eq!(listed.iter().filter(|m| m.is_learner).count(), 1, "{listed:?}");
    let mut new = joiner(&ms, "grow-join", added.id, &url);
    start(&mut new);
    let target = eng(&ms[0]).status().revision;
    let deadline = Instant::now() + Duration::from_secs(10);
    while eng(&new).status().revision < target {
        assert!(Instant::now() < deadline, "the learner never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The store shows what the learner executed a moment before its membership is published.
    while !eng(&new).is_learner() {
        assert!(Instant::now() < deadline, "the new member never knew it was a learner");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // One line per membership change on each member: the leader's, and the learner's when
    // the snapshot told it.
    let learner = format!("{:016x}", added.id);
    let lines = logs();
    let added_lines: Vec<&str> = lines
        .lines()
        .filter(|l| l.contains("membership is now 1 voters and 1 learners") && l.contains(&learner))
        .collect();
    assert_eq!(added_lines.len(), 2, "{lines}");
    let read = eng(&new).range(RangeRequest::key("k00")).await;
    assert_eq!(refusal(read), MembershipError::NotSupportedForLearner);
    assert_eq!(refusal(put(eng(&new), "x", "y").await), MembershipError::NotSupportedForLearner);
    eng(&ms[0]).member_promote(added.id).await.expect("promote the caught-up learner");
    let list = eng(&ms[0]).member_list();
    assert!(list.iter().all(|m| !m.is_learner) && list.len() == 2, "{list:?}");
    // The membership, peer URLs included, reached the new member with the snapshot and log.
    let deadline = Instant::now() + Duration::from_secs(5);
    while eng(&new).member_list().iter().map(|m| &m.peer_urls).ne(list.iter().map(|m| &m.peer_urls))
    {
        assert!(
            Instant::now() < deadline,
            "the new member's list differs: {:?}",
            eng(&new).member_list()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    put_retrying(eng(&new), "via-new", "1").await;
    // The membership is persisted: a restarted member lists the same members, learner flags
    // and peer URLs, from its own store.
    stop(&mut ms[0]);
    start(&mut ms[0]);
    assert_eq!(eng(&ms[0]).member_list(), list, "after a restart");
    put_retrying(eng(&ms[0]), "after-restart", "1").await;
    let rev = eng(&ms[0]).status().revision;
    while eng(&new).status().revision < rev {
        assert!(Instant::now() < deadline + Duration::from_secs(5), "the new member fell behind");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(eng(&new).hash_kv(rev).expect("hash"), eng(&ms[0]).hash_kv(rev).expect("hash"));
    // Removed by whichever leads: if the new member leads, it steps down once its removal
    // applies, and the one left elects itself.
    let by = if eng(&ms[0]).leader() == Some(added.id) { &new } else { &ms[0] };
    eng(by).member_remove(added.id).await.expect("remove the new member");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !eng(&new).is_removed() {
        assert!(Instant::now() < deadline, "the removed member kept serving");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    leader(&ms);
    assert_eq!(refusal(eng(&ms[0]).member_remove(added.id).await), MembershipError::IdRemoved);
    assert!(eng(&new).get("k00").await.is_err(), "a removed member serves nothing");
    assert_eq!(eng(&ms[0]).member_list().len(), 1);
    put_retrying(eng(&ms[0]), "after", "1").await;
}

/// A member configured from etcd's flags alone, as `cairn serve --initial-cluster-state
/// existing` configures it after `member add`: every member of `ms` and itself at `url`.
fn flags_joiner(ms: &[Member], tag: &str, url: &str) -> Member {
    let name = format!("m{}", ms.len());
    let mut initial: Vec<String> = ms
        .iter()
        .flat_map(|m| {
            let c = m.cfg.cluster.as_ref().expect("a cluster");
            let me = c.members.iter().find(|s| s.id == c.local_id).expect("listed");
            me.peer_urls.iter().map(|u| format!("{}={u}", m.name)).collect::<Vec<_>>()
        })
        .collect();
    initial.push(format!("{name}={url}"));
    let mut cfg = ms[0].cfg.clone();
    cfg.name.clone_from(&name);
    cfg.data_dir = temp_dir(tag).join(&name);
    let adv = vec![url.to_string()];
    let c = ClusterConfig::from_flags(
        &name,
        &initial.join(","),
        tag,
        &adv,
        &adv,
        ClusterState::Existing,
    );
    cfg.cluster = Some(c.expect("flags"));
    Member { name, cfg, engine: None }
}

fn open_error(cfg: &EngineConfig) -> OpenError {
    match Engine::open(cfg.clone()) {
        Err(EngineError::Open(e)) => e,
        Ok(_) => panic!("opened"),
        Err(e) => panic!("expected an open error, got {e:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_joins_from_its_flags_alone_and_wrong_flags_or_directories_are_refused() {
    let mut ms = configs("flags-join", 1, 10_000);
    start(&mut ms[0]);
    leader(&ms);
    put_retrying(eng(&ms[0]), "k", "v").await;
    let url = format!("http://127.0.0.1:{}", free_ports(1)[0]);
    let new = flags_joiner(&ms, "flags-join-new", &url);
    // Before `member add`, the running cluster does not list it.
    let e = open_error(&new.cfg);
    assert!(matches!(e, OpenError::Join(JoinError::CountUnequal { .. })), "{e}");
    let added = eng(&ms[0]).member_add(vec![url.clone()], true).await.expect("add");
    let mut new = flags_joiner(&ms, "flags-join-new", &url);
    start(&mut new);
    let (cluster_id, _) = eng(&ms[0]).identity();
    assert_eq!(eng(&new).identity(), (cluster_id, added.id), "the ids the running member gave");
    let rev = eng(&ms[0]).status().revision;
    let deadline = Instant::now() + Duration::from_secs(10);
    while eng(&new).status().revision < rev {
        assert!(Instant::now() < deadline, "the joined member never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A restart keeps its identity with the same flags.
    stop(&mut new);
    start(&mut new);
    assert_eq!(eng(&new).identity(), (cluster_id, added.id));
    stop(&mut new);
    // A directory made for another cluster is refused once a running member names its own.
    let path = new.cfg.data_dir.join("member").join("cluster_id");
    std::fs::write(&path, format!("{:016x}\n", cluster_id ^ 1)).expect("rewrite the cluster id");
    let e = open_error(&new.cfg);
    assert!(matches!(e, OpenError::OtherCluster { expected, .. } if expected == cluster_id), "{e}");
}

/// A member cut off before its removal reached it (stopped here) never applies it: the leader
/// no longer sends it anything. Back up, it calls its peers, which refuse it as removed, and it
/// stops as if it had applied its removal (etcd's `ErrMemberRemoved`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_missed_its_removal_stops_when_a_peer_says_so() {
    let mut ms = configs("missed-removal", 3, 10_000);
    ms.iter_mut().for_each(start);
    let l = leader(&ms);
    let f = (l + 1) % 3;
    put_retrying(eng(&ms[l]), "before", "1").await;
    let id = eng(&ms[f]).identity().1;
    stop(&mut ms[f]);
    eng(&ms[l]).member_remove(id).await.expect("remove the stopped member");
    start(&mut ms[f]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !eng(&ms[f]).is_removed() {
        assert!(Instant::now() < deadline, "the removed member kept running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(eng(&ms[f]).get("before").await.is_err(), "a removed member serves nothing");
    put_retrying(eng(&ms[l]), "after", "1").await;
}

/// With `auto_promote_learners`, a leader makes a learner a voter by itself once it has caught
/// up and stayed so, and never a learner that is not running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caught_up_learner_is_promoted_by_the_leader_itself() {
    let mut ms = configs("auto-promote", 1, 20);
    ms[0].cfg.auto_promote_learners = true;
    start(&mut ms[0]);
    leader(&ms);
    for i in 0..60 {
        put_retrying(eng(&ms[0]), &format!("k{i:02}"), &i.to_string()).await;
    }
    let url = format!("http://127.0.0.1:{}", free_ports(1)[0]);
    let added = eng(&ms[0]).member_add(vec![url.clone()], true).await.expect("add a learner");
    // Not started: the leader hears nothing from it, so it stays a learner (a promotion would
    // also leave the cluster without a quorum). 100 ticks are 20 stability windows.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let learners = |e: &Engine| e.member_list().iter().filter(|m| m.is_learner).count();
    assert_eq!(learners(eng(&ms[0])), 1, "a learner that is down was promoted");
    let mut new = joiner(&ms, "auto-promote-join", added.id, &url);
    start(&mut new);
    let deadline = Instant::now() + Duration::from_secs(15);
    while learners(eng(&ms[0])) > 0 {
        assert!(Instant::now() < deadline, "the caught-up learner was never promoted");
        let _ = put(eng(&ms[0]), "during", "1").await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A voter now: it serves writes, and it was caught up when it became one.
    assert!(eng(&ms[0]).member_list().len() == 2);
    put_retrying(eng(&new), "via-new", "1").await;
    let rev = eng(&ms[0]).status().revision;
    while eng(&new).status().revision < rev {
        assert!(Instant::now() < deadline, "the new voter fell behind");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(eng(&new).hash_kv(rev).expect("hash"), eng(&ms[0]).hash_kv(rev).expect("hash"));
    stop(&mut new);
    stop(&mut ms[0]);
}
