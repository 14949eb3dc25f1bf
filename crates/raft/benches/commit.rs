//! Entries committed per second by the core alone: three in-memory nodes, messages delivered
//! in-process, no disk. Measures the consensus logic itself (batching, replication, commit),
//! the ceiling any driver can reach. Run with `cargo bench -p cairn-raft --bench commit`.

use std::collections::VecDeque;

use bytes::Bytes;
use cairn_raft::{ConfState, Config, Message, NodeId, Persisted, Raft, Role};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

struct Bench {
    nodes: Vec<Raft>,
    queue: VecDeque<Message>,
}

impl Bench {
    fn new() -> Bench {
        let ids = [NodeId(1), NodeId(2), NodeId(3)];
        let nodes = ids
            .iter()
            .map(|&id| {
                let cfg =
                    Config { max_msg_bytes: 4 << 20, max_inflight_msgs: 1024, ..Config::new(id) };
                Raft::new(cfg, Persisted::bootstrap(ConfState::with_voters(ids))).expect("config")
            })
            .collect();
        let mut b = Bench { nodes, queue: VecDeque::new() };
        b.run_until(|b| b.nodes[0].applied_index() >= cairn_raft::LogIndex(1));
        b.nodes[0].campaign();
        b.run_until(|b| {
            b.nodes[0].role() == Role::Leader && b.nodes[0].commit_index() > cairn_raft::LogIndex(1)
        });
        b
    }

    /// Handles Readies and delivers messages until `done` holds.
    fn run_until(&mut self, done: impl Fn(&Bench) -> bool) {
        while !done(self) {
            for n in &mut self.nodes {
                if n.has_ready() {
                    let rd = n.ready();
                    // "Persist" and "apply" are free here: only the core is measured.
                    self.queue.extend(rd.messages_now);
                    self.queue.extend(rd.messages_after_persist);
                    n.advance();
                }
            }
            while let Some(m) = self.queue.pop_front() {
                self.nodes[(m.to.0 - 1) as usize].step(m);
            }
        }
    }

    fn commit_batch(&mut self, batch: &[Bytes]) {
        let target = cairn_raft::LogIndex(self.nodes[0].last_index().0 + batch.len() as u64);
        self.nodes[0].propose_batch(batch.to_vec()).expect("leader accepts");
        self.run_until(|b| b.nodes[0].commit_index() >= target);
        // Keep memory flat over millions of entries, as a real driver's snapshots would.
        for n in &mut self.nodes {
            if n.applied_index().0 - n.first_index().0 > 50_000 {
                n.compact(Bytes::new());
            }
        }
    }
}

fn commit_throughput(c: &mut Criterion) {
    let mut group = c.benchmark_group("commit_3_nodes_in_memory");
    group.sample_size(20);
    for batch_size in [1usize, 64, 1024] {
        let batch: Vec<Bytes> = (0..batch_size).map(|i| Bytes::from(format!("{i:0>16}"))).collect();
        group.throughput(Throughput::Elements(batch_size as u64));
        let mut bench = Bench::new();
        group.bench_with_input(BenchmarkId::from_parameter(batch_size), &batch, |b, batch| {
            b.iter(|| bench.commit_batch(batch));
        });
    }
    group.finish();
}

criterion_group!(benches, commit_throughput);
criterion_main!(benches);
