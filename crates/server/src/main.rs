//! The `cairn` binary.

mod cli;
mod config_file;
mod cpu_quota;

use std::path::PathBuf;

use anyhow::Result;
use cairn::{AuthToken, EngineConfig, ServeConfig};
use cairn_node::cluster::{ClusterConfig, ClusterState};
use cairn_transport::TlsFiles;
use clap::{Args, Parser, Subcommand};

mod snapshot_cmd;
mod wal_cmd;

#[derive(Parser)]
#[command(
    name = "cairn",
    version,
    about = "A Raft-replicated key-value store that speaks the etcd v3 API"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a cairn member (the default when no command is given).
    Serve(Box<ServeArgs>),
    /// Benchmark any etcd v3 endpoint (cairn or etcd), or an embedded engine.
    Bench(cairn_bench::BenchArgs),
    /// Work on a stopped member's write-ahead log.
    #[command(subcommand)]
    Wal(wal_cmd::WalCmd),
    /// Restore a member from a snapshot file, or show what a snapshot file holds.
    #[command(subcommand)]
    Snapshot(snapshot_cmd::SnapshotCmd),
}

#[derive(Args, Clone)]
struct ServeArgs {
    /// Human-readable name of this member.
    #[arg(long, default_value = "default")]
    name: String,
    /// Where the member keeps its write-ahead log and database.
    #[arg(long, default_value = "./cairn-data")]
    data_dir: PathBuf,
    /// URLs to serve clients on (comma-separated): the etcd gRPC API and HTTP health.
    #[arg(long, default_value = "http://127.0.0.1:2379", value_delimiter = ',')]
    listen_client_urls: Vec<String>,
    /// Client URLs this member advertises in MemberList (defaults to the listen URLs).
    #[arg(long, value_delimiter = ',')]
    advertise_client_urls: Vec<String>,
    /// Peer URLs this member advertises to the rest of the cluster.
    #[arg(long, default_value = "http://localhost:2380", value_delimiter = ',')]
    initial_advertise_peer_urls: Vec<String>,
    /// URLs to accept peer traffic on (comma-separated); used with --initial-cluster.
    #[arg(long, default_value = "http://localhost:2380", value_delimiter = ',')]
    listen_peer_urls: Vec<String>,
    /// The founding members, as name=peer-url pairs (comma-separated), this member included.
    /// Without it, cairn runs a single member that needs no peers.
    #[arg(long)]
    initial_cluster: Option<String>,
    /// `new` to found the cluster, `existing` to join a running one.
    #[arg(long, default_value = "new", value_parser = ["new", "existing"])]
    initial_cluster_state: String,
    /// Distinguishes clusters started with the same peer URLs: it goes into every id.
    #[arg(long, default_value = cairn_node::cluster::DEFAULT_TOKEN)]
    initial_cluster_token: String,
    /// Largest request accepted, in bytes (etcd's default: 1.5 MiB).
    #[arg(long, default_value_t = 1536 * 1024)]
    max_request_bytes: usize,
    /// Most operations in one transaction branch.
    #[arg(long, default_value_t = 128)]
    max_txn_ops: usize,
    /// Time between heartbeats, in milliseconds (one Raft tick).
    #[arg(long, default_value_t = 100)]
    heartbeat_interval: u64,
    /// Time before an election, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    election_timeout: u64,
    /// Database size past which writes that add data fail with "database space exceeded"
    /// (reads, deletes and compaction keep working), in bytes.
    #[arg(long, default_value_t = 8 << 30)]
    quota_backend_bytes: usize,
    /// Applied entries between compactions of the Raft log (etcd 3.6's default: 10,000).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_count: u64,
    /// Entries the Raft log keeps behind every compaction, so that a follower a little behind,
    /// or one that just installed a snapshot, catches up from the log (etcd's default: 5,000;
    /// 0 means the default, as in etcd). etcd 3.5 calls it
    /// --experimental-snapshot-catchup-entries.
    #[arg(long, default_value_t = cairn_node::DEFAULT_SNAPSHOT_CATCHUP_ENTRIES,
        alias = "experimental-snapshot-catchup-entries",
        // etcd 3.5's configuration file spells the key so.
        alias = "experimental-snapshot-catch-up-entries")]
    snapshot_catchup_entries: u64,
    /// The most the leader's Raft log may hold, in bytes, while it keeps entries for a
    /// follower catching up (one receiving or installing a snapshot); past it the follower
    /// gets another snapshot. The log is in memory: this bounds what one slow follower costs
    /// the leader. Raise it to join a member to a large store under heavy writes with one
    /// snapshot (cairn's own; default 256 MiB).
    #[arg(long, default_value_t = cairn_node::DEFAULT_SNAPSHOT_CATCHUP_MAX_BYTES)]
    snapshot_catchup_max_bytes: u64,
    /// How linearizable reads are confirmed: `read-index` (etcd's way: one heartbeat round
    /// per batch of reads) or `lease` (the leader answers at once while its lease holds; safe
    /// only while clock drift and process stalls stay under the lease margin of two ticks).
    #[arg(long, default_value = "read-index", value_parser = ["read-index", "lease"])]
    read_mode: String,
    /// How the write-ahead log is made durable: `inline` (each batch fsynced before the member
    /// goes on), `async` (batches fsynced on a thread of their own while the member goes on
    /// taking, sending and applying, as etcd raft's asynchronous storage writes;
    /// acknowledgements still wait for the fsync), or `auto` (the default: async once the
    /// disk's fsyncs average 500 µs or more over a second while several writes or requests
    /// share each, inline again under 300 µs or for a lone writer). All are equally durable
    /// (cairn's own).
    #[arg(long, default_value = "auto", value_parser = ["auto", "async", "inline"])]
    log_sync: String,
    /// The longest the Raft thread, after a turn that had work, and a lone request (none other
    /// in flight) wait awake for their next event before they sleep (a Go duration; 0 always
    /// sleeps). A sleeping thread must be woken, which costs 40-110 µs on a machine whose
    /// idle cores halt. A wait yields the core to any thread that wants it, so it spends only
    /// idle CPU, and is skipped while most recent waits did not catch their event within this
    /// bound. The time spent shows as the member's CPU use; under a CPU quota (a container's
    /// CPU limit) it would count against the quota, so there the default is 0 (cairn's own;
    /// default 500us).
    #[arg(long, value_parser = cairn::parse_duration)]
    spin_wait: Option<std::time::Duration>,
    /// A deliberate bug, to prove the fault tests catch it (builds with `planted-bugs` only).
    #[cfg(feature = "planted-bugs")]
    #[arg(long, value_parser = ["read-without-index"])]
    unsafe_planted_bug: Option<String>,
    /// How often a watcher that asked for progress notices gets one while idle (a Go
    /// duration; etcd 3.5 calls it --experimental-watch-progress-notify-interval).
    #[arg(long, default_value = "10m", value_parser = cairn::parse_duration,
        alias = "experimental-watch-progress-notify-interval")]
    watch_progress_notify_interval: std::time::Duration,
    /// Concurrent HTTP/2 streams (calls and watches) one client connection may have open
    /// (etcd's default: 2^32 - 1; etcd clients put everything on one connection).
    #[arg(long, default_value_t = u32::MAX)]
    max_concurrent_streams: u32,
    /// Expired leases revoked per second at most (etcd fixes 1,000), so a storm of expiries
    /// never starves writes.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    lease_revoke_rate: u64,
    /// bcrypt's cost for the passwords of users added or changed through this member (etcd's
    /// default: 10; lower is faster and weaker).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(4..=31))]
    bcrypt_cost: u32,
    /// The auth token provider: `simple` (random tokens kept by the member that issued them),
    /// or etcd's `jwt,pub-key=PATH,priv-key=PATH,sign-method=RS256,ttl=5m` (signed tokens every
    /// member with the key accepts; sign methods RS/PS/HS/ES 256-512).
    #[arg(long, default_value = "simple")]
    auth_token: String,
    /// Seconds a simple auth token lives after its last use.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    auth_token_ttl: u64,
    /// Learners the cluster may hold at once (etcd's flag and default).
    #[arg(long, default_value_t = 1)]
    max_learners: usize,
    /// The leader promotes a learner to a voter by itself once the learner's log has stayed
    /// within 1,000 entries of the leader's for five election timeouts (cairn's own; etcd
    /// leaves promotion to `member promote`).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set,
        default_value_t = false)]
    auto_promote_learners: bool,
    /// Bytes a second one snapshot transfer to a follower sends at most (0: unlimited, as
    /// etcd). Transfers run beside the leader's appends, never in their way; limit them on a
    /// link shared with other traffic.
    #[arg(long, default_value_t = 0)]
    snapshot_send_rate: u64,
    /// Most client connections open at once (0: no cap of its own). Never more than the
    /// open-file limit allows once descriptors are kept for the WAL, database and peers; past
    /// the cap, new connections are closed at once. etcd has no such flag.
    #[arg(long, default_value_t = 10_000)]
    max_client_conns: usize,
    /// Bytes that Range responses of more than 1,000 keys or 1 MiB may take in all while they
    /// are read and sent (0: an eighth of the memory, between 64 MiB and 4 GiB). A larger range
    /// fails with ResourceExhausted; ranges that would exceed it together wait their turn, up to
    /// 10 s. etcd has no such bound.
    #[arg(long, default_value_t = 0)]
    max_range_bytes_in_flight: u64,
    /// How often the leader compares every member's HashKV and raises a CORRUPT alarm for
    /// one that differs (a Go duration; off unless given, as in etcd).
    #[arg(long, value_parser = cairn::parse_duration,
        alias = "experimental-corrupt-check-time")]
    corrupt_check_time: Option<std::time::Duration>,
    /// Threads serving client connections (gRPC and HTTP); 0 means half the cores, at least 1,
    /// which leaves the rest to the Raft, WAL and store threads and to neighbours on the host.
    #[arg(long, default_value_t = 0)]
    client_threads: usize,
    /// etcd's log levels. `debug` logs what `info` does (cairn's builds leave debug events out);
    /// `panic` and `fatal` log errors only, such as a fail-stop's cause.
    #[arg(long, default_value = "info",
        value_parser = ["debug", "info", "warn", "error", "panic", "fatal"])]
    log_level: String,
    /// How log lines are written: `text` (etcd 3.6 calls it `console`) or `json`, one object
    /// per line with etcd's `level`, `ts` and `msg`-like fields.
    #[arg(long, default_value = "text", value_parser = ["text", "console", "json"])]
    log_format: String,
    /// Where log lines go: `stderr` (or etcd's `default`), `stdout`, or a file, appended to.
    #[arg(long, default_value = "stderr")]
    log_outputs: String,
    /// etcd's logger choice; etcd 3.5 has only `zap`, and cairn's is always structured.
    #[arg(long, default_value = "zap", value_parser = ["zap"])]
    logger: String,
    /// URLs to serve `/metrics` and `/health` on in plain HTTP (comma-separated), besides the
    /// client URLs, which serve `/metrics` too.
    #[arg(long, value_delimiter = ',')]
    listen_metrics_urls: Vec<String>,
    /// A YAML file in etcd's configuration format (keys named as the flags). Environment
    /// variables (`ETCD_NAME`, `CAIRN_NAME`, ...) override it, and flags override both.
    #[arg(long)]
    config_file: Option<PathBuf>,
    #[command(flatten)]
    tls: TlsArgs,
}

