//! `/metrics`: the member's numbers in the Prometheus text format, under etcd's names where the
//! meaning is the same (so etcd's Grafana dashboards and alerts work unchanged), and cairn's own
//! under `cairn_`.
//!
//! Nothing is computed per request for this: the engine keeps atomics where its numbers arise
//! (`cairn_node::metrics`), the gRPC layer counts calls in a static table of etcd's methods
//! (`grpc.rs`), and a scrape reads them all and encodes them with `prometheus-client`.

mod grpc;
mod process;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use cairn_node::metrics::{EngineMetrics, HistogramSnapshot};
use cairn_node::Engine;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

pub(crate) use grpc::{Counted, GrpcCall, MethodStats, GRPC};

/// The OpenMetrics content type `prometheus-client` encodes (Prometheus scrapes it natively).
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// cairn's own numbers from the serving side: watch streams and their events.
#[derive(Debug, Default)]
pub(crate) struct WatchStats {
    /// Watch streams open.
    pub streams: AtomicI64,
    /// Watchers open on them.
    pub watchers: AtomicI64,
    /// Events sent to watchers.
    pub events_sent: AtomicU64,
}

/// Counted for every server in the process, as etcd's metrics are (Prometheus' default
/// registry is process-wide there too).
pub(crate) static WATCH: WatchStats = WatchStats {
    streams: AtomicI64::new(0),
    watchers: AtomicI64::new(0),
    events_sent: AtomicU64::new(0),
};

impl WatchStats {
    pub(crate) fn add(v: &AtomicI64, n: i64) {
        v.fetch_add(n, Ordering::Relaxed);
    }
}

/// The registry a scrape encodes: one collector that reads everything at scrape time.
pub(crate) fn registry(engine: Arc<Engine>) -> Arc<Registry> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape { engine }));
    Arc::new(registry)
}

/// A scrape's body.
pub(crate) fn encode(registry: &Registry) -> String {
    let mut out = String::with_capacity(64 << 10);
    // Only fails when writing to the String fails, which it does not.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

#[derive(Debug)]
struct Scrape {
    engine: Arc<Engine>,
}

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        server(&self.engine, &mut enc)?;
        identity(&self.engine, &mut enc)?;
        disk_and_store(&self.engine, &mut enc)?;
        network(&self.engine, &mut enc)?;
        health(&mut enc)?;
        grpc::encode(&mut enc)?;
        cairn(&self.engine, &mut enc)?;
        process::encode(&mut enc)
    }
}

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    ConstGauge::new(v).encode(enc.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// A counter; `name` without the `_total` the encoding appends.
fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    ConstCounter::new(v).encode(enc.encode_descriptor(name, help, None, MetricType::Counter)?)
}

fn counter_f64(enc: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    ConstCounter::new(v).encode(enc.encode_descriptor(name, help, None, MetricType::Counter)?)
}

/// A gauge of 1 whose one label carries the value (etcd's `etcd_server_id` and versions).
fn info(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: (&str, &str),
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(1).encode(m.encode_family(&[label])?)
}

fn histogram(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    h: &HistogramSnapshot,
) -> std::fmt::Result {
    let m: MetricEncoder = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    encode_histogram(m, h)
}

/// One histogram's series, on `m` as it is (one without labels, or a family's member).
fn encode_histogram(mut m: MetricEncoder, h: &HistogramSnapshot) -> std::fmt::Result {
    // The encoder adds the buckets up, and writes a bound of f64::MAX as `+Inf`.
    let buckets: Vec<(f64, u64)> = h
        .buckets
        .iter()
        .map(|(bound, n)| (if bound.is_finite() { *bound } else { f64::MAX }, *n))
        .collect();
    m.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
        h.sum_seconds,
        h.count,
        &buckets,
        None,
    )
}

