//! Connects the engine to its peers: starts the transport for the cluster flags, and turns
//! what it delivers into the driver's inputs.

use std::sync::Arc;

use cairn_raft::{Message, NodeId, SnapshotStatus};
use cairn_transport::url::{is_tls, listen_addr};
use cairn_transport::{
    ClientTls, Listener, PeerUrlError, ServerTls, Sink, Transport, TransportConfig,
};

use cairn_transport::members::{RemoteCluster, RemoteMember};

use crate::cluster::{ClusterConfig, MemberSpec};
use crate::driver::{Input, InputTx};
use crate::error::{EngineError, OpenError};
use crate::shared::Shared;

/// What the transport hands the driver.
#[derive(Debug)]
pub(crate) enum PeerInput {
    Message(Message),
    SnapshotSent {
        to: NodeId,
        status: SnapshotStatus,
    },
    Unreachable(NodeId),
    /// A peer refused this member as removed from the cluster.
    Removed(NodeId),
}

/// The transport's sink: the driver's input queue. Sending never blocks; a driver that has
/// stopped drops what arrives, and so does one that has too much waiting (`peer_inbox.rs`). It also answers a joining member's members query from the
/// applied membership.
struct DriverSink {
    tx: InputTx,
    shared: Arc<Shared>,
    flags: Vec<MemberSpec>,
    name: String,
}

impl Sink for DriverSink {
    /// Queued only while the bound on waiting messages allows (`peer_inbox.rs`); dropped
    /// otherwise, as Raft tolerates.
    fn message(&self, msg: Message) {
        let cost = crate::peer_inbox::cost(&msg);
        if !self.shared.peer_inbox.admit(cost) {
            return;
        }
        if self.tx.send(Input::Peer(PeerInput::Message(msg))).is_err() {
            // The driver has stopped: nothing will take it.
            self.shared.peer_inbox.taken(cost);
        }
    }

    fn snapshot_sent(&self, to: NodeId, delivered: bool) {
        let status = if delivered { SnapshotStatus::Finished } else { SnapshotStatus::Failed };
        let _ = self.tx.send(Input::Peer(PeerInput::SnapshotSent { to, status }));
    }

    fn unreachable(&self, to: NodeId) {
        let _ = self.tx.send(Input::Peer(PeerInput::Unreachable(to)));
    }

    fn is_removed(&self, id: NodeId) -> bool {
        self.shared.store.member(id.0).is_some_and(|a| a.removed)
    }

    fn removed(&self, by: NodeId) {
        let _ = self.tx.send(Input::Peer(PeerInput::Removed(by)));
    }

    /// A member that knows no membership yet (joining, before its first snapshot) has none to
    /// give: the caller asks another.
    fn members(&self) -> Option<RemoteCluster> {
        let list = crate::engine::member_list(&self.shared, &self.flags, &self.name);
        if list.is_empty() {
            return None;
        }
        let members = list
            .into_iter()
            .map(|m| RemoteMember {
                id: m.id,
                name: m.name,
                peer_urls: m.peer_urls,
                client_urls: m.client_urls,
                is_learner: m.is_learner,
            })
            .collect();
        Some(RemoteCluster { cluster_id: self.shared.cluster_id, members })
    }
}

/// Where snapshots are received, and how this member's are sent.
pub(crate) struct Snapshots {
    pub(crate) dir: std::path::PathBuf,
    pub(crate) images: Arc<cairn_transport::OutgoingImages>,
    pub(crate) send_rate: u64,
}

/// Binds the peer listeners and starts dialing every other member.
pub(crate) fn start(
    cluster: &ClusterConfig,
    name: &str,
    tx: InputTx,
    shared: Arc<Shared>,
    snap: Snapshots,
) -> Result<Transport, EngineError> {
    let traffic = shared.metrics.peers.clone();
    let open = |e| EngineError::Open(e);
    let mut cfg = TransportConfig::new(cluster.cluster_id, NodeId(cluster.local_id));
    (cfg.snapshot_dir, cfg.images) = (Some(snap.dir), Some(snap.images));
    cfg.snapshot_send_rate = snap.send_rate;
    let (server_tls, client_tls) = peer_tls(cluster).map_err(open)?;
    cfg.traffic = traffic;
    for url in &cluster.listen_peer_urls {
        let addr = listen_addr(url).map_err(|e| open(OpenError::PeerUrl(e)))?;
        let socket = std::net::TcpListener::bind(addr)
            .map_err(|e| open(OpenError::PeerListen { url: url.clone(), source: Arc::new(e) }))?;
        tracing::info!("listening for peers on {url}");
        let tls = if is_tls(url) { server_tls.clone() } else { None };
        cfg.listeners.push(Listener { socket, tls });
    }
    for member in cluster.peers() {
        let mut addrs = Vec::new();
        for url in &member.peer_urls {
            let resolved = cairn_transport::peer_addrs(url, client_tls.as_ref());
            addrs.extend(resolved.map_err(|e| open(peer_url_error(e)))?);
        }
        cfg.peers.insert(NodeId(member.id), addrs);
    }
    cfg.client_tls = client_tls;
    cfg.skip_client_san_verification = cluster.peer_skip_client_san_verification;
    // The driver reads plain message connections itself: no hand-off per message.
    cfg.poll = Some(tx.poll());
    let flags = cluster.members.clone();
    let sink = DriverSink { tx, shared, flags, name: name.to_string() };
    Transport::start(cfg, Arc::new(sink)).map_err(|e| open(OpenError::Spawn(Arc::new(e))))
}

fn peer_url_error(e: PeerUrlError) -> OpenError {
    match e {
        PeerUrlError::Url(e) => OpenError::PeerUrl(e),
        PeerUrlError::TlsMissing(url) => OpenError::PeerTlsMissing { url, listen: false },
    }
}

type PeerTls = (Option<Arc<ServerTls>>, Option<Arc<ClientTls>>);

/// The peer TLS the URLs ask for, loaded once for every listener and peer: an `https://` URL
/// without certificate files is refused, as etcd refuses it.
fn peer_tls(cluster: &ClusterConfig) -> Result<PeerTls, OpenError> {
    let listen = cluster.listen_peer_urls.iter().find(|u| is_tls(u));
    let dial = cluster.peers().flat_map(|m| &m.peer_urls).find(|u| is_tls(u));
    let Some(files) = &cluster.peer_tls else {
        if let Some(url) = listen {
            return Err(OpenError::PeerTlsMissing { url: url.clone(), listen: true });
        }
        if let Some(url) = dial {
            return Err(OpenError::PeerTlsMissing { url: url.clone(), listen: false });
        }
        return Ok((None, None));
    };
    let server = match listen {
        Some(_) => Some(Arc::new(ServerTls::new(files.clone(), &[]).map_err(OpenError::PeerTls)?)),
        None => None,
    };
    // A member that listens on TLS dials with it too, members added at run time included
    // (a cluster founded alone has no peer URL to dial yet).
    let client = match dial.or(listen) {
        Some(_) => Some(Arc::new(ClientTls::new(files.clone()).map_err(OpenError::PeerTls)?)),
        None => None,
    };
    Ok((server, client))
}