/// etcd's certificate flags. A bool takes etcd's forms: `--client-cert-auth` alone, or
/// `--client-cert-auth=true|false`.
#[derive(Args, Clone)]
struct TlsArgs {
    /// Certificate (PEM) served on https:// client URLs.
    #[arg(long)]
    cert_file: Option<PathBuf>,
    /// Private key (PEM) of --cert-file.
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// CAs (PEM) that sign client certificates; as in etcd, clients of https:// URLs then
    /// need one.
    #[arg(long)]
    trusted_ca_file: Option<PathBuf>,
    /// Require a client certificate signed by --trusted-ca-file on https:// client URLs.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set,
        default_value_t = false)]
    client_cert_auth: bool,
    /// Certificate (PEM) served on https:// peer URLs and presented to the peers dialed.
    #[arg(long)]
    peer_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --peer-cert-file.
    #[arg(long)]
    peer_key_file: Option<PathBuf>,
    /// CAs (PEM) that sign the peers' certificates (without it, the system's roots).
    #[arg(long)]
    peer_trusted_ca_file: Option<PathBuf>,
    /// Require a peer certificate signed by --peer-trusted-ca-file on https:// peer URLs.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set,
        default_value_t = false)]
    peer_client_cert_auth: bool,
    /// Accept a peer's client certificate from any address; by default one that lists IP
    /// addresses or DNS names is accepted only from an address it names, as etcd checks.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set,
        default_value_t = false, alias = "experimental-peer-skip-client-san-verification")]
    peer_skip_client_san_verification: bool,
    /// Certificate revocation list (PEM or DER): client certificates it revokes are refused.
    #[arg(long)]
    client_crl_file: Option<PathBuf>,
    /// Certificate revocation list (PEM or DER): peer certificates it revokes are refused.
    #[arg(long)]
    peer_crl_file: Option<PathBuf>,
    /// TLS 1.2 cipher suites (Go's names, comma-separated, most preferred first) for clients
    /// and peers; empty: the defaults (ECDHE with AES-GCM or ChaCha20-Poly1305).
    #[arg(long, value_delimiter = ',')]
    cipher_suites: Vec<String>,
    /// Lowest TLS version served and used: TLS1.2 or TLS1.3.
    #[arg(long, default_value = "TLS1.2")]
    tls_min_version: String,
    /// Highest TLS version served and used: TLS1.2 or TLS1.3 (empty: the highest there is).
    #[arg(long, default_value = "")]
    tls_max_version: String,
    /// Client certificates must be valid for one of these host names or addresses
    /// (comma-separated).
    #[arg(long, value_delimiter = ',')]
    client_cert_allowed_hostname: Vec<String>,
    /// Peer certificates, both ways, must have one of these Common Names (comma-separated).
    #[arg(long, value_delimiter = ',')]
    peer_cert_allowed_cn: Vec<String>,
    /// Peer certificates, both ways, must be valid for one of these host names or addresses
    /// (comma-separated).
    #[arg(long, value_delimiter = ',')]
    peer_cert_allowed_hostname: Vec<String>,
}

