//! Connects the engine to its peers: starts the transport for the cluster flags, and turns
//! what it delivers into the driver's inputs.

use std::sync::{mpsc, Arc};

use cairn_raft::{Message, NodeId, SnapshotStatus};
use cairn_transport::url::{listen_addr, resolve};
use cairn_transport::{Sink, Transport, TransportConfig};

use crate::cluster::ClusterConfig;
use crate::driver::Input;
use crate::error::{EngineError, OpenError};

/// What the transport hands the driver.
#[derive(Debug)]
pub(crate) enum PeerInput {
    Message(Message),
    SnapshotSent { to: NodeId, status: SnapshotStatus },
    Unreachable(NodeId),
}

/// The transport's sink: the driver's input queue. Sending never blocks; a driver that has
/// stopped drops what arrives.
struct DriverSink(mpsc::Sender<Input>);

impl Sink for DriverSink {
    fn message(&self, msg: Message) {
        let _ = self.0.send(Input::Peer(PeerInput::Message(msg)));
    }

    fn snapshot_sent(&self, to: NodeId, delivered: bool) {
        let status = if delivered { SnapshotStatus::Finished } else { SnapshotStatus::Failed };
        let _ = self.0.send(Input::Peer(PeerInput::SnapshotSent { to, status }));
    }

    fn unreachable(&self, to: NodeId) {
        let _ = self.0.send(Input::Peer(PeerInput::Unreachable(to)));
    }
}

/// Binds the peer listeners and starts dialing every other member.
pub(crate) fn start(
    cluster: &ClusterConfig,
    tx: mpsc::Sender<Input>,
    traffic: Arc<cairn_transport::PeerTraffic>,
) -> Result<Transport, EngineError> {
    let open = |e| EngineError::Open(e);
    let mut cfg = TransportConfig::new(cluster.cluster_id, NodeId(cluster.local_id));
    cfg.traffic = traffic;
    for url in &cluster.listen_peer_urls {
        let addr = listen_addr(url).map_err(|e| open(OpenError::PeerUrl(e)))?;
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|e| open(OpenError::PeerListen { url: url.clone(), source: Arc::new(e) }))?;
        tracing::info!("listening for peers on {url}");
        cfg.listeners.push(listener);
    }
    for member in cluster.peers() {
        let mut addrs = Vec::new();
        for url in &member.peer_urls {
            addrs.extend(resolve(url).map_err(|e| open(OpenError::PeerUrl(e)))?);
        }
        cfg.peers.insert(NodeId(member.id), addrs);
    }
    Transport::start(cfg, Arc::new(DriverSink(tx))).map_err(|e| open(OpenError::Spawn(Arc::new(e))))
}
