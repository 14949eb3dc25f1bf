// Three embedded cairn engines forming one Raft cluster over loopback, in one program:
//
//   cargo run -p cairn --example embedded_cluster
//   cargo run -p cairn --example embedded_cluster -- --serve-etcd 127.0.0.1:2379
//
// Each engine is what one program of a real deployment would open: give each its own process
// (or machine) with the same member list and it is the same cluster. The engines talk over
// cairn's peer transport, as `cairn serve` members do. A write on any member is forwarded to
// the leader; a linearizable read on any member asks the leader for a read index first. Each
// member announces leadership changes as it sees them. With `--serve-etcd ADDR`, member m0 also
// serves the etcd v3 API (etcdctl, any etcd client) on ADDR until Ctrl-C.
//
// Serving the etcd API needs the `server` feature (on by default); the engines alone do not.
use std::collections::BTreeMap;
use std::error::Error;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use cairn::cluster::{ClusterConfig, ClusterState};
use cairn::kv::{PutRequest, RangeRequest};
use cairn::{Engine, EngineConfig, ServeConfig};

type BoxError = Box<dyn Error + Send + Sync>;

/// Where `--serve-etcd` serves m0's etcd API, and what the tour waits for before it stops
/// serving: Ctrl-C here; the example's test makes its etcd requests instead.
#[allow(missing_debug_implementations)] // a future has nothing to show
pub struct ServeEtcd {
    pub addr: SocketAddr,
    pub until: Pin<Box<dyn Future<Output = ()> + Send>>,
}

/// What the tour saw, for the test that keeps this example working.
#[derive(Debug)]
pub struct Seen {
    pub first_leader: String,
    pub next_leader: String,
    /// Leadership notifications the members received, all together.
    pub notifications: usize,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let serve = match std::env::args().skip(1).collect::<Vec<_>>().as_slice() {
        [] => None,
        [flag, addr] if flag == "--serve-etcd" => Some(ServeEtcd {
            addr: addr.parse()?,
            until: Box::pin(async {
                let _ = tokio::signal::ctrl_c().await;
            }),
        }),
        _ => return Err("usage: embedded_cluster [--serve-etcd HOST:PORT]".into()),
    };
    let dir = std::env::temp_dir().join(format!("cairn-embedded-cluster-{}", std::process::id()));
    let seen = tour(&dir, serve).await;
    // Whatever happened, the data directories go: this is a demonstration.
    let _ = std::fs::remove_dir_all(&dir);
    let seen = seen?;
    println!(
        "{} led, then {}; {} leadership notifications; data removed",
        seen.first_leader, seen.next_leader, seen.notifications
    );
    Ok(())
}

/// The member list every program of the cluster is started with: names and peer URLs.
fn member_configs(dir: &Path, serve: Option<SocketAddr>) -> Result<Vec<EngineConfig>, BoxError> {
    // Free loopback ports: bound to port 0 and released just before the engines bind them.
    let ports: Vec<u16> = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0")?.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()?;
    let urls: Vec<String> = ports.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let initial: Vec<String> = urls.iter().enumerate().map(|(i, u)| format!("m{i}={u}")).collect();
    let mut configs = Vec::new();
    for (i, url) in urls.iter().enumerate() {
        let name = format!("m{i}");
        let mut cfg = EngineConfig::new(&name, dir.join(&name));
        let url = std::slice::from_ref(url);
        // etcd's flags: --initial-cluster, its token, and this member's peer URLs (advertised
        // and listened on, the same here).
        let initial = initial.join(",");
        let cluster =
            ClusterConfig::from_flags(&name, &initial, "embedded", url, url, ClusterState::New)?;
        cfg.cluster = Some(cluster);
        if let (0, Some(addr)) = (i, serve) {
            // Published through the log, so every member's MemberList shows where m0 serves.
            cfg.advertise_client_urls = vec![format!("http://{addr}")];
        }
        configs.push(cfg);
    }
    Ok(configs)
}

/// Prints each leadership change `engine` sees until it stops; returns how many it saw.
fn announce(
    name: String,
    engine: &Engine,
    names: Arc<BTreeMap<u64, String>>,
) -> tokio::task::JoinHandle<usize> {
    let mut leadership = engine.leadership();
    tokio::spawn(async move {
        let mut seen = 0;
        // The current state first (`None` until the engine knows it), then every change; it
        // ends when the engine stops.
        while let Ok(now) = leadership.changed().await {
            let Some(now) = now else { continue };
            seen += 1;
            match now.leader {
                Some(id) => println!("[{name}] term {}: {} leads", now.term.0, names[&id.0]),
                None => println!("[{name}] term {}: electing", now.term.0),
            }
        }
        seen
    })
}

