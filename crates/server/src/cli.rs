//! What the `cairn` binary checks before it serves: etcd flags it does not take yet, the URLs it
//! listens on (as etcd reads them), that every listener can be bound before anything is written
//! to the data directory, and that a start that fails leaves no new data directory behind.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::anyhow;
use cairn::EngineError;
use cairn_node::OpenError;
use cairn_transport::url::{host_port, listen_addr};
use clap::error::{ContextKind, ContextValue, ErrorKind};

/// The flags `etcd --help` lists for etcd 3.5.17 (without `--`), less the TLS flags cairn
/// takes. Those cairn does not take are named as etcd flags it does not support yet, so
/// someone moving an etcd command line over learns what is missing rather than getting clap's
/// guess at a similar flag.
pub(crate) const ETCD_FLAGS: &[&str] = &[
    "advertise-client-urls",
    "auth-token",
    "auth-token-ttl",
    "auto-compaction-mode",
    "auto-compaction-retention",
    "auto-tls",
    "backend-batch-interval",
    "backend-batch-limit",
    "backend-bbolt-freelist-type",
    "bcrypt-cost",
    "client-cert-file",
    "client-key-file",
    "config-file",
    "cors",
    "data-dir",
    "discovery",
    "discovery-fallback",
    "discovery-proxy",
    "discovery-srv",
    "discovery-srv-name",
    "election-timeout",
    "enable-grpc-gateway",
    "enable-log-rotation",
    "enable-pprof",
    "enable-v2",
    "experimental-bootstrap-defrag-threshold-megabytes",
    "experimental-compact-hash-check-enabled",
    "experimental-compact-hash-check-time",
    "experimental-compaction-batch-limit",
    "experimental-compaction-sleep-interval",
    "experimental-corrupt-check-time",
    "experimental-distributed-tracing-address",
    "experimental-distributed-tracing-instance-id",
    "experimental-distributed-tracing-sampling-rate",
    "experimental-distributed-tracing-service-name",
    "experimental-downgrade-check-time",
    "experimental-enable-distributed-tracing",
    "experimental-enable-lease-checkpoint",
    "experimental-enable-lease-checkpoint-persist",
    "experimental-enable-v2v3",
    "experimental-initial-corrupt-check",
    "experimental-memory-mlock",
    "experimental-peer-skip-client-san-verification",
    "experimental-stop-grpc-service-on-defrag",
    "experimental-txn-mode-write-with-shared-buffer",
    "experimental-warning-apply-duration",
    "experimental-watch-progress-notify-interval",
    "force-new-cluster",
    "grpc-keepalive-interval",
    "grpc-keepalive-min-time",
    "grpc-keepalive-timeout",
    "heartbeat-interval",
    "host-whitelist",
    "initial-advertise-peer-urls",
    "initial-cluster",
    "initial-cluster-state",
    "initial-cluster-token",
    "initial-election-tick-advance",
    "listen-client-http-urls",
    "listen-client-urls",
    "listen-metrics-urls",
    "listen-peer-urls",
    "log-level",
    "log-outputs",
    "log-rotation-config-json",
    "logger",
    "max-concurrent-streams",
    "max-request-bytes",
    "max-snapshots",
    "max-txn-ops",
    "max-wals",
    "metrics",
    "name",
    "peer-auto-tls",
    "peer-client-cert-file",
    "peer-client-key-file",
    "pre-vote",
    "proxy",
    "proxy-dial-timeout",
    "proxy-failure-wait",
    "proxy-read-timeout",
    "proxy-refresh-interval",
    "proxy-write-timeout",
    "quota-backend-bytes",
    "raft-read-timeout",
    "raft-write-timeout",
    "self-signed-cert-validity",
    "snapshot-count",
    "socket-reuse-address",
    "socket-reuse-port",
    "strict-reconfig-check",
    "unsafe-no-fsync",
    "v2-deprecation",
    "wal-dir",
];

