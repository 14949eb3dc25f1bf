//! `cairn-sim`: run the deterministic Raft simulator over many seeds, or replay one.
//!
//! ```text
//! cairn-sim --seeds 1..1000            run seeds 1 to 1000 (3 and 5 voters, both read modes)
//! cairn-sim --seed 42                  replay one seed
//! cairn-sim --seeds 1..200 --voters 5  force the cluster size
//! cairn-sim --seeds 1..200 --lease     force lease reads (--safe for ReadIndex)
//! cairn-sim --bug commit-previous-term plant a bug to see the checkers catch it
//! ```

use std::process::ExitCode;

use cairn_raft::{PlantedBug, ReadMode};
use cairn_sim::{run_many, Options};

struct Args {
    seeds: std::ops::RangeInclusive<u64>,
    voters: Option<usize>,
    read_mode: Option<ReadMode>,
    membership: bool,
    fault_ticks: Option<u64>,
    bug: Option<PlantedBug>,
    threads: usize,
    trace: bool,
    chaos: Option<f64>,
    max_msg_bytes: Option<u64>,
    extra: Vec<String>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        seeds: 1..=100,
        voters: None,
        read_mode: None,
        membership: true,
        fault_ticks: None,
        bug: None,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        trace: false,
        chaos: None,
        max_msg_bytes: None,
        extra: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--seeds" => {
                let v = value()?;
                let (lo, hi) = v.split_once("..").ok_or("--seeds takes LO..HI")?;
                let lo = lo.parse().map_err(|_| "bad --seeds start")?;
                let hi = hi.trim_start_matches('=').parse().map_err(|_| "bad --seeds end")?;
                a.seeds = lo..=hi;
            }
            "--seed" => {
                let s: u64 = value()?.parse().map_err(|_| "bad --seed")?;
                a.seeds = s..=s;
            }
            "--voters" => {
                let v = value()?;
                a.voters = Some(v.parse().map_err(|_| "bad --voters")?);
                a.extra.push(format!("--voters {v}"));
            }
            "--lease" | "--safe" => {
                a.read_mode =
                    Some(if flag == "--lease" { ReadMode::Lease } else { ReadMode::Safe });
                a.extra.push(flag.clone());
            }
            "--no-membership" => {
                a.membership = false;
                a.extra.push(flag.clone());
            }
            "--fault-ticks" => {
                let v = value()?;
                a.fault_ticks = Some(v.parse().map_err(|_| "bad --fault-ticks")?);
                a.extra.push(format!("--fault-ticks {v}"));
            }
            "--trace" => a.trace = true,
            "--chaos" => {
                let v = value()?;
                a.chaos = Some(v.parse().map_err(|_| "bad --chaos")?);
                a.extra.push(format!("--chaos {v}"));
            }
            "--max-msg-bytes" => {
                let v = value()?;
                a.max_msg_bytes = Some(v.parse().map_err(|_| "bad --max-msg-bytes")?);
                a.extra.push(format!("--max-msg-bytes {v}"));
            }
            "--threads" => a.threads = value()?.parse().map_err(|_| "bad --threads")?,
            "--bug" => {
                let v = value()?;
                a.bug = Some(match v.as_str() {
                    "commit-previous-term" => PlantedBug::CommitPreviousTerm,
                    "vote-ignores-log" => PlantedBug::VoteIgnoresLog,
                    "read-skips-quorum" => PlantedBug::ReadSkipsQuorum,
                    _ => return Err(format!("unknown bug {v}")),
                });
                a.extra.push(format!("--bug {v}"));
            }
            "-h" | "--help" => {
                println!(
                    "{}",
                    include_str!("main.rs")
                        .lines()
                        .take_while(|l| l.starts_with("//!"))
                        .map(|l| l.trim_start_matches("//!").trim_start_matches(' '))
                        .collect::<Vec<_>>()
                        .join("\n")
                );
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
        let mut o = Options::for_seed(seed);
        o.voters = args.voters.unwrap_or(o.voters);
        o.read_mode = args.read_mode.unwrap_or(o.read_mode);
        o.membership = args.membership;
        o.fault_ticks = args.fault_ticks.unwrap_or(o.fault_ticks);
        o.bug = args.bug;
        o.trace = args.trace;
        o.chaos = args.chaos.unwrap_or(o.chaos);
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
        "cairn-sim: {count} seeds in {:.1}s: {} elections, {} proposals ({} acknowledged), {} reads checked, {} crashes, {} partitions, {} membership changes, {} transfers, {} compactions, {} messages",
        started.elapsed().as_secs_f64(),
        stats.elections, stats.proposals, stats.acked, stats.reads, stats.crashes, stats.partitions,
        stats.conf_changes, stats.transfers, stats.compactions, stats.messages
    );
    println!("{} passed, {} failed", count - failures.len() as u64, failures.len());
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
