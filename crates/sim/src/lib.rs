//! A deterministic simulator for cairn's replicas.
//!
//! It runs the node crate's real [`cairn_node::Replica`] — the Raft core, the write-ahead log,
//! the kv store and the waiters that answer clients — for several members on one thread from one
//! seed, over a simulated network (loss, duplication, reordering, partitions), a simulated disk
//! per member (unsynced writes lost or torn on a crash, injected IO failures), an in-memory
//! store backend that loses what LMDB may lose, and a simulated clock with drift. Simulated
//! clients issue etcd KV and lease operations. After every step it checks the Raft paper's
//! safety properties, and that no lease is revoked as expired before the TTL last promised to a
//! client; at the end it heals everything, requires liveness and convergence (same revision,
//! kv hash and leases everywhere, every expired lease revoked), and checks the whole client
//! history for linearizability against the kv model. A failing seed replays exactly with `cargo run -p cairn-sim --release -- --seed S`
//! and the same options.

pub mod backend;
pub mod checker;
mod clients;
mod faults;
pub mod history;
pub mod leases;
mod liveness;
pub mod member;
pub mod network;
pub mod rng;
pub mod workload;
pub mod world;

use std::panic::{catch_unwind, AssertUnwindSafe};

use cairn_node::ReplicaBug;
use cairn_raft::ReadMode;

/// What one run simulates.
#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    /// Founding voters (3 or 5).
    pub voters: usize,
    /// Extra members, outside the configuration at first, that membership changes may add.
    pub spares: usize,
    pub read_mode: ReadMode,
    pub membership: bool,
    /// Members publish their attributes through the log (etcd's publish), with client URLs
    /// that change on every other restart, and convergence requires every member's published.
    pub publish: bool,
    /// Length of the fault phase, in ticks of the nominal clock.
    pub fault_ticks: u64,
    /// How long, after faults stop, a leader has to commit and every member to converge.
    pub liveness_ticks: u64,
    /// The stack mix: a small key space worked with every KV operation, compactions and
    /// historical reads, and power loss of the whole cluster. Otherwise the core mix: unique
    /// puts and reads, which is what the consensus checks need, at higher fault rates.
    pub stack: bool,
    /// Simulated clients, each with one operation in flight at most.
    pub clients: usize,
    /// Chance per time unit that an idle client starts an operation.
    pub client_rate: f64,
    pub bug: Option<cairn_raft::PlantedBug>,
    pub replica_bug: Option<ReplicaBug>,
    /// Byte limit of one Append; small values send entries one by one, which opens the windows
    /// where an old-term entry reaches a majority before the new leader's own entry does.
    pub max_msg_bytes: u64,
    /// Multiplies the rate of crashes, partitions and disk failures.
    pub chaos: f64,
    /// Chance per time unit that every member loses power at once.
    pub power_loss_rate: f64,
    /// Applied entries between log compactions (small, so lagging members need snapshots).
    pub snapshot_entries: u64,
    /// Entries kept behind every compaction (etcd's `SnapshotCatchUpEntries`): 0 or a few,
    /// by seed, so that runs compact right up to what was applied and runs keep a margin.
    pub snapshot_catchup_entries: u64,
    /// Entries a leader keeps at most for followers catching up: 0 (none) or a few
    /// compactions' worth, by seed, so that both the hold and its bound are worked.
    pub snapshot_catchup_max: u64,
    /// Members write their log asynchronously (`async_storage_writes`): syncs complete at
    /// moments the simulator picks, and a crash before one loses what it would have covered.
    pub async_writes: bool,
    /// Chance per time unit that a member's pending log sync completes.
    pub sync_rate: f64,
    /// Print every delivery and state change (for replaying one seed).
    pub trace: bool,
}

