//! Command-line flags, named as in etcd's benchmark tool and d-engine's bench where they mean the
//! same thing.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    /// etcd v3 endpoints (repeatable or comma-separated), e.g. 127.0.0.1:2379.
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:2379", global = true)]
    pub endpoints: Vec<String>,
    /// gRPC connections to open (clients are spread over them).
    #[arg(long, default_value_t = 1, global = true)]
    pub conns: usize,
    /// Concurrent clients: each keeps one request in flight.
    #[arg(long, default_value_t = 1, global = true)]
    pub clients: usize,
    /// Requests to make in all.
    #[arg(long, default_value_t = 10_000, global = true)]
    pub total: u64,
    /// Key size in bytes: keys are key numbers in decimal, zero-padded to this size (their
    /// last digits when longer). The T4 presets use 64.
    #[arg(long, default_value_t = 8, global = true)]
    pub key_size: usize,
    /// Value size in bytes of each put (`--val-size` as in etcd's tool).
    #[arg(long, alias = "val-size", default_value_t = 256, global = true)]
    pub value_size: usize,
    /// Use keys 0, 1, 2, ... instead of random ones.
    #[arg(long, global = true)]
    pub sequential_keys: bool,
    /// Draw keys from this many distinct keys (hot keys); 0 means the whole key size.
    #[arg(long, default_value_t = 0, global = true)]
    pub key_space: u64,
    /// Find the leader with Maintenance.Status and send every request there.
    #[arg(long, global = true)]
    pub target_leader: bool,
    /// Limit to this many requests per second in all; 0 means no limit.
    #[arg(long, default_value_t = 0, global = true)]
    pub rate: u64,
    /// Print one machine-readable JSON record instead of the text summary (as `--output json`).
    #[arg(long, global = true, conflicts_with = "output")]
    pub json: bool,
    /// How to print the results: `text` (cairn's summary), `json` (one record), or `etcd`
    /// (the layout of etcd's `benchmark` tool, in seconds, for scripts written for it).
    #[arg(long, value_enum, default_value_t = Output::Text, global = true)]
    pub output: Output,
    /// With `--output etcd`: full floating-point precision, as etcd's `benchmark --precise`.
    #[arg(long, global = true)]
    pub precise: bool,
    /// Drive an embedded cairn engine in-process (no gRPC) with its data in this directory.
    #[arg(long, value_name = "DATA_DIR", global = true)]
    pub embedded: Option<PathBuf>,
    /// With --embedded: run this many engines in-process as one cluster over loopback peer
    /// connections (data in DATA_DIR/m0, m1, ...), client i using member i % N, so followers
    /// forward writes to the leader and confirm linearizable reads with it.
    #[arg(
        long,
        default_value_t = 1,
        value_parser = clap::value_parser!(u16).range(1..),
        requires = "embedded",
        global = true
    )]
    pub members: u16,
    /// Give up on one request after this many seconds.
    #[arg(long, default_value_t = 10, global = true)]
    pub timeout_secs: u64,
    /// The server's process id, when it runs on this machine: its VmRSS (from /proc) is sampled
    /// during the run and reported (start, peak, end).
    #[arg(long, global = true)]
    pub server_pid: Option<u32>,
    /// Before a KV workload, open this many idle watchers (each on a key nothing writes, 100
    /// per stream) and hold them for the run: what watchers that match nothing cost writes.
    #[arg(long, default_value_t = 0, global = true)]
    pub idle_watchers: usize,
    #[command(subcommand)]
    pub workload: Workload,
}

/// The layouts the results can be printed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// cairn's summary: throughput, latency percentiles in µs, the workload's counters.
    Text,
    /// One JSON record, every counter included.
    Json,
    /// etcd `benchmark`'s summary, histogram and percentile lines, in seconds.
    Etcd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Consistency {
    /// Linearizable.
    L,
    /// Serializable.
    S,
}