/// One side's certificate flags (`prefix` is "" or "peer-"), when its certificate and key are
/// given; etcd refuses one without the other.
fn tls_files(
    prefix: &str,
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
    ca: &Option<PathBuf>,
    auth: bool,
) -> Result<Option<TlsFiles>> {
    match (cert, key) {
        (Some(cert_file), Some(key_file)) => Ok(Some(TlsFiles {
            cert_file: cert_file.clone(),
            key_file: key_file.clone(),
            trusted_ca_file: ca.clone(),
            client_cert_auth: auth,
            ..TlsFiles::default()
        })),
        (None, None) => Ok(None),
        _ => anyhow::bail!(
            "--{prefix}cert-file and --{prefix}key-file must both be given (KeyFile and CertFile must both be present[key: {}, cert: {}])",
            key.as_deref().unwrap_or(std::path::Path::new("")).display(),
            cert.as_deref().unwrap_or(std::path::Path::new("")).display()
        ),
    }
}

fn serve_config(a: ServeArgs) -> Result<ServeConfig> {
    if a.election_timeout < 2 * a.heartbeat_interval || a.heartbeat_interval == 0 {
        anyhow::bail!("--election-timeout must be at least twice --heartbeat-interval");
    }
    let listen = listen_client_urls(&a)?;
    let (client_tls, peer_tls) = tls_flags(&a.tls)?;
    let listen_metrics_urls: Vec<String> =
        cli::listen_addrs("listen-metrics-urls", &a.listen_metrics_urls)?
            .iter()
            .map(|addr| format!("http://{addr}"))
            .collect();
    let mut engine = EngineConfig::new(&a.name, &a.data_dir);
    engine.tick_interval = std::time::Duration::from_millis(a.heartbeat_interval);
    engine.election_ticks = (a.election_timeout / a.heartbeat_interval) as u32;
    engine.max_request_bytes = a.max_request_bytes;
    engine.max_txn_ops = a.max_txn_ops;
    engine.quota_backend_bytes = Some(a.quota_backend_bytes as u64);
    engine.snapshot_entries = a.snapshot_count;
    // etcd replaces 0 with its default ("updating snapshot catch-up entries to default").
    engine.snapshot_catchup_entries = match a.snapshot_catchup_entries {
        0 => cairn_node::DEFAULT_SNAPSHOT_CATCHUP_ENTRIES,
        n => n,
    };
    engine.snapshot_catchup_max_bytes = a.snapshot_catchup_max_bytes;
    engine.lease_revoke_rate = a.lease_revoke_rate;
    let auth_token = auth_flags(&a, &mut engine)?;
    engine.max_learners = a.max_learners;
    engine.auto_promote_learners = a.auto_promote_learners;
    engine.snapshot_send_rate = a.snapshot_send_rate;
    engine.log_sync = match a.log_sync.as_str() {
        "inline" => cairn_node::LogSync::Inline,
        "async" => cairn_node::LogSync::Async,
        _ => cairn_node::LogSync::Auto,
    };
    engine.spin_wait = a.spin_wait.unwrap_or_else(cpu_quota::default_spin_wait);
    if a.read_mode == "lease" {
        engine.read_mode = cairn_node::ReadMode::Lease;
    }
    // etcd's request timeout: 5 s plus two election timeouts.
    engine.request_timeout = std::time::Duration::from_millis(5000 + 2 * a.election_timeout);
    engine.cluster = cluster_flags(&a, peer_tls)?;
    #[cfg(feature = "planted-bugs")]
    if a.unsafe_planted_bug.as_deref() == Some("read-without-index") {
        engine.planted_bug = Some(cairn_node::ReplicaBug::ReadWithoutIndex);
    }
    // What the member publishes to the others and shows in MemberList.
    engine.advertise_client_urls = if a.advertise_client_urls.is_empty() {
        a.listen_client_urls.clone()
    } else {
        a.advertise_client_urls
    };
    Ok(ServeConfig {
        engine,
        listen_client_urls: listen,
        advertise_peer_urls: a.initial_advertise_peer_urls,
        watch_progress_interval: a.watch_progress_notify_interval,
        max_concurrent_streams: a.max_concurrent_streams,
        max_client_conns: a.max_client_conns,
        max_range_bytes_in_flight: a.max_range_bytes_in_flight,
        client_tls,
        listen_metrics_urls,
        corrupt_check_interval: a.corrupt_check_time.filter(|d| !d.is_zero()),
        auth_token,
    })
}

