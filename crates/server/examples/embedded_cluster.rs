// Three embedded cairn engines forming one Raft cluster over loopback, in one program:
//
//   cargo run -p cairn --example embedded_cluster
//   cargo run -p cairn --example embedded_cluster -- --serve-etcd 127.0.0.1:2379
//
// Each engine is what one program of a real deployment would open: give each its own process
// (or machine) with the same member list and it is the same cluster, as `embedded_member.rs`
// does (one program per member, three terminals or its `--demo`). The engines talk over
// cairn's peer transport, as `cairn serve` members do. A write on any member is forwarded to
// the leader; a linearizable read on any member asks the leader for a read index first. Each
// member announces leadership changes as it sees them. With `--serve-etcd ADDR`, member m0 also
// serves the etcd v3 API (etcdctl, any etcd client) on ADDR until Ctrl-C.
//
// Serving the etcd API needs the `server` feature (on by default); the engines alone do not.
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use cairn::kv::{PutRequest, RangeRequest};
use cairn::{Engine, EngineConfig, ServeConfig};

// Shared with `embedded_member.rs` (the path keeps working when the tests include this file).
#[path = "common/mod.rs"]
mod common;
use common::BoxError;

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

/// The member list every program of the cluster is started with (names and peer URLs), and
/// each member's engine configuration from it, as each program would build its own.
fn member_configs(dir: &Path, serve: Option<SocketAddr>) -> Result<Vec<EngineConfig>, BoxError> {
    let urls: Vec<String> =
        common::free_ports(3)?.iter().map(|p| format!("http://127.0.0.1:{p}")).collect();
    let initial: Vec<String> = urls.iter().enumerate().map(|(i, u)| format!("m{i}={u}")).collect();
    let initial = initial.join(",");
    // Each listens for peers on the URL it advertises; only m0 serves the etcd API, if asked.
    (0..urls.len())
        .map(|i| {
            let name = format!("m{i}");
            let serve = serve.filter(|_| i == 0);
            common::member_config(&name, dir.join(&name), &initial, &urls[i], serve)
        })
        .collect()
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
    let names = common::member_names(&configs[0]);
    let mut members = Vec::new();
    let mut announcers = Vec::new();
    for cfg in configs {
        // Opening replays the log and blocks this thread meanwhile (quick for a new directory).
        let engine = Arc::new(tokio::task::block_in_place(|| Engine::open(cfg.clone()))?);
        announcers.push(common::announce(cfg.name.clone(), &engine, names.clone()));
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
        first_leader: common::name_of(&names, first),
        next_leader: common::name_of(&names, next),
        notifications,
    })
}
