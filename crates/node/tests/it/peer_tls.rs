//! A three-member cluster whose peers speak mutual TLS (`https://` peer URLs, each member with a
//! certificate of one CA, `--peer-client-cert-auth`): it elects a leader and replicates, and a
//! member whose certificate another CA signed never gets in.

#[path = "../../../transport/tests/pki/mod.rs"]
mod pki;

use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_kv::PutRequest;
use cairn_node::cluster::{ClusterConfig, ClusterState};
use cairn_node::{Engine, EngineConfig};

/// Three members on free loopback ports; member `i` presents `certs[i]`'s certificate.
fn members(dir: &std::path::Path, tag: &str, certs: [&pki::Ca; 3]) -> Vec<EngineConfig> {
    let ports: Vec<std::net::TcpListener> =
        (0..3).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind")).collect();
    let urls: Vec<String> = ports
        .iter()
        .map(|l| format!("https://127.0.0.1:{}", l.local_addr().expect("addr").port()))
        .collect();
    drop(ports);
    let initial: Vec<String> = urls.iter().enumerate().map(|(i, u)| format!("m{i}={u}")).collect();
    let initial = initial.join(",");
    (0..3)
        .map(|i| {
            let name = format!("m{i}");
            let mut cfg = EngineConfig::new(&name, dir.join(tag).join(&name));
            cfg.tick_interval = Duration::from_millis(20);
            cfg.request_timeout = Duration::from_secs(5);
            let url = std::slice::from_ref(&urls[i]);
            let mut c =
                ClusterConfig::from_flags(&name, &initial, tag, url, url, ClusterState::New)
                    .expect("flags");
            let mut files = certs[i].files(&name, &name, true);
            // Every member trusts the first CA, whatever signed its own certificate.
            files.trusted_ca_file = Some(certs[0].ca_file());
            c.peer_tls = Some(files);
            cfg.cluster = Some(c);
            cfg
        })
        .collect()
}

/// The leader the given engines agree on, within `wait`.
fn agreed_leader(engines: &[&Engine], wait: Duration) -> Option<u64> {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        let leaders: Vec<Option<u64>> = engines.iter().map(|e| e.leader()).collect();
        if let Some(Some(l)) = leaders.first() {
            if leaders.iter().all(|x| *x == Some(*l)) {
                return Some(*l);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_peer_mutual_tls_replicates_and_refuses_a_stranger() {
    let dir = pki::dir("peer-tls");
    let (ca, other) = (pki::Ca::new(&dir, "peer"), pki::Ca::new(&dir, "other"));
    let cfgs = members(&dir, "all", [&ca, &ca, &ca]);
    let engines: Vec<Engine> =
        cfgs.into_iter().map(|c| Engine::open(c).expect("a member opens")).collect();
    let all: Vec<&Engine> = engines.iter().collect();
    let leader = agreed_leader(&all, Duration::from_secs(10)).expect("a leader over TLS");
    let req = PutRequest { key: Bytes::from("k"), value: Bytes::from("v"), ..Default::default() };
    let l = engines.iter().find(|e| e.identity().1 == leader).expect("the leader");
    l.put(req).await.expect("a replicated put");
    for e in &engines {
        let got = e.get("k".to_string()).await.expect("a linearizable read");
        assert_eq!(got.map(|kv| kv.value), Some(Bytes::from("v")));
    }
    engines.iter().for_each(Engine::stop);
    // Member m2's certificate is the other CA's: m0 and m1 elect each other, but m2 is refused
    // on both sides, so it never learns a leader.
    let cfgs = members(&dir, "stranger", [&ca, &ca, &other]);
    let engines: Vec<Engine> =
        cfgs.into_iter().map(|c| Engine::open(c).expect("a member opens")).collect();
    let pair = [&engines[0], &engines[1]];
    assert!(agreed_leader(&pair, Duration::from_secs(10)).is_some(), "m0 and m1 elect");
    assert_eq!(agreed_leader(&[&engines[2]], Duration::from_millis(500)), None);
    engines.iter().for_each(Engine::stop);
    let _ = std::fs::remove_dir_all(dir);
}

/// A member of a cluster founded alone over peer TLS, then one added at run time with an
/// `https://` peer URL: it joins from its flags (asking for the membership over TLS), and the
/// leader dials it through TLS too, so it catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_added_at_run_time_is_dialed_with_peer_tls() {
    let dir = pki::dir("peer-tls-join");
    let ca = pki::Ca::new(&dir, "peer");
    let ports: Vec<std::net::TcpListener> =
        (0..2).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind")).collect();
    let urls: Vec<String> = ports
        .iter()
        .map(|l| format!("https://127.0.0.1:{}", l.local_addr().expect("addr").port()))
        .collect();
    drop(ports);
    let config = |name: &str, initial: &str, url: &str, state| {
        let mut cfg = EngineConfig::new(name, dir.join(name));
        cfg.tick_interval = Duration::from_millis(20);
        cfg.request_timeout = Duration::from_secs(5);
        let url = vec![url.to_string()];
        let mut c =
            ClusterConfig::from_flags(name, initial, "tls-join", &url, &url, state).expect("flags");
        c.peer_tls = Some(ca.files(name, name, true));
        cfg.cluster = Some(c);
        cfg
    };
    let first = format!("m0={}", urls[0]);
    let m0 = Engine::open(config("m0", &first, &urls[0], ClusterState::New)).expect("m0 opens");
    assert!(agreed_leader(&[&m0], Duration::from_secs(10)).is_some(), "m0 elects itself");
    let req = PutRequest { key: Bytes::from("k"), value: Bytes::from("v"), ..Default::default() };
    m0.put(req).await.expect("a put");
    let added = m0.member_add(vec![urls[1].clone()], true).await.expect("add a learner");
    let both = format!("{first},m1={}", urls[1]);
    let m1 = Engine::open(config("m1", &both, &urls[1], ClusterState::Existing))
        .expect("m1 joins over TLS");
    assert_eq!(m1.identity(), (m0.identity().0, added.id));
    let deadline = Instant::now() + Duration::from_secs(10);
    while m1.status().revision < m0.status().revision {
        assert!(Instant::now() < deadline, "the leader never reached the added member");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    m0.stop();
    m1.stop();
    let _ = std::fs::remove_dir_all(dir);
}
