//! `cairn-sim`: run the deterministic simulator of cairn's replicas over many seeds, or replay one.
//!
//! ```text
//! cairn-sim --seeds 1..1000            run seeds 1 to 1000 (3 and 5 voters, both read modes)
//! cairn-sim --stack --seeds 1..300     the stack mix: every KV operation on a small key space,
//!                                      leases (grants, revokes, keepalives, TimeToLive, keys
//!                                      attached), compactions, historical reads, power loss of
//!                                      all members
//! cairn-sim --seed 42                  replay one seed (add --stack if it was a stack seed)
//! cairn-sim --seeds 1..200 --voters 5  force the cluster size
//! cairn-sim --seeds 1..200 --lease     force lease reads (--safe for ReadIndex)
//! cairn-sim --bug commit-previous-term plant a bug to see the checkers catch it: in the core
//!                                      (also vote-ignores-log, read-skips-quorum,
//!                                      count-unsynced-own-copy) or in the
//!                                      replica (ack-before-fsync, read-without-index,
//!                                      empty-snapshot, lease-expires-early,
//!                                      lease-never-expires)
//! cairn-sim --seed 42 --trace          print every delivery and state change
//!
//! Other flags: --chaos X (multiply crash, partition and disk fault rates), --max-msg-bytes B
//! (batch size of Appends), --fault-ticks N (length of the fault phase), --snapshot-entries N
//! (entries between log compactions), --snapshot-catchup-entries N (entries kept behind every
//! compaction), --snapshot-catchup-max N (entries a leader keeps at most for followers catching
//! up; 0: none), --no-membership, --no-publish (members do not publish their attributes),
//! --async-writes or --sync-writes (force how members sync their logs; by default three seeds in
//! four write asynchronously), --sync-rate P (chance per time unit that a pending log sync
//! completes; default 0.05), --threads N.
//! ```

use std::process::ExitCode;

use cairn_node::ReplicaBug;
use cairn_raft::{PlantedBug, ReadMode};
use cairn_sim::{run_many, Options};

struct Args {
    seeds: std::ops::RangeInclusive<u64>,
    voters: Option<usize>,
    read_mode: Option<ReadMode>,
    membership: bool,
    publish: bool,
    fault_ticks: Option<u64>,
    bug: Option<PlantedBug>,
    replica_bug: Option<ReplicaBug>,
    stack: bool,
    snapshot_entries: Option<u64>,
    snapshot_catchup_entries: Option<u64>,
    snapshot_catchup_max: Option<u64>,
    threads: usize,
    trace: bool,
    chaos: Option<f64>,
    async_writes: Option<bool>,
    sync_rate: Option<f64>,
    max_msg_bytes: Option<u64>,
    extra: Vec<String>,
}

/// A bug of the core or of the replica, by its command-line name.
fn parse_bug(name: &str) -> Result<(Option<PlantedBug>, Option<ReplicaBug>), String> {
    Ok(match name {
        "commit-previous-term" => (Some(PlantedBug::CommitPreviousTerm), None),
        "vote-ignores-log" => (Some(PlantedBug::VoteIgnoresLog), None),
        "read-skips-quorum" => (Some(PlantedBug::ReadSkipsQuorum), None),
        "count-unsynced-own-copy" => (Some(PlantedBug::CountUnsyncedOwnCopy), None),
        "ack-before-fsync" => (None, Some(ReplicaBug::AckBeforeFsync)),
        "read-without-index" => (None, Some(ReplicaBug::ReadWithoutIndex)),
        "empty-snapshot" => (None, Some(ReplicaBug::EmptySnapshot)),
        "lease-expires-early" => (None, Some(ReplicaBug::LeaseExpiresEarly)),
        "lease-never-expires" => (None, Some(ReplicaBug::LeaseNeverExpires)),
        _ => return Err(format!("unknown bug {name}")),
    })
}

/// Prints this file's header comment: the usage.
fn print_help() {
    let usage: Vec<&str> = include_str!("main.rs")
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| l.trim_start_matches("//!").trim_start_matches(' '))
        .filter(|l| !l.starts_with("```"))
        .collect();
    println!("{}", usage.join("\n"));
}

/// Flags that take no value.
const SWITCHES: &[&str] = &[
    "--lease",
    "--safe",
    "--no-membership",
    "--no-publish",
    "--trace",
    "--stack",
    "--async-writes",
    "--sync-writes",
    "-h",
    "--help",
];

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("bad value {v:?} for {flag}"))
}