/// The cluster etcd's cluster flags describe; `None` without `--initial-cluster`.
fn cluster_flags(a: &ServeArgs, peer_tls: Option<TlsFiles>) -> Result<Option<ClusterConfig>> {
    let Some(initial) = &a.initial_cluster else { return Ok(None) };
    let state = match a.initial_cluster_state.as_str() {
        "existing" => ClusterState::Existing,
        _ => ClusterState::New,
    };
    let mut cluster = ClusterConfig::from_flags(
        &a.name,
        initial,
        &a.initial_cluster_token,
        &a.initial_advertise_peer_urls,
        &a.listen_peer_urls,
        state,
    )?;
    cluster.peer_tls = peer_tls;
    cluster.peer_skip_client_san_verification = a.tls.peer_skip_client_san_verification;
    Ok(Some(cluster))
}

/// etcd's certificate flags, for the client and the peer listeners.
fn tls_flags(t: &TlsArgs) -> Result<(Option<TlsFiles>, Option<TlsFiles>)> {
    let client = tls_files("", &t.cert_file, &t.key_file, &t.trusted_ca_file, t.client_cert_auth)?;
    let peer = tls_files(
        "peer-",
        &t.peer_cert_file,
        &t.peer_key_file,
        &t.peer_trusted_ca_file,
        t.peer_client_cert_auth,
    )?;
    let policy =
        cairn_transport::TlsPolicy::parse(&t.cipher_suites, &t.tls_min_version, &t.tls_max_version)
            .map_err(anyhow::Error::msg)?;
    if !t.peer_cert_allowed_cn.is_empty() && !t.peer_cert_allowed_hostname.is_empty() {
        anyhow::bail!(
            "AllowedCNs and AllowedHostnames are mutually exclusive (cns={:?}, hostnames={:?})",
            t.peer_cert_allowed_cn,
            t.peer_cert_allowed_hostname
        );
    }
    let client = client.map(|f| TlsFiles {
        crl_file: t.client_crl_file.clone(),
        policy: policy.clone(),
        allowed_hostnames: t.client_cert_allowed_hostname.clone(),
        ..f
    });
    let peer = peer.map(|f| TlsFiles {
        crl_file: t.peer_crl_file.clone(),
        policy,
        allowed_cns: t.peer_cert_allowed_cn.clone(),
        allowed_hostnames: t.peer_cert_allowed_hostname.clone(),
        ..f
    });
    Ok((client, peer))
}