/// Parses a command line as [`clap::Parser::try_parse_from`] does, with etcd flags that cairn
/// does not support yet named as such.
pub(crate) fn parse_from<C: clap::Parser>(
    args: impl IntoIterator<Item = impl Into<OsString>>,
) -> Result<C, clap::Error> {
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    // `cairn bench` has flags of its own; only the server's command line is etcd's.
    let serving = args.get(1).is_none_or(|a| a != "bench");
    C::try_parse_from(&args).map_err(|e| match unsupported_etcd_flag(&e) {
        Some(flag) if serving => {
            let msg = format!(
                "{flag} is an etcd flag cairn does not support yet\n\n\
                 For the flags cairn takes, try '--help'.\n"
            );
            clap::Error::raw(ErrorKind::UnknownArgument, msg).with_cmd(&C::command())
        }
        _ => e,
    })
}

/// The etcd flag (`--name`) that clap refused as unknown, if it is one.
fn unsupported_etcd_flag(e: &clap::Error) -> Option<String> {
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else { return None };
    let name = arg.strip_prefix("--")?;
    let name = name.split_once('=').map_or(name, |(n, _)| n);
    ETCD_FLAGS.contains(&name).then(|| format!("--{name}"))
}

/// The addresses a list of URLs to listen on binds, read as etcd reads them: `http://` and an
/// IP address or `localhost`.
pub(crate) fn listen_addrs(flag: &str, urls: &[String]) -> anyhow::Result<Vec<SocketAddr>> {
    urls.iter().map(|u| listen_addr(u).map_err(|e| anyhow!("--{flag}: {e}"))).collect()
}

/// Checks URLs that are advertised, not bound: any host name will do, as in etcd.
pub(crate) fn check_urls(flag: &str, urls: &[String]) -> anyhow::Result<()> {
    for u in urls {
        host_port(u).map_err(|e| anyhow!("--{flag}: {e}"))?;
    }
    Ok(())
}

/// Binds and releases every client address, as the server binds them (tokio, with
/// SO_REUSEADDR), so that a port in use stops the start before the engine creates the data
/// directory: etcd, too, opens its listeners first.
pub(crate) async fn check_client_listeners(addrs: &[SocketAddr]) -> anyhow::Result<()> {
    for addr in addrs {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow!("--listen-client-urls: cannot listen on {addr}: {e}"))?;
    }
    Ok(())
}

/// The same for the peer addresses, bound as the peer transport binds them (std, without
/// SO_REUSEADDR).
pub(crate) fn check_peer_listeners(addrs: &[SocketAddr]) -> anyhow::Result<()> {
    for addr in addrs {
        std::net::TcpListener::bind(addr)
            .map_err(|e| anyhow!("--listen-peer-urls: cannot listen on {addr}: {e}"))?;
    }
    Ok(())
}

/// The directory this start would create for `--data-dir` (the topmost missing one), if the
/// data directory does not exist yet.
pub(crate) struct NewDataDir(Option<PathBuf>);

impl NewDataDir {
    pub(crate) fn before_start(data_dir: &Path) -> NewDataDir {
        let mut created = None;
        for dir in data_dir.ancestors().filter(|d| !d.as_os_str().is_empty()) {
            if dir.exists() {
                break;
            }
            created = Some(dir.to_path_buf());
        }
        NewDataDir(created)
    }

    /// After `serve` failed with `err`: when the engine could not open a directory this start
    /// created, it holds nothing anyone wrote, so it goes. Another process that holds the
    /// directory (`Locked`) may have created it, and a server that ran and then failed keeps
    /// its data whatever happens.
    pub(crate) fn remove_after_failed_open(self, err: &anyhow::Error) {
        let Some(dir) = self.0 else { return };
        let open_failed = matches!(
            err.downcast_ref::<EngineError>(),
            Some(EngineError::Open(e)) if !matches!(e, OpenError::Locked { .. })
        );
        if open_failed {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!("could not remove {} after the failed start: {e}", dir.display());
            }
        }
    }
}