impl Options {
    /// The core mix for a seed: 3 or 5 voters and lease or ReadIndex reads, chosen by the seed
    /// so that a range of seeds covers every combination.
    pub fn for_seed(seed: u64) -> Options {
        Options {
            seed,
            voters: if seed.is_multiple_of(2) { 3 } else { 5 },
            spares: 2,
            read_mode: if seed.is_multiple_of(3) { ReadMode::Lease } else { ReadMode::Safe },
            membership: true,
            publish: true,
            fault_ticks: 600,
            liveness_ticks: 200,
            stack: false,
            clients: 10,
            client_rate: 0.01,
            bug: None,
            replica_bug: None,
            max_msg_bytes: 256,
            chaos: 1.0,
            power_loss_rate: 0.0,
            snapshot_entries: 20 + seed % 41,
            snapshot_catchup_entries: if (seed / 2).is_multiple_of(2) { 0 } else { 1 + seed % 13 },
            snapshot_catchup_max: if (seed / 4).is_multiple_of(2) { 0 } else { 20 + seed % 61 },
            // As servers run, on three seeds in four.
            async_writes: seed % 4 != 3,
            sync_rate: 0.05,
            trace: false,
        }
    }

    /// The stack mix for a seed.
    pub fn stack_for_seed(seed: u64) -> Options {
        Options {
            stack: true,
            clients: 5,
            client_rate: 0.02,
            power_loss_rate: 0.0001,
            ..Options::for_seed(seed)
        }
    }
}

/// Counters of what a run exercised, so a green run can be seen to have done something.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub proposals: u64,
    pub acked: u64,
    pub reads: u64,
    pub elections: u64,
    pub crashes: u64,
    pub restarts: u64,
    pub partitions: u64,
    pub conf_changes: u64,
    pub transfers: u64,
    pub compactions: u64,
    pub snapshots_installed: u64,
    /// Snapshot transfers cut partway, and transfers resumed from a cut one's chunks.
    pub snapshots_cut: u64,
    pub snapshots_resumed: u64,
    pub power_losses: u64,
    pub disk_faults: u64,
    pub messages: u64,
    /// What the lease checker judged.
    pub leases: leases::LeaseStats,
    /// What the history checker judged.
    pub kv: history::HistoryStats,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.proposals += o.proposals;
        self.acked += o.acked;
        self.reads += o.reads;
        self.elections += o.elections;
        self.crashes += o.crashes;
        self.restarts += o.restarts;
        self.partitions += o.partitions;
        self.conf_changes += o.conf_changes;
        self.transfers += o.transfers;
        self.compactions += o.compactions;
        self.snapshots_installed += o.snapshots_installed;
        self.snapshots_cut += o.snapshots_cut;
        self.snapshots_resumed += o.snapshots_resumed;
        self.power_losses += o.power_losses;
        self.disk_faults += o.disk_faults;
        self.messages += o.messages;
        self.leases.acks += o.leases.acks;
        self.leases.expiries_checked += o.leases.expiries_checked;
        self.kv.add(&o.kv);
    }
}

/// A failed run: the seed, the simulated time, and what went wrong.
#[derive(Clone, Debug)]
pub struct Failure {
    pub seed: u64,
    pub time: u64,
    pub what: String,
}

thread_local! {
    /// The simulated time of the run on this thread, so a panic can say when it struck.
    pub(crate) static NOW: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Runs one seed. A panic inside the core (a failed invariant assertion) is a failure too.
pub fn run(opts: Options) -> Result<Stats, Failure> {
    let seed = opts.seed;
    NOW.with(|n| n.set(0));
    let run = || world::World::new(opts).map_err(|v| (0, v)).and_then(|w| w.run());
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(Ok(stats)) => Ok(stats),
        Ok(Err((time, v))) => Err(Failure { seed, time, what: v.0 }),
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".to_string());
            let time = NOW.with(|n| n.get());
            Err(Failure { seed, time, what: format!("panic: {what}") })
        }
    }
}

/// Runs many seeds on `threads` threads; returns the totals and every failure, by seed.
pub fn run_many(
    seeds: std::ops::RangeInclusive<u64>,
    threads: usize,
    make: impl Fn(u64) -> Options + Sync,
) -> (Stats, Vec<Failure>) {
    let next = std::sync::atomic::AtomicU64::new(*seeds.start());
    let end = *seeds.end();
    let results = std::sync::Mutex::new((Stats::default(), Vec::new()));
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if seed > end {
                    return;
                }
                let outcome = run(make(seed));
                let mut r = results.lock().unwrap_or_else(|e| e.into_inner());
                match outcome {
                    Ok(stats) => r.0.add(&stats),
                    Err(f) => r.1.push(f),
                }
            });
        }
    });
    let (stats, mut failures) = results.into_inner().unwrap_or_else(|e| e.into_inner());
    failures.sort_by_key(|f| f.seed);
    (stats, failures)
}