/// etcd's authentication flags.
fn auth_flags(a: &ServeArgs, engine: &mut EngineConfig) -> Result<AuthToken> {
    let token = AuthToken::parse(&a.auth_token)
        .map_err(|e| anyhow::anyhow!("--auth-token: failed to create token provider: {e}"))?;
    engine.bcrypt_cost = a.bcrypt_cost;
    engine.auth_token_ttl = std::time::Duration::from_secs(a.auth_token_ttl);
    Ok(token)
}

/// Checks every URL flag as etcd reads it, and returns the client URLs with the IP addresses
/// they bind (`localhost` is 127.0.0.1), as the server takes them.
fn listen_client_urls(a: &ServeArgs) -> Result<Vec<String>> {
    let addrs = cli::listen_addrs("listen-client-urls", &a.listen_client_urls)?;
    cli::check_urls("advertise-client-urls", &a.advertise_client_urls)?;
    if a.initial_cluster.is_some() {
        cli::listen_addrs("listen-peer-urls", &a.listen_peer_urls)?;
        cli::check_urls("initial-advertise-peer-urls", &a.initial_advertise_peer_urls)?;
    }
    let scheme = |u: &str| if cairn_transport::url::is_tls(u) { "https" } else { "http" };
    let urls = addrs.iter().zip(&a.listen_client_urls);
    Ok(urls.map(|(addr, u)| format!("{}://{addr}", scheme(u))).collect())
}