/// Waits until `engine` sees a leader other than `old`, and returns its id.
async fn leader_seen_by(engine: &Engine, old: Option<u64>) -> Result<u64, BoxError> {
    let mut leadership = engine.leadership();
    loop {
        let now = leadership.changed().await?;
        if let Some(id) = now.and_then(|l| l.leader).filter(|id| Some(id.0) != old) {
            return Ok(id.0);
        }
    }
}

/// Waits (30 s at most) until every member sees the same leader, other than `old`: a member
/// forwards writes to the leader it knows, so each must know the new one.
async fn agreed_leader(
    members: &[(String, Arc<Engine>)],
    old: Option<u64>,
) -> Result<u64, BoxError> {
    let agreed = async {
        loop {
            let mut seen = Vec::new();
            for (_, engine) in members {
                seen.push(leader_seen_by(engine, old).await?);
            }
            if seen.iter().all(|id| *id == seen[0]) {
                return Ok::<u64, BoxError>(seen[0]);
            }
            // Mid-election, members may still name different leaders.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), agreed).await?
}

/// One write through each member, then a linearizable read of them all on each member.
async fn write_and_read(members: &[(String, Arc<Engine>)], round: &str) -> Result<(), BoxError> {
    for (name, engine) in members {
        let key = format!("app/{round}/from-{name}");
        let put =
            engine.put(PutRequest::new(key.clone(), format!("written through {name}"))).await?;
        println!("{name}: put {key} at revision {}", put.revision);
    }
    for (name, engine) in members {
        let read = engine.range(RangeRequest::prefix(format!("app/{round}/"))).await?;
        if read.kvs.len() != members.len() {
            return Err(format!("{name} misses writes: {:?}", read.kvs).into());
        }
        println!(
            "{name}: reads {} keys under app/{round}/ at revision {}",
            read.count, read.revision
        );
    }
    Ok(())
}

/// Serves m0's etcd API on the side until `serve.until` resolves, then stops serving: the
/// engine is the program's, and goes on.
async fn serve_etcd(engine: Arc<Engine>, serve: ServeEtcd) -> Result<(), BoxError> {
    let addr = serve.addr;
    let cfg = ServeConfig::new(engine.config().clone(), vec![format!("http://{addr}")]);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(cairn::serve_engine(engine, cfg, async {
        let _ = stopped.await;
    }));
    println!("m0 serves the etcd API: etcdctl --endpoints={addr} get --prefix app/");
    println!("(Ctrl-C goes on)");
    serve.until.await;
    let _ = stop.send(());
    server.await??;
    Ok(())
}

/// The whole demonstration, with its data under `dir`.
pub async fn tour(dir: &Path, serve: Option<ServeEtcd>) -> Result<Seen, BoxError> {
    let configs = member_configs(dir, serve.as_ref().map(|s| s.addr))?;
    let spec = configs[0].cluster.as_ref().map(|c| c.members.clone()).unwrap_or_default();
    let names: BTreeMap<u64, String> = spec.into_iter().map(|m| (m.id, m.name)).collect();
    let names = Arc::new(names);
    let mut members = Vec::new();
    let mut announcers = Vec::new();
    for cfg in configs {
        // Opening replays the log and blocks this thread meanwhile (quick for a new directory).
        let engine = Arc::new(tokio::task::block_in_place(|| Engine::open(cfg.clone()))?);
        announcers.push(announce(cfg.name.clone(), &engine, names.clone()));
        members.push((cfg.name, engine));
    }
    let first = agreed_leader(&members, None).await?;
    write_and_read(&members, "first").await?;
    if let Some(serve) = serve {
        serve_etcd(members[0].1.clone(), serve).await?;
    }

    // The leader's program goes away: the others elect a new leader and announce it. (A
    // program that shuts down on purpose calls `hand_over_leadership()` first, and spares the
    // others the election timeout.)
    let gone = members.iter().position(|(_, e)| e.identity().1 == first).ok_or("no leader")?;
    let (name, engine) = members.remove(gone);
    println!("stopping {name}, the leader");
    tokio::task::block_in_place(|| engine.stop());
    let next = agreed_leader(&members, Some(first)).await?;
    write_and_read(&members, "after-failover").await?;

    for (_, engine) in &members {
        tokio::task::block_in_place(|| engine.stop());
    }
    let mut notifications = 0;
    for a in announcers {
        // Each announcer ends with its engine.
        notifications += a.await?;
    }
    Ok(Seen {
        first_leader: names[&first].clone(),
        next_leader: names[&next].clone(),
        notifications,
    })
}
