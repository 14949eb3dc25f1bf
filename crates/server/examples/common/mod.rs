//! What the embedded-cluster examples share: a member's engine configuration from etcd's
//! cluster flags, free loopback ports, and the member's announcements of leadership changes.
//! `embedded_cluster.rs` opens three such members in one program, `embedded_member.rs` one per
//! program. (A directory, not `examples/common.rs`, so that cargo takes it for no example.)
use std::collections::BTreeMap;
use std::error::Error;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use cairn::cluster::{ClusterConfig, ClusterState};
use cairn::{Engine, EngineConfig};

pub type BoxError = Box<dyn Error + Send + Sync>;

/// etcd's `--initial-cluster-token`: every member of one cluster is started with the same.
const TOKEN: &str = "embedded";

/// `n` free loopback ports: each bound to port 0 and released, for a member to bind soon after.
pub fn free_ports(n: usize) -> Result<Vec<u16>, BoxError> {
    let listeners: Vec<std::net::TcpListener> =
        (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<Result<_, _>>()?;
    // All bound at once, so the `n` are distinct; released together when `listeners` drops.
    Ok(listeners.iter().map(|l| l.local_addr().map(|a| a.port())).collect::<Result<_, _>>()?)
}

/// The engine configuration of member `name`, from etcd's flags: `initial` is the member list
/// (`--initial-cluster`, `name=peer-URL,...`), which gives this member's advertised peer URL;
/// it listens for peers on `listen_peer` (`--listen-peer-urls`: a URL, or `HOST:PORT` for
/// plain http). With `serve`, the member advertises the client URL it serves the etcd API on.
pub fn member_config(
    name: &str,
    data_dir: PathBuf,
    initial: &str,
    listen_peer: &str,
    serve: Option<SocketAddr>,
) -> Result<EngineConfig, BoxError> {
    let advertised: Vec<String> = initial
        .split(',')
        .filter_map(|m| m.trim().split_once('='))
        .filter(|(n, _)| *n == name)
        .map(|(_, url)| url.to_string())
        .collect();
    let listen = match listen_peer.contains("://") {
        true => listen_peer.to_string(),
        false => format!("http://{listen_peer}"),
    };
    let cluster =
        ClusterConfig::from_flags(name, initial, TOKEN, &advertised, &[listen], ClusterState::New)?;
    let mut cfg = EngineConfig::new(name, data_dir);
    cfg.cluster = Some(cluster);
    if let Some(addr) = serve {
        // Published through the log, so every member's MemberList shows where this one serves.
        cfg.advertise_client_urls = vec![format!("http://{addr}")];
    }
    Ok(cfg)
}

/// Every member's name by member id, from the member list `cfg` was made with.
pub fn member_names(cfg: &EngineConfig) -> Arc<BTreeMap<u64, String>> {
    let members = cfg.cluster.as_ref().map(|c| c.members.clone()).unwrap_or_default();
    Arc::new(members.into_iter().map(|m| (m.id, m.name)).collect())
}

/// A member's name, or its id in hex if it is not in the member list (added later).
pub fn name_of(names: &BTreeMap<u64, String>, id: u64) -> String {
    names.get(&id).cloned().unwrap_or_else(|| format!("{id:x}"))
}

/// Prints each leadership change `engine` sees, one line each (`[m0] term 3: m1 leads`), until
/// it stops; returns how many it saw.
pub fn announce(
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
                Some(id) => {
                    println!("[{name}] term {}: {} leads", now.term.0, name_of(&names, id.0))
                }
                None => println!("[{name}] term {}: electing", now.term.0),
            }
        }
        seen
    })
}