/// Binds every listener once before the engine opens: a port in use then stops the start
/// before the data directory is created.
async fn check_listeners(cfg: &ServeConfig) -> Result<()> {
    let client: Vec<_> = cfg
        .listen_client_urls
        .iter()
        .map(|u| cairn::parse_url(u))
        .collect::<Result<_, _>>()
        .map_err(anyhow::Error::msg)?;
    cli::check_client_listeners(&client).await?;
    if let Some(cluster) = &cfg.engine.cluster {
        cli::check_peer_listeners(&cli::listen_addrs(
            "listen-peer-urls",
            &cluster.listen_peer_urls,
        )?)?;
    }
    Ok(())
}

fn log_filter(level: &str) -> tracing::level_filters::LevelFilter {
    use tracing::level_filters::LevelFilter;
    match level {
        "debug" => LevelFilter::DEBUG,
        "warn" => LevelFilter::WARN,
        "error" | "panic" | "fatal" => LevelFilter::ERROR,
        _ => LevelFilter::INFO,
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
    eprintln!("cairn: shutting down");
}

fn bench(args: cairn_bench::BenchArgs) -> Result<()> {
    let (output, precise) = (args.output(), args.precise);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    // One worker per connection, up to the cores: all of a connection's frames pass through
    // its one HTTP/2 task, so a second worker for a single connection only hands its streams'
    // messages across threads. Measured with 10 watchers on one connection and one writer:
    // 31,000-32,000 events/s with two workers, 36,000-37,500 with one; a one-client put the
    // same either way (p50 212-219 us).
    if args.embedded.is_none() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        builder.worker_threads(args.conns.clamp(1, cores));
    }
    // As in the server's runtime (see `server_runtime`): a workload with a request in flight on
    // each of many streams gets its requests written together, a connection's at a time.
    #[cfg(tokio_unstable)]
    if args.workload.streams_requests() {
        builder.disable_lifo_slot();
    }
    let rt = builder.build()?;
    let report = rt.block_on(cairn_bench::run(args)).map_err(anyhow::Error::msg)?;
    Ok(cairn_bench::print(&report, output, precise)?)
}

