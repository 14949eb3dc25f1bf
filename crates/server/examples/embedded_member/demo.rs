//! `embedded_member --demo`: three copies of this program as child processes, one member each,
//! driven as a person would drive them in three terminals, over their standard input and
//! output. It checks what each prints: the members agree on a leader, a write on a follower is
//! forwarded and read on every member, the leader's process killed with SIGKILL is replaced by
//! a leader the survivors announce, and writes go on. Every child is stopped by its process id
//! (killed if it is still running when the demo ends), every wait is bounded, and the data
//! directories are removed.
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

use super::common::{self, BoxError};

/// How long one step may take: an election, a reply, a program's exit.
const STEP: Duration = Duration::from_secs(30);

/// One member's program, as the demo sees it.
struct Program {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    /// The last leadership it announced: its term, and who leads (`None` while electing).
    seen: Option<(u64, Option<String>)>,
    /// Its answers to commands, oldest first, not yet taken.
    replies: VecDeque<String>,
    /// Its standard output has ended.
    ended: bool,
}

/// The three programs, their output (one line at a time, from any of them), and their data.
struct Demo {
    programs: Vec<Program>,
    /// A program's index and an output line, or `None` when its output ended.
    lines: Receiver<(usize, Option<String>)>,
    sender: Sender<(usize, Option<String>)>,
    dir: PathBuf,
}

/// Runs the demonstration; any failure is an error (and a non-zero exit).
pub fn run() -> Result<(), BoxError> {
    let dir =
        std::env::temp_dir().join(format!("cairn-embedded-member-demo-{}", std::process::id()));
    let (sender, lines) = mpsc::channel();
    let mut demo = Demo { programs: Vec::new(), lines, sender, dir: dir.clone() };
    let started = Instant::now();
    let summary = demo.start().and_then(|()| demo.tour());
    // Kills what still runs, by process id, and removes the data, whatever happened.
    drop(demo);
    let summary = summary?;
    if dir.exists() {
        return Err(format!("{} is left behind", dir.display()).into());
    }
    println!("demo: {summary}; data removed, {:.1?} in all", started.elapsed());
    Ok(())
}

