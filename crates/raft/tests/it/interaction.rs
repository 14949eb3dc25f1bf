//! Scripted interaction tests in the style of etcd raft's `testdata`: each file under
//! `tests/testdata` drives a few nodes step by step and records what they did. Run with
//! `REWRITE=1` to regenerate the expected output after an intended change, then review the diff.
//!
//! A file is a list of blocks: a command line, `----`, the expected output, a blank line. Lines
//! starting with `#` are comments. Commands:
//!
//! | command | effect |
//! | --- | --- |
//! | `add-nodes N [voters=1,2,3] [learners=4] [pre-vote=false] [check-quorum=false] [lease] [max-msg-bytes=B] [max-inflight=K]` | nodes 1..N; founding members bootstrapped, others empty |
//! | `campaign ID` | ID starts an election |
//! | `propose ID DATA` | ID proposes DATA |
//! | `propose-conf-change ID v4 l5 r2 [explicit]` | add voter 4, learner 5, remove 2 |
//! | `tick ID [N]` / `tick-all [N]` | advance clocks |
//! | `process-ready ID...` | handle each node's Ready, printing it |
//! | `deliver-msgs [ID...]` | deliver pending messages (to the given nodes only) |
//! | `drop-msgs [ID...]` | discard pending messages (to the given nodes only) |
//! | `stabilize` | ready and deliver until quiet, printing everything |
//! | `read-index ID CTX` / `transfer-leader FROM TO` | as named |
//! | `compact ID` | snapshot the state machine and compact the log at the applied index |
//! | `report-snapshot LEADER TO ok/fail` / `report-unreachable LEADER TO` | transport reports |
//! | `isolate ID` / `heal` | cut all links of ID / restore every link |
//! | `restart ID` | lose everything not persisted |
//! | `status ID` / `raft-log ID` | print state |