/// The command line with `--config-file` and the environment's settings put in, parsed.
fn parse_args() -> (Cli, Vec<String>) {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let known = known_flags(&cmd);
    // Variables whose name or value is not UTF-8 are nobody's settings.
    let env = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
    let args = std::env::args_os().collect();
    match config_file::expand(args, env, &known, cli::ETCD_FLAGS) {
        Ok(e) => (cli::parse_from(e.args).unwrap_or_else(|e| e.exit()), e.ignored),
        Err(e) => {
            let err = clap::Error::raw(clap::error::ErrorKind::InvalidValue, format!("{e}\n"));
            err.with_cmd(&cmd).exit()
        }
    }
}

/// The server's long flag names, aliases included: what settings from a file or the
/// environment may name.
fn known_flags(cmd: &clap::Command) -> Vec<String> {
    cmd.get_arguments()
        .flat_map(|a| a.get_long().into_iter().chain(a.get_all_aliases().unwrap_or_default()))
        .map(str::to_string)
        .collect()
}

/// Starts the log as `--log-format`, `--log-outputs` and `--log-level` say.
fn init_logging(a: &ServeArgs) -> Result<()> {
    use tracing_subscriber::fmt::writer::BoxMakeWriter;
    let (writer, terminal) = match a.log_outputs.as_str() {
        "stderr" | "default" => (
            BoxMakeWriter::new(std::io::stderr),
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
        ),
        "stdout" => (
            BoxMakeWriter::new(std::io::stdout),
            std::io::IsTerminal::is_terminal(&std::io::stdout()),
        ),
        many if many.contains(',') => {
            anyhow::bail!("--log-outputs {many}: cairn writes its log to one output")
        }
        path => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| anyhow::anyhow!("--log-outputs {path}: {e}"))?;
            (BoxMakeWriter::new(std::sync::Arc::new(file)), false)
        }
    };
    let builder = tracing_subscriber::fmt()
        .with_writer(writer)
        .with_max_level(log_filter(&a.log_level))
        .with_target(false);
    if a.log_format == "json" {
        builder.json().flatten_event(true).init();
    } else {
        builder.with_ansi(terminal).init();
    }
    Ok(())
}

fn main() -> Result<()> {
    let (cli, ignored) = parse_args();
    let args = match cli.command {
        Some(Cmd::Serve(a)) => *a,
        Some(Cmd::Bench(b)) => return bench(b),
        Some(Cmd::Wal(w)) => return wal_cmd::run(w),
        Some(Cmd::Snapshot(c)) => return snapshot_cmd::run(c),
        None => cli.serve,
    };
    init_logging(&args)?;
    for var in ignored {
        tracing::warn!("unrecognized environment variable {var}, ignored");
    }
    let threads = args.client_threads;
    let cfg = serve_config(args)?;
    let rt = server_runtime(threads)?;
    rt.block_on(check_listeners(&cfg))?;
    let new_dir = cli::NewDataDir::before_start(&cfg.engine.data_dir);
    let served = rt.block_on(cairn::serve(cfg, shutdown_signal()));
    if let Err(e) = served {
        new_dir.remove_after_failed_open(&e);
        // One log line for the stop (a fail-stop's cause), in the log's format, not anyhow's.
        tracing::error!("{e:#}");
        std::process::exit(1);
    }
    Ok(())
}