impl Demo {
    /// Starts three members on free loopback ports, each told the whole member list.
    fn start(&mut self) -> Result<(), BoxError> {
        let ports = common::free_ports(3)?;
        let list: Vec<String> =
            ports.iter().enumerate().map(|(i, p)| format!("m{i}=http://127.0.0.1:{p}")).collect();
        let list = list.join(",");
        let exe = std::env::current_exe()?;
        for (i, port) in ports.iter().enumerate() {
            let name = format!("m{i}");
            let mut child = Command::new(&exe)
                .arg(&name)
                .arg(self.dir.join(&name))
                .arg(format!("127.0.0.1:{port}"))
                .arg(&list)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()?;
            println!("demo: started {name}, pid {}", child.id());
            let stdin = child.stdin.take();
            let stdout = child.stdout.take().ok_or("no standard output")?;
            let sender = self.sender.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if sender.send((i, Some(line))).is_err() {
                        return;
                    }
                }
                let _ = sender.send((i, None));
            });
            let replies = VecDeque::new();
            let program = Program { name, child, stdin, seen: None, replies, ended: false };
            self.programs.push(program);
        }
        Ok(())
    }

    /// The demonstration proper, once the members run; says what it saw.
    fn tour(&mut self) -> Result<String, BoxError> {
        let first = self.agreed_leader(&[0, 1, 2], None)?;
        let first_term = self.programs[first].seen.as_ref().map_or(0, |s| s.0);
        self.write_on_follower(&[0, 1, 2], first, "demo/first")?;

        let (name, pid) = (self.programs[first].name.clone(), self.programs[first].child.id());
        println!("demo: killing {name}, the leader (pid {pid}), with SIGKILL");
        self.programs[first].child.kill()?;
        self.programs[first].child.wait()?;
        let survivors: Vec<usize> = (0..3).filter(|i| *i != first).collect();
        let next = self.agreed_leader(&survivors, Some(first))?;
        let next_term = self.programs[next].seen.as_ref().map_or(0, |s| s.0);
        self.write_on_follower(&survivors, next, "demo/after-failover")?;
        for i in &survivors {
            self.expect(*i, "get demo/first", "demo/first = ")?;
        }

        // A graceful stop: the leader hands leadership to the other survivor first.
        self.quit(next)?;
        let last = survivors.iter().copied().find(|i| *i != next).ok_or("no other survivor")?;
        self.quit(last)?;
        let names = |i: usize| self.programs[i].name.clone();
        Ok(format!(
            "{} led at term {first_term}, {} at term {next_term} after the kill; writes on \
             followers were read on every member",
            names(first),
            names(next)
        ))
    }

    /// A write on a follower of `leader` (one of `members`), forwarded to it, then a read of
    /// it on every member of `members`.
    fn write_on_follower(
        &mut self,
        members: &[usize],
        leader: usize,
        key: &str,
    ) -> Result<(), BoxError> {
        let follower = members.iter().copied().find(|i| *i != leader).ok_or("no follower")?;
        let (by, to) = (self.programs[follower].name.clone(), self.programs[leader].name.clone());
        let value = format!("written-on-{by}");
        let forwarded = format!("forwarded to the leader, {to}");
        self.expect(follower, &format!("put {key} {value}"), &forwarded)?;
        for i in members {
            self.expect(*i, &format!("get {key}"), &format!("{key} = {value} "))?;
        }
        Ok(())
    }

    /// Sends `command` to program `i` and waits for its answer, which must be `ok` and contain
    /// `wanted`.
    fn expect(&mut self, i: usize, command: &str, wanted: &str) -> Result<String, BoxError> {
        let name = self.programs[i].name.clone();
        println!("{name} < {command}");
        let stdin = self.programs[i].stdin.as_mut().ok_or("its input is closed")?;
        writeln!(stdin, "{command}")?;
        stdin.flush()?;
        let deadline = Instant::now() + STEP;
        let reply = loop {
            if let Some(reply) = self.programs[i].replies.pop_front() {
                break reply;
            }
            if self.programs[i].ended {
                return Err(format!("{name} ended without answering {command:?}").into());
            }
            self.next_line(deadline)?;
        };
        if !reply.starts_with("ok: ") || !reply.contains(wanted) {
            return Err(format!("{name} answered {command:?} with {reply:?}").into());
        }
        Ok(reply)
    }

    /// Waits until every program of `members` announces the same leader at the same term, not
    /// the program `old`; returns the leader's index.
    fn agreed_leader(&mut self, members: &[usize], old: Option<usize>) -> Result<usize, BoxError> {
        let old = old.map(|i| self.programs[i].name.clone());
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(gone) = members.iter().find(|i| self.programs[**i].ended) {
                return Err(format!("{}'s output ended", self.programs[*gone].name).into());
            }
            let seen: Vec<_> = members.iter().map(|i| self.programs[*i].seen.clone()).collect();
            if let Some(Some((_, Some(leader)))) = seen.first() {
                let agreed = seen.iter().all(|s| s == &seen[0]) && Some(leader) != old.as_ref();
                let index = self.programs.iter().position(|p| &p.name == leader);
                if let (true, Some(index)) = (agreed, index) {
                    println!("demo: every member running sees {leader} lead");
                    return Ok(index);
                }
            }
            self.next_line(deadline)?;
        }
    }

    /// Asks program `i` to quit, and waits for it to exit successfully.
    fn quit(&mut self, i: usize) -> Result<(), BoxError> {
        self.expect(i, "quit", "stopped")?;
        // Its input closes too: it reads no more.
        self.programs[i].stdin = None;
        let deadline = Instant::now() + STEP;
        let program = &mut self.programs[i];
        loop {
            if let Some(status) = program.child.try_wait()? {
                if !status.success() {
                    return Err(format!("{} exited with {status}", program.name).into());
                }
                println!("demo: {} exited", program.name);
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{} did not exit within {STEP:?}", program.name).into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Takes the next line any program prints (until `deadline`), and notes what it says.
    fn next_line(&mut self, deadline: Instant) -> Result<(), BoxError> {
        let wait = deadline.saturating_duration_since(Instant::now());
        let (i, line) = self.lines.recv_timeout(wait).map_err(|_| "no progress in time")?;
        let program = &mut self.programs[i];
        let Some(line) = line else {
            program.ended = true;
            return Ok(());
        };
        if let Some(seen) = announced(&line) {
            println!("{line}");
            program.seen = Some(seen);
        } else if line.starts_with("ok: ") || line.starts_with("error: ") {
            println!("{} > {line}", program.name);
            program.replies.push_back(line);
        } else {
            println!("{} > {line}", program.name);
        }
        Ok(())
    }
}

/// The leadership an announcement (`[m1] term 3: m0 leads`, `[m1] term 3: electing`) reports.
fn announced(line: &str) -> Option<(u64, Option<String>)> {
    let (_, rest) = line.strip_prefix('[')?.split_once("] term ")?;
    let (term, who) = rest.split_once(": ")?;
    let leader = match who {
        "electing" => None,
        who => Some(who.strip_suffix(" leads")?.to_string()),
    };
    Some((term.parse().ok()?, leader))
}

impl Drop for Demo {
    /// Kills every program still running, by its process id, and removes the data.
    fn drop(&mut self) {
        for p in &mut self.programs {
            if let Ok(None) = p.child.try_wait() {
                println!("demo: killing {} (pid {})", p.name, p.child.id());
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