fn parse_range(v: &str) -> Result<std::ops::RangeInclusive<u64>, String> {
    let (lo, hi) = v.split_once("..").ok_or("--seeds takes LO..HI")?;
    Ok(num("--seeds", lo)?..=num("--seeds", hi.trim_start_matches('='))?)
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        seeds: 1..=100,
        voters: None,
        read_mode: None,
        membership: true,
        publish: true,
        fault_ticks: None,
        bug: None,
        replica_bug: None,
        stack: false,
        snapshot_entries: None,
        snapshot_catchup_entries: None,
        snapshot_catchup_max: None,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        trace: false,
        chaos: None,
        async_writes: None,
        sync_rate: None,
        max_msg_bytes: None,
        extra: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = if SWITCHES.contains(&flag.as_str()) {
            String::new()
        } else {
            it.next().ok_or(format!("{flag} needs a value"))?
        };
        // Flags that shape the simulated run must be repeated to replay one of its seeds.
        if !matches!(flag.as_str(), "--seeds" | "--seed" | "--threads" | "--trace") {
            a.extra.push(format!("{flag} {v}").trim_end().to_string());
        }
        match flag.as_str() {
            "--seeds" => a.seeds = parse_range(&v)?,
            "--seed" => a.seeds = num(&flag, &v)?..=num(&flag, &v)?,
            "--voters" => a.voters = Some(num(&flag, &v)?),
            "--lease" => a.read_mode = Some(ReadMode::Lease),
            "--safe" => a.read_mode = Some(ReadMode::Safe),
            "--no-membership" => a.membership = false,
            "--no-publish" => a.publish = false,
            "--fault-ticks" => a.fault_ticks = Some(num(&flag, &v)?),
            "--trace" => a.trace = true,
            "--chaos" => a.chaos = Some(num(&flag, &v)?),
            "--sync-rate" => a.sync_rate = Some(num(&flag, &v)?),
            "--async-writes" => a.async_writes = Some(true),
            "--sync-writes" => a.async_writes = Some(false),
            "--max-msg-bytes" => a.max_msg_bytes = Some(num(&flag, &v)?),
            "--threads" => a.threads = num(&flag, &v)?,
            "--bug" => (a.bug, a.replica_bug) = parse_bug(&v)?,
            "--stack" => a.stack = true,
            "--snapshot-entries" => a.snapshot_entries = Some(num(&flag, &v)?),
            "--snapshot-catchup-entries" => a.snapshot_catchup_entries = Some(num(&flag, &v)?),
            "--snapshot-catchup-max" => a.snapshot_catchup_max = Some(num(&flag, &v)?),
            "-h" | "--help" => {
                print_help();
                std::process::exit(0);
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cairn-sim: {e} (see --help)");
            return ExitCode::from(2);
        }
    };
    let started = std::time::Instant::now();
    let count = args.seeds.end() - args.seeds.start() + 1;
    let (stats, failures) = run_many(args.seeds.clone(), args.threads, |seed| {
        let mut o =
            if args.stack { Options::stack_for_seed(seed) } else { Options::for_seed(seed) };
        o.voters = args.voters.unwrap_or(o.voters);
        o.read_mode = args.read_mode.unwrap_or(o.read_mode);
        o.membership = args.membership;
        o.publish = args.publish;
        o.fault_ticks = args.fault_ticks.unwrap_or(o.fault_ticks);
        o.bug = args.bug;
        o.replica_bug = args.replica_bug;
        o.snapshot_entries = args.snapshot_entries.unwrap_or(o.snapshot_entries);
        o.snapshot_catchup_entries =
            args.snapshot_catchup_entries.unwrap_or(o.snapshot_catchup_entries);
        o.snapshot_catchup_max = args.snapshot_catchup_max.unwrap_or(o.snapshot_catchup_max);
        o.trace = args.trace;
        o.chaos = args.chaos.unwrap_or(o.chaos);
        o.async_writes = args.async_writes.unwrap_or(o.async_writes);
        o.sync_rate = args.sync_rate.unwrap_or(o.sync_rate);
        o.max_msg_bytes = args.max_msg_bytes.unwrap_or(o.max_msg_bytes);
        o
    });
    let extra =
        if args.extra.is_empty() { String::new() } else { format!(" {}", args.extra.join(" ")) };
    for f in &failures {
        println!("FAIL seed {} at t={}: {}", f.seed, f.time, f.what);
        println!("  replay: cargo run -p cairn-sim --release -- --seed {}{extra}", f.seed);
    }
    println!(
        "cairn-sim: {count} seeds in {:.1}s: {} elections, {} writes ({} acknowledged), {} reads checked, {} crashes ({} power losses, {} disk faults), {} partitions, {} membership changes, {} transfers, {} compactions, {} snapshots installed ({} transfers cut at a chunk, {} resumed), {} messages; history: {}",
        started.elapsed().as_secs_f64(),
        stats.elections, stats.proposals, stats.acked, stats.reads, stats.crashes,
        stats.power_losses, stats.disk_faults, stats.partitions, stats.conf_changes,
        stats.transfers, stats.compactions, stats.snapshots_installed, stats.snapshots_cut,
        stats.snapshots_resumed, stats.messages, stats.kv
    );
    println!(
        "leases: {} acknowledgements to clients, {} expiries checked against them",
        stats.leases.acks, stats.leases.expiries_checked
    );
    println!("{} passed, {} failed", count - failures.len() as u64, failures.len());
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