#[derive(Subcommand, Clone, Debug)]
pub enum Workload {
    /// Put random or sequential keys.
    Put,
    /// Read one key (or keys from --key-space).
    Range {
        /// The key to read; with --key-space, keys are drawn from the same space as puts.
        #[arg(default_value = "foo")]
        key: String,
        /// `l`: linearizable reads (confirmed with the leader); `s`: serializable reads (from
        /// the member's own store).
        #[arg(long, value_enum, default_value_t = Consistency::L)]
        consistency: Consistency,
    },
    /// A transaction with one put per request.
    TxnPut,
    /// Reads and writes over --key-space.
    Mixed {
        /// Fraction of requests that are reads.
        #[arg(long, default_value_t = 0.5)]
        read_ratio: f64,
    },
    /// Fan-out: N watchers on one prefix, one writer (sequential puts); counts events delivered
    /// and their rate.
    Watch {
        /// Watchers on the prefix; each must see every put.
        #[arg(long, default_value_t = 10)]
        watchers: usize,
        /// Watch streams the watchers share, spread over --conns; 0: one stream per watcher.
        #[arg(long, default_value_t = 0)]
        streams: usize,
    },
    /// One watcher, one writer: time from a put's acknowledgement to its event.
    WatchLatency,
    /// Idle watchers: opens N watchers on distinct keys, holds them, and (with --server-pid)
    /// reports the server's RSS growth per watcher.
    WatchIdle {
        /// Watchers to open, each on a key of its own.
        #[arg(long, default_value_t = 10_000)]
        watchers: usize,
        /// Watch streams the watchers share, spread over --conns.
        #[arg(long, default_value_t = 100)]
        streams: usize,
        /// Seconds to hold the watchers open before the RSS is read.
        #[arg(long, default_value_t = 3)]
        hold_secs: u64,
    },
    /// Each client grants a lease and sends keepalives on a stream.
    LeaseKeepalive,
    /// Each client grants a lease and revokes it; a grant and its revoke are one request.
    LeaseGrantRevoke,
    /// Preset: puts of sequential keys from 1 client, 64-byte keys.
    ///
    /// A row of the T4 report's matrix (see shared/design/benchmarks.md). It sets --clients 1,
    /// --key-size 64 and --sequential-keys, whatever they were given as; --total,
    /// --value-size, --conns and the rest apply.
    SeqPut,
    /// Preset: puts of random keys from 16 clients on at least 4 connections, 64-byte keys.
    ///
    /// A row of the T4 report's matrix. It sets --clients 16 and --key-size 64 whatever they
    /// were given as, and --conns to at least 4; --total, --value-size and the rest apply.
    ParPut,
    /// Preset: linearizable reads from 1 client, 64-byte keys from a key space of 1000.
    ///
    /// A row of the T4 report's matrix. It sets --clients 1 and --key-size 64 whatever they
    /// were given as, and --key-space 1000 unless given; the keys are written once first.
    SeqGet,
    /// Preset: linearizable reads from 16 clients, 64-byte keys from a key space of 1000.
    ///
    /// A row of the T4 report's matrix. It sets --clients 16 and --key-size 64 whatever they
    /// were given as, --conns to at least 4, and --key-space 1000 unless given; the keys are
    /// written once first.
    ParGet,
}

impl BenchArgs {
    /// The layout asked for: `--json` is `--output json`.
    pub fn output(&self) -> Output {
        if self.json {
            Output::Json
        } else {
            self.output
        }
    }
}

impl Workload {
    /// Each client keeps a request in flight on a stream of its own, many streams to a
    /// connection. With tokio's LIFO slot, each request wakes its connection's task at once,
    /// which writes it alone: one syscall per request, which cost the client half its CPU
    /// (lease keepalives, 100 streams on 10 connections). The tool runs such a workload with
    /// the slot off (`cairn bench`'s runtime), so each connection writes the requests of its
    /// streams together. Every client still waits for its answer before its next request.
    pub fn streams_requests(&self) -> bool {
        matches!(self, Workload::LeaseKeepalive)
    }

    pub fn name(&self) -> &'static str {
        match self {
            Workload::Put => "put",
            Workload::Range { consistency: Consistency::L, .. } => "range-l",
            Workload::Range { consistency: Consistency::S, .. } => "range-s",
            Workload::TxnPut => "txn-put",
            Workload::Mixed { .. } => "mixed",
            Workload::Watch { .. } => "watch",
            Workload::WatchLatency => "watch-latency",
            Workload::WatchIdle { .. } => "watch-idle",
            Workload::LeaseKeepalive => "lease-keepalive",
            Workload::LeaseGrantRevoke => "lease-grant-revoke",
            Workload::SeqPut => "seq-put",
            Workload::ParPut => "par-put",
            Workload::SeqGet => "seq-get",
            Workload::ParGet => "par-get",
        }
    }
}
