//! The floor of a 1-client replicated put on this machine, measured end to end.
//!
//! One client, one leader and `members - 1` followers, each a thread of its own, talk over
//! loopback TCP. Every member appends the request's record to a log file of its own (64 MiB
//! preallocated sparse, as cairn's WAL segments) and fdatasyncs it; the leader sends the record
//! to every follower before its own write, and answers once its own copy and enough followers'
//! make a quorum. Nothing else runs: no encoding, no consensus state, no store. What is left is
//! the machine's share of a put: the client's and the peers' round trips (with the wakeups they
//! cost on these cores) and a quorum of fdatasyncs on this one disk.
//!
//! Summing separately measured parts (a TCP ping-pong, a quorum of concurrent fdatasyncs) gives
//! a looser bound: the parts overlap in a real round, and each part measured alone pays its own
//! thread start-up. `scripts/compare.py` reports this floor beside the 1-client put rows.
//!
//!     cargo run --release -p cairn-bench --example replicated_floor -- [MEMBERS] [TOTAL] [DIR]
//!
//! Prints one JSON object: members, total, ops (per second), p50_us, p90_us, p99_us.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A put's record: a 256-byte value with its key and framing.
const RECORD: usize = 300;
/// The answer the client waits for.
const ANSWER: usize = 64;
const ACK: usize = 8;
const SEGMENT: u64 = 64 << 20;

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let members: usize = args.first().map_or(Ok(3), |s| s.parse()).expect("MEMBERS: a number");
    let total: usize = args.get(1).map_or(Ok(3000), |s| s.parse()).expect("TOTAL: a number");
    let dir = args.get(2).map_or_else(std::env::temp_dir, PathBuf::from);
    assert!(members >= 1 && total > 0, "MEMBERS must be at least 1 and TOTAL above 0");
    let dir = dir.join(format!("replicated-floor-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = measure(members, total, &dir);
    std::fs::remove_dir_all(&dir)?;
    let (mut lat, elapsed) = result?;
    lat.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)].round();
    println!(
        "{{\"members\": {members}, \"total\": {total}, \"ops\": {:.0}, \"p50_us\": {}, \"p90_us\": {}, \"p99_us\": {}}}",
        total as f64 / elapsed,
        at(0.5),
        at(0.9),
        at(0.99)
    );
    Ok(())
}

/// Runs the client's `total` puts against a leader and its followers; returns each put's
/// latency in microseconds and the seconds they took together.
fn measure(members: usize, total: usize, dir: &Path) -> std::io::Result<(Vec<f64>, f64)> {
    let mut followers = Vec::new();
    let mut threads = Vec::new();
    for i in 1..members {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        followers.push(listener.local_addr()?);
        let log = open_log(&dir.join(format!("follower-{i}.log")))?;
        threads.push(std::thread::spawn(move || follow(listener, log)));
    }
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let leader_addr = listener.local_addr()?;
    let log = open_log(&dir.join("leader.log"))?;
    let peers = followers.iter().map(connect).collect::<std::io::Result<Vec<_>>>()?;
    threads.push(std::thread::spawn(move || lead(listener, log, peers, members)));
    let mut client = connect(&leader_addr)?;
    let mut record = [b'x'; RECORD];
    let mut lat = Vec::with_capacity(total);
    let began = Instant::now();
    for _ in 0..total {
        let start = Instant::now();
        client.write_all(&record)?;
        client.read_exact(&mut record[..ANSWER])?;
        lat.push(start.elapsed().as_secs_f64() * 1e6);
    }
    let elapsed = began.elapsed().as_secs_f64();
    // Closing the client ends the leader, whose closed connections end the followers.
    drop(client);
    for t in threads {
        t.join().expect("a member thread panicked")?;
    }
    Ok((lat, elapsed))
}

fn connect(addr: &std::net::SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    Ok(s)
}

fn open_log(path: &Path) -> std::io::Result<File> {
    let f = OpenOptions::new().create(true).truncate(true).write(true).open(path)?;
    f.set_len(SEGMENT)?;
    Ok(f)
}

fn persist(log: &mut File, record: &[u8]) -> std::io::Result<()> {
    log.write_all(record)?;
    log.sync_data()
}

/// A follower: each record is made durable, then acknowledged.
fn follow(listener: TcpListener, mut log: File) -> std::io::Result<()> {
    let (mut leader, _) = listener.accept()?;
    leader.set_nodelay(true)?;
    let mut record = [0u8; RECORD];
    while leader.read_exact(&mut record).is_ok() {
        persist(&mut log, &record)?;
        leader.write_all(&[0; ACK])?;
    }
    Ok(())
}

/// The leader: sends each record to every follower, makes its own copy durable, and answers
/// once a quorum (itself included) has it. A follower's acknowledgements come in order, so one
/// that owes none has every record sent so far; a slower one's are read as they come.
fn lead(
    listener: TcpListener,
    mut log: File,
    mut peers: Vec<TcpStream>,
    members: usize,
) -> std::io::Result<()> {
    let (mut client, _) = listener.accept()?;
    client.set_nodelay(true)?;
    let quorum = members / 2 + 1;
    let mut owed = vec![0usize; peers.len()];
    let mut record = [0u8; RECORD];
    let mut ack = [0u8; ACK];
    for p in &peers {
        p.set_nonblocking(true)?;
    }
    while client.read_exact(&mut record).is_ok() {
        for (p, o) in peers.iter_mut().zip(&mut owed) {
            write_blocking(p, &record)?;
            *o += 1;
        }
        persist(&mut log, &record)?;
        // poll(2) on the followers that still owe an acknowledgement.
        while 1 + owed.iter().filter(|o| **o == 0).count() < quorum {
            wait_readable(&peers, &owed)?;
            for (p, o) in peers.iter_mut().zip(&mut owed) {
                while *o > 0 && read_ack(p, &mut ack)? {
                    *o -= 1;
                }
            }
        }
        client.write_all(&record[..ANSWER])?;
    }
    Ok(())
}

fn write_blocking(p: &mut TcpStream, buf: &[u8]) -> std::io::Result<()> {
    p.set_nonblocking(false)?;
    let r = p.write_all(buf);
    p.set_nonblocking(true)?;
    r
}

/// Reads one acknowledgement if a whole one is there (they are 8 bytes, sent whole).
fn read_ack(p: &mut TcpStream, ack: &mut [u8; ACK]) -> std::io::Result<bool> {
    match p.peek(ack) {
        Ok(n) if n >= ACK => p.read_exact(ack).map(|()| true),
        Ok(0) => Err(std::io::ErrorKind::UnexpectedEof.into()),
        Ok(_) => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
        Err(e) => Err(e),
    }
}

/// Sleeps until a follower that owes an acknowledgement has bytes to read.
fn wait_readable(peers: &[TcpStream], owed: &[usize]) -> std::io::Result<()> {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut fds: Vec<PollFd<'_>> = peers
        .iter()
        .zip(owed)
        .filter(|(_, o)| **o > 0)
        .map(|(p, _)| PollFd::new(p, PollFlags::IN))
        .collect();
    poll(&mut fds, None)?;
    Ok(())
}