/// etcd's `etcd_server_*`.
fn server(engine: &Engine, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    let m = engine.metrics();
    let (_, member) = engine.identity();
    let leader = engine.leader();
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    gauge(
        enc,
        "etcd_server_has_leader",
        "Whether or not a leader exists. 1 is existence, 0 is not.",
        flag(leader.is_some()),
    )?;
    gauge(
        enc,
        "etcd_server_is_leader",
        "Whether or not this member is a leader. 1 if is, 0 otherwise.",
        flag(leader == Some(member)),
    )?;
    counter(
        enc,
        "etcd_server_leader_changes_seen",
        "The number of leader changes seen.",
        EngineMetrics::get(&m.leader_changes),
    )?;
    // Gauges in etcd, despite the suffix.
    gauge(
        enc,
        "etcd_server_proposals_committed_total",
        "The total number of consensus proposals committed.",
        EngineMetrics::get(&m.committed_index) as f64,
    )?;
    gauge(
        enc,
        "etcd_server_proposals_applied_total",
        "The total number of consensus proposals applied.",
        EngineMetrics::get(&m.applied_index) as f64,
    )?;
    gauge(
        enc,
        "etcd_server_proposals_pending",
        "The current number of pending proposals to commit.",
        EngineMetrics::get(&m.proposals_pending) as f64,
    )?;
    counter(
        enc,
        "etcd_server_proposals_failed",
        "The total number of failed proposals seen.",
        EngineMetrics::get(&m.proposals_failed),
    )
}

/// etcd's `etcd_server_*` that describe the member rather than its work.
fn identity(engine: &Engine, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    let (_, member) = engine.identity();
    let quota = engine.config().quota_backend_bytes.unwrap_or(0);
    gauge(
        enc,
        "etcd_server_quota_backend_bytes",
        "Current backend storage quota size in bytes.",
        quota as f64,
    )?;
    let id = format!("{member:x}");
    info(
        enc,
        "etcd_server_id",
        "Server or member ID in hexadecimal format. 1 for 'server_id' label with current ID.",
        ("server_id", &id),
    )?;
    let v = crate::services::ETCD_COMPATIBLE_VERSION;
    info(
        enc,
        "etcd_server_version",
        "Which version is running. 1 for 'server_version' label with current version.",
        ("server_version", v),
    )?;
    let cluster = v.rsplit_once('.').map_or(v, |(mm, _)| mm);
    info(
        enc,
        "etcd_cluster_version",
        "Which version is running. 1 for 'cluster_version' label with current cluster version",
        ("cluster_version", cluster),
    )
}

/// etcd's `etcd_disk_*`, `etcd_mvcc_*` and `etcd_debugging_mvcc_*` that cairn has.
fn disk_and_store(engine: &Engine, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    let m = engine.metrics();
    histogram(
        enc,
        "etcd_disk_wal_fsync_duration_seconds",
        "The latency distributions of fsync called by WAL.",
        &m.wal_fsync.snapshot(),
    )?;
    histogram(
        enc,
        "etcd_disk_backend_commit_duration_seconds",
        "The latency distributions of commit called by backend.",
        &m.backend_commit.snapshot(),
    )?;
    let s = engine.status();
    gauge(
        enc,
        "etcd_mvcc_db_total_size_in_bytes",
        "Total size of the underlying database physically allocated in bytes.",
        s.db_size_bytes as f64,
    )?;
    // etcd 3.5 still exports the older name, which older dashboards plot.
    gauge(
        enc,
        "etcd_debugging_mvcc_db_total_size_in_bytes",
        "Total size of the underlying database physically allocated in bytes.",
        s.db_size_bytes as f64,
    )?;
    gauge(
        enc,
        "etcd_mvcc_db_total_size_in_use_in_bytes",
        "Total size of the underlying database logically in use in bytes.",
        s.db_size_in_use_bytes as f64,
    )?;
    gauge(enc, "etcd_debugging_mvcc_keys_total", "Total number of keys.", s.key_count as f64)?;
    gauge(
        enc,
        "etcd_debugging_mvcc_current_revision",
        "The current revision of store.",
        s.revision.0 as f64,
    )?;
    gauge(
        enc,
        "etcd_debugging_mvcc_compact_revision",
        "The revision of the last compaction in store.",
        s.compact_revision.0.max(0) as f64,
    )?;
    gauge(
        enc,
        "etcd_debugging_mvcc_watch_stream_total",
        "Total number of watch streams.",
        WATCH.streams.load(Ordering::Relaxed) as f64,
    )?;
    gauge(
        enc,
        "etcd_debugging_mvcc_watcher_total",
        "Total number of watchers.",
        WATCH.watchers.load(Ordering::Relaxed) as f64,
    )
}