/// The server's runtime. Each gRPC stream runs as its own task, and a finishing stream wakes its
/// connection's task; tokio's LIFO slot runs that task next, so the connection writes one
/// response per syscall. Without the slot the connection task runs after the other ready
/// streams and writes their responses together: fewer syscalls on both ends of the socket
/// (R-s +4%, W2 +5% in alternating runs, 2026-11-22). The option needs `--cfg tokio_unstable`,
/// which `.cargo/config.toml` sets; without it the runtime is tokio's default.
///
/// By default it runs on half the cores. The Raft driver and the store's committer are threads
/// of their own, and a server usually shares its host (with the API server it backs, or with a
/// load generator). On 2 cores, 1 worker instead of 2 cut the server's CPU per request by a
/// fifth (range 9.5 -> 7.3 us, put 18 -> 16 us, 100 clients) at equal throughput, and raised
/// one-client put throughput by about 8%: less cross-thread waking and stealing.
fn server_runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let threads = if threads > 0 {
        threads
    } else {
        std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(threads).enable_all();
    #[cfg(tokio_unstable)]
    builder.disable_lifo_slot();
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine configuration a command line (after the program's name) comes to, with
    /// settings from `yaml` as a configuration file's.
    fn engine(args: &[&str], yaml: Option<&str>) -> EngineConfig {
        use clap::CommandFactory;
        let mut argv: Vec<std::ffi::OsString> = vec!["cairn".into()];
        argv.extend(args.iter().map(Into::into));
        // One file per call: the tests run in parallel in one process, so a name from the pid
        // alone let one test remove the file another had just written.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("cairn-flags-{}-{call}.yaml", std::process::id());
        let file = yaml.map(|yaml| {
            let file = std::env::temp_dir().join(name);
            std::fs::write(&file, yaml).expect("write the file");
            argv.push(format!("--config-file={}", file.display()).into());
            file
        });
        let known = known_flags(&Cli::command());
        let expanded = config_file::expand(argv, [], &known, cli::ETCD_FLAGS).expect("expands");
        if let Some(file) = file {
            let _ = std::fs::remove_file(file);
        }
        let cli: Cli = cli::parse_from(expanded.args).expect("parses");
        serve_config(cli.serve).expect("a configuration").engine
    }

    #[test]
    fn the_spin_wait_is_the_flag_s_or_follows_the_cpu_quota() {
        use std::time::Duration;
        let spin = |args: &[&str]| engine(args, None).spin_wait;
        assert_eq!(spin(&["--spin-wait", "0"]), Duration::ZERO);
        assert_eq!(spin(&["--spin-wait", "2ms"]), Duration::from_millis(2));
        assert_eq!(spin(&[]), Duration::from_micros(if cpu_quota::limited() { 0 } else { 500 }));
    }

    #[test]
    fn the_catch_up_margin_is_read_under_etcds_names_with_its_meaning_of_zero() {
        let margin = |args: &[&str], yaml| engine(args, yaml).snapshot_catchup_entries;
        assert_eq!(margin(&[], None), 5_000, "etcd's default");
        assert_eq!(margin(&["--snapshot-catchup-entries", "100"], None), 100, "etcd 3.6");
        let old = ["--experimental-snapshot-catchup-entries=200"];
        assert_eq!(margin(&old, None), 200, "etcd 3.5, and 3.6's deprecated name");
        assert_eq!(margin(&["--snapshot-catchup-entries", "0"], None), 5_000, "0: the default");
        // Configuration files: 3.5's key (its field's JSON name), and 3.6's.
        assert_eq!(margin(&[], Some("experimental-snapshot-catch-up-entries: 300\n")), 300);
        assert_eq!(margin(&[], Some("snapshot-catchup-entries: 400\n")), 400);
    }

    #[test]
    fn the_hold_s_byte_bound_is_a_flag_with_the_engine_s_default() {
        let bound = |args: &[&str]| engine(args, None).snapshot_catchup_max_bytes;
        assert_eq!(bound(&[]), cairn_node::DEFAULT_SNAPSHOT_CATCHUP_MAX_BYTES);
        assert_eq!(bound(&["--snapshot-catchup-max-bytes", "2147483648"]), 2 << 30);
        assert_eq!(bound(&["--snapshot-catchup-max-bytes=0"]), 0, "0: the log holds nothing more");
    }
}