use std::collections::{BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::Path;

use bytes::Bytes;
use cairn_raft::testkit::{MemNode, MemStorage};
use cairn_raft::{
    ConfChange, ConfChangeSingle, ConfState, Config, Entry, EntryPayload, LeaveJoint, Message,
    MessageBody, NodeId, Persisted, ReadCtx, ReadMode, Ready, SnapshotStatus,
};

struct Env {
    nodes: Vec<MemNode>,
    pending: VecDeque<Message>,
    cut: BTreeSet<u64>,
}

fn fmt_entry(e: &Entry) -> String {
    match &e.payload {
        EntryPayload::Normal(d) if d.is_empty() => format!("{}/{} empty", e.term, e.index),
        EntryPayload::Normal(d) => {
            format!("{}/{} {:?}", e.term, e.index, String::from_utf8_lossy(d))
        }
        EntryPayload::ConfChange(cc) => format!("{}/{} conf {}", e.term, e.index, fmt_cc(cc)),
    }
}

fn fmt_cc(cc: &ConfChange) -> String {
    if cc.changes.is_empty() {
        return "leave-joint".into();
    }
    let parts: Vec<String> = cc
        .changes
        .iter()
        .map(|c| match c {
            ConfChangeSingle::AddVoter(id) => format!("v{id}"),
            ConfChangeSingle::AddLearner(id) => format!("l{id}"),
            ConfChangeSingle::Remove(id) => format!("r{id}"),
        })
        .collect();
    parts.join(" ")
}

fn fmt_entries(es: &[Entry]) -> String {
    es.iter().map(fmt_entry).collect::<Vec<_>>().join(", ")
}

fn fmt_msg(m: &Message) -> String {
    let head = format!("{}->{} {} term={}", m.from, m.to, m.kind_name(), m.term);
    let tail = match &m.body {
        MessageBody::Append { prev_index, prev_term, entries, commit } => {
            let mut s = format!(" prev={prev_term}/{prev_index} commit={commit}");
            if !entries.is_empty() {
                let _ = write!(s, " [{}]", fmt_entries(entries));
            }
            s
        }
        MessageBody::AppendResp { index, reject: None } => format!(" index={index}"),
        MessageBody::AppendResp { index, reject: Some(h) } => {
            format!(" rejected={index} hint={}/{}", h.term, h.index)
        }
        MessageBody::Vote { last_index, last_term, transfer, .. } => {
            format!(" last={last_term}/{last_index}{}", if *transfer { " transfer" } else { "" })
        }
        MessageBody::VoteResp { granted, .. } => {
            if *granted {
                " granted".into()
            } else {
                " rejected".into()
            }
        }
        MessageBody::Heartbeat { commit, seq } => format!(" commit={commit} seq={}", seq.0),
        MessageBody::HeartbeatResp { seq } => format!(" seq={}", seq.0),
        MessageBody::Snapshot { snapshot } => {
            format!(" snapshot={}/{}", snapshot.meta.term, snapshot.meta.index)
        }
        MessageBody::Propose { payloads } => format!(" {} payload(s)", payloads.len()),
        MessageBody::ReadIndex { ctxs } => format!(" ctxs={}", fmt_ctxs(ctxs)),
        MessageBody::ReadIndexResp { ctxs, index } => {
            format!(" ctxs={} index={index}", fmt_ctxs(ctxs))
        }
        MessageBody::TransferLeader { target } => format!(" target={target}"),
        MessageBody::TimeoutNow => String::new(),
    };
    head + &tail
}

fn fmt_ctxs(ctxs: &[ReadCtx]) -> String {
    let v: Vec<String> = ctxs.iter().map(|c| String::from_utf8_lossy(&c.0).into_owned()).collect();
    v.join(",")
}

fn fmt_conf(c: &ConfState) -> String {
    let ids = |s: &BTreeSet<NodeId>| s.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let mut out = format!("voters=({})", ids(&c.voters));
    if c.is_joint() {
        let _ = write!(out, "&&({})", ids(&c.voters_outgoing));
    }
    if !c.learners.is_empty() {
        let _ = write!(out, " learners=({})", ids(&c.learners));
    }
    if !c.learners_next.is_empty() {
        let _ = write!(out, " learners_next=({})", ids(&c.learners_next));
    }
    out
}

fn fmt_ready(id: u64, rd: &Ready, out: &mut String) {
    let _ = writeln!(out, "> {id} handling Ready");
    if let Some(ss) = rd.soft_state {
        let leader = ss.leader.map_or("none".into(), |l| l.to_string());
        let _ = writeln!(out, "  role: {:?} leader={leader}", ss.role);
    }
    for m in &rd.messages_now {
        let _ = writeln!(out, "  send now: {}", fmt_msg(m));
    }
    if let Some(s) = &rd.snapshot {
        let _ = writeln!(
            out,
            "  snapshot: {}/{} {}",
            s.meta.term,
            s.meta.index,
            fmt_conf(&s.meta.conf_state)
        );
    }
    if !rd.entries.is_empty() {
        let _ = writeln!(out, "  persist entries: {}", fmt_entries(&rd.entries));
    }
    if let Some(hs) = rd.hard_state {
        let vote = hs.vote.map_or("none".into(), |v| v.to_string());
        let _ = writeln!(
            out,
            "  persist hard state: term={} vote={vote} commit={}",
            hs.term, hs.commit
        );
    }
    for m in &rd.messages_after_persist {
        let _ = writeln!(out, "  send after persist: {}", fmt_msg(m));
    }
    if !rd.committed_entries.is_empty() {
        let _ = writeln!(out, "  apply: {}", fmt_entries(&rd.committed_entries));
    }
    for rs in &rd.read_states {
        let _ = writeln!(
            out,
            "  read state: ctx={} index={}",
            String::from_utf8_lossy(&rs.ctx.0),
            rs.index
        );
    }
}

fn parse_conf_change(args: &[&str]) -> ConfChange {
    let mut cc = ConfChange::default();
    for a in args {
        let (kind, n) = a.split_at(1);
        let target = || NodeId(n.parse().expect("node id"));
        match kind {
            "v" => cc.changes.push(ConfChangeSingle::AddVoter(target())),
            "l" => cc.changes.push(ConfChangeSingle::AddLearner(target())),
            "r" => cc.changes.push(ConfChangeSingle::Remove(target())),
            _ if *a == "explicit" => cc.leave_joint = LeaveJoint::Explicit,
            _ => panic!("bad change {a}"),
        }
    }
    cc
}

fn parse_ids(s: &str) -> Vec<u64> {
    s.split(',').filter(|x| !x.is_empty()).map(|x| x.parse().expect("node id")).collect()
}

impl Env {
    fn node(&mut self, id: u64) -> &mut MemNode {
        &mut self.nodes[(id - 1) as usize]
    }

    fn add_nodes(&mut self, args: &[&str]) -> String {
        let n: u64 = args[0].parse().expect("node count");
        let mut voters: Vec<u64> = (1..=n).collect();
        let mut learners = Vec::new();
        let mut cfg = Config::new(NodeId(1));
        for a in &args[1..] {
            let (k, v) = a.split_once('=').unwrap_or((a, ""));
            match k {
                "voters" => voters = parse_ids(v),
                "learners" => learners = parse_ids(v),
                "pre-vote" => cfg.pre_vote = v == "true",
                "check-quorum" => cfg.check_quorum = v == "true",
                "lease" => cfg.read_mode = ReadMode::Lease,
                "max-msg-bytes" => cfg.max_msg_bytes = v.parse().expect("bytes"),
                "max-inflight" => cfg.max_inflight_msgs = v.parse().expect("count"),
                other => panic!("unknown add-nodes option {other}"),
            }
        }
        let mut conf = ConfState::with_voters(voters.iter().map(|&v| NodeId(v)));
        conf.learners = learners.iter().map(|&l| NodeId(l)).collect();
        let mut out = String::new();
        for id in 1..=n {
            let c = Config { id: NodeId(id), ..cfg.clone() };
            let founding = voters.contains(&id) || learners.contains(&id);
            let storage = if founding {
                MemStorage::from(Persisted::bootstrap(conf.clone()))
            } else {
                MemStorage::default()
            };
            self.nodes.push(MemNode::new(c, storage));
            let _ = writeln!(
                out,
                "node {id}: {}",
                if founding { fmt_conf(&conf) } else { "empty".into() }
            );
        }
        // Apply the founding configuration quietly.
        for node in &mut self.nodes {
            node.handle_ready();
        }
        out
    }

    fn process_ready(&mut self, id: u64, out: &mut String) -> bool {
        let node = self.node(id);
        if !node.raft.has_ready() {
            return false;
        }
        let rd = node.raft.ready();
        fmt_ready(id, &rd, out);
        node.storage.persist(&rd);
        node.state.apply(&rd);
        let msgs: Vec<Message> =
            rd.messages_now.iter().chain(&rd.messages_after_persist).cloned().collect();
        node.raft.advance();
        self.pending.extend(msgs);
        true
    }

    /// Delivers pending messages addressed to `to` (all if empty). Returns whether any moved.
    fn deliver(&mut self, to: &[u64], out: &mut String) -> bool {
        let (take, keep): (Vec<Message>, Vec<Message>) =
            self.pending.drain(..).partition(|m| to.is_empty() || to.contains(&m.to.0));
        self.pending = keep.into();
        for m in &take {
            if self.cut.contains(&m.from.0) || self.cut.contains(&m.to.0) {
                let _ = writeln!(out, "  dropped: {}", fmt_msg(m));
                continue;
            }
            let _ = writeln!(out, "  deliver: {}", fmt_msg(m));
            self.node(m.to.0).raft.step(m.clone());
        }
        !take.is_empty()
    }

    fn stabilize(&mut self, out: &mut String) {
        for _ in 0..1_000 {
            let mut moved = false;
            for id in 1..=self.nodes.len() as u64 {
                moved |= self.process_ready(id, out);
            }
            moved |= self.deliver(&[], out);
            if !moved {
                return;
            }
        }
        panic!("did not stabilize");
    }

    fn status(&mut self, id: u64) -> String {
        let r = &self.node(id).raft;
        let leader = r.leader().map_or("none".into(), |l| l.to_string());
        let mut s = format!(
            "{:?} term={} leader={leader} commit={} applied={} last={} first={} conf {}\n",
            r.role(),
            r.term(),
            r.commit_index(),
            r.applied_index(),
            r.last_index(),
            r.first_index(),
            fmt_conf(r.conf_state())
        );
        for peer in r.conf_state().members() {
            if let Some(p) = r.progress(peer) {
                let _ = writeln!(
                    s,
                    "  {peer}: {:?} match={} next={}",
                    p.state(),
                    p.matched(),
                    p.next()
                );
            }
        }
        s
    }

    /// Time passing, Ready handling and message delivery.
    fn clock_and_network_cmd(&mut self, cmd: &str, args: &[&str]) -> String {
        let ids: Vec<u64> = args.iter().map(|a| a.parse().expect("number")).collect();
        let mut out = String::new();
        match cmd {
            "tick" => {
                for _ in 0..ids.get(1).copied().unwrap_or(1) {
                    self.node(ids[0]).raft.tick();
                }
            }
            "tick-all" => {
                for _ in 0..ids.first().copied().unwrap_or(1) {
                    for n in &mut self.nodes {
                        n.raft.tick();
                    }
                }
            }
            "process-ready" => {
                for id in ids {
                    self.process_ready(id, &mut out);
                }
            }
            "deliver-msgs" => {
                self.deliver(&ids, &mut out);
            }
            _ => self.pending.retain(|m| !(ids.is_empty() || ids.contains(&m.to.0))),
        }
        out
    }

    /// Compaction and the transport's reports about snapshots and reachability.
    fn transport_cmd(&mut self, cmd: &str, args: &[&str]) -> String {
        let id = |i: usize| -> u64 { args[i].parse().expect("node id") };
        match cmd {
            "compact" => {
                self.node(id(0)).compact();
                let meta = self.node(id(0)).raft.snapshot_meta().clone();
                format!("snapshot at {}/{}\n", meta.term, meta.index)
            }
            "report-snapshot" => {
                let ok = args[2] == "ok";
                let status = if ok { SnapshotStatus::Finished } else { SnapshotStatus::Failed };
                self.node(id(0)).raft.report_snapshot(NodeId(id(1)), status);
                String::new()
            }
            _ => {
                self.node(id(0)).raft.report_unreachable(NodeId(id(1)));
                String::new()
            }
        }
    }

    fn run(&mut self, line: &str) -> String {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let (cmd, args) = (parts[0], &parts[1..]);
        let id = |i: usize| -> u64 { args[i].parse().expect("node id") };
        let mut out = String::new();
        match cmd {
            "add-nodes" => out = self.add_nodes(args),
            "campaign" => self.node(id(0)).raft.campaign(),
            "propose" => {
                let data = Bytes::from(args[1].to_string());
                if let Err(e) = self.node(id(0)).raft.propose(data) {
                    let _ = writeln!(out, "error: {e}");
                }
            }
            "propose-conf-change" => {
                if let Err(e) =
                    self.node(id(0)).raft.propose_conf_change(parse_conf_change(&args[1..]))
                {
                    let _ = writeln!(out, "error: {e}");
                }
            }
            "tick" | "tick-all" | "process-ready" | "deliver-msgs" | "drop-msgs" => {
                out = self.clock_and_network_cmd(cmd, args);
            }
            "stabilize" => self.stabilize(&mut out),
            "read-index" => {
                let ctx = ReadCtx(Bytes::from(args[1].to_string()));
                if let Err(e) = self.node(id(0)).raft.read_index(ctx) {
                    let _ = writeln!(out, "error: {e}");
                }
            }
            "transfer-leader" => {
                let target = NodeId(id(1));
                if let Err(e) = self.node(id(0)).raft.transfer_leader(target) {
                    let _ = writeln!(out, "error: {e}");
                }
            }
            "compact" | "report-snapshot" | "report-unreachable" => {
                out = self.transport_cmd(cmd, args)
            }
            "isolate" => {
                self.cut.insert(id(0));
            }
            "heal" => self.cut.clear(),
            "restart" => self.node(id(0)).restart(),
            "status" => out = self.status(id(0)),
            "raft-log" => {
                let r = &self.node(id(0)).raft;
                for e in r.log_entries() {
                    let _ = writeln!(out, "{}", fmt_entry(e));
                }
            }
            other => panic!("unknown command {other}"),
        }
        if out.is_empty() {
            out.push_str("ok\n");
        }
        out
    }
}

fn run_file(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let mut env = Env { nodes: Vec::new(), pending: VecDeque::new(), cut: BTreeSet::new() };
    let mut rewritten = String::new();
    let mut lines = text.lines().peekable();
    let mut mismatches = Vec::new();
    while let Some(line) = lines.next() {
        if line.trim().is_empty() || line.starts_with('#') {
            rewritten.push_str(line);
            rewritten.push('\n');
            continue;
        }
        let cmd = line;
        assert_eq!(lines.next(), Some("----"), "{}: expected ---- after {cmd}", path.display());
        let mut expected = String::new();
        while let Some(l) = lines.peek() {
            if l.is_empty() {
                break;
            }
            expected.push_str(l);
            expected.push('\n');
            lines.next();
        }
        let actual = env.run(cmd);
        if actual != expected {
            mismatches.push(format!("{cmd}\n--- expected\n{expected}--- actual\n{actual}"));
        }
        let _ = write!(rewritten, "{cmd}\n----\n{actual}");
    }
    if std::env::var_os("REWRITE").is_some() {
        std::fs::write(path, rewritten).map_err(|e| e.to_string())?;
        return Ok(());
    }
    if mismatches.is_empty() {
        Ok(())
    } else {
        Err(format!("{}:\n{}", path.display(), mismatches.join("\n")))
    }
}

#[test]
fn interaction_scripts() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("testdata dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    files.sort();
    assert!(files.len() >= 8, "interaction scripts missing");
    let failures: Vec<String> = files.iter().filter_map(|f| run_file(f).err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