/// etcd's `etcd_network_peer_*_bytes_total` and `_round_trip_time_seconds`, by peer id in hex.
fn network(engine: &Engine, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    let help = "Round-Trip-Time histogram between peers";
    let name = "etcd_network_peer_round_trip_time_seconds";
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (id, h) in engine.metrics().peers.round_trips() {
        let to = format!("{:x}", id.0);
        encode_histogram(m.encode_family(&[("To", to.as_str())])?, &h)?;
    }
    let totals = engine.metrics().peers.totals();
    let ids: Vec<String> = totals.iter().map(|(id, _, _)| format!("{:x}", id.0)).collect();
    let help = "The total number of bytes sent to peers.";
    let mut m =
        enc.encode_descriptor("etcd_network_peer_sent_bytes", help, None, MetricType::Counter)?;
    for (id, (_, sent, _)) in ids.iter().zip(&totals) {
        ConstCounter::new(*sent).encode(m.encode_family(&[("To", id.as_str())])?)?;
    }
    let help = "The total number of bytes received from peers.";
    let name = "etcd_network_peer_received_bytes";
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (id, (_, _, received)) in ids.iter().zip(&totals) {
        ConstCounter::new(*received).encode(m.encode_family(&[("From", id.as_str())])?)?;
    }
    Ok(())
}

/// cairn's own, for what etcd has no name for.
/// etcd's `/health` counts. etcd's names have no `_total` (Go's client adds none), and a
/// counter here would get one: they go out untyped under etcd's exact names.
fn health(enc: &mut DescriptorEncoder) -> std::fmt::Result {
    use crate::http::health::{HEALTH_FAILURES, HEALTH_SUCCESS};
    for (name, help, v) in [
        (
            "etcd_server_health_success",
            "The total number of successful health checks",
            &HEALTH_SUCCESS,
        ),
        (
            "etcd_server_health_failures",
            "The total number of failed health checks",
            &HEALTH_FAILURES,
        ),
    ] {
        let m = enc.encode_descriptor(name, help, None, MetricType::Unknown)?;
        ConstGauge::new(v.load(Ordering::Relaxed) as f64).encode(m)?;
    }
    Ok(())
}

fn cairn(engine: &Engine, enc: &mut DescriptorEncoder) -> std::fmt::Result {
    let m = engine.metrics();
    counter(
        enc,
        "cairn_watch_events_sent",
        "Events sent to watchers.",
        WATCH.events_sent.load(Ordering::Relaxed),
    )?;
    gauge(
        enc,
        "cairn_leases",
        "Leases granted and not yet revoked or expired.",
        engine.lease_count() as f64,
    )?;
    counter(
        enc,
        "cairn_raft_log_compactions",
        "Compactions of the Raft log.",
        EngineMetrics::get(&m.log_compactions),
    )?;
    counter(
        enc,
        "cairn_snapshots_sent",
        "Snapshots sent to followers.",
        EngineMetrics::get(&m.snapshots_sent),
    )?;
    counter(
        enc,
        "cairn_snapshots_installed",
        "Snapshots from a leader installed here.",
        EngineMetrics::get(&m.snapshots_installed),
    )?;
    gauge(enc, "cairn_raft_term", "The Raft term this member is in.", engine.raft_term() as f64)
}
