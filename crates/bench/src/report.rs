//! Results: merged HDR histograms, error counts, and the summary a person reads (or JSON).

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::args::Output;
use crate::BenchError;

/// What one client measured.
#[derive(Debug)]
pub struct Tally {
    pub latency_us: Histogram<u64>,
    pub ok: u64,
    pub errors: BTreeMap<String, u64>,
}

impl Tally {
    pub fn new() -> Tally {
        // 1 µs to 60 s with 3 significant digits: constant bounds that are always valid.
        let latency_us =
            Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds");
        Tally { latency_us, ok: 0, errors: BTreeMap::new() }
    }

    pub fn record(&mut self, elapsed: Duration, result: Result<(), String>) {
        match result {
            Ok(()) => {
                self.ok += 1;
                // Beyond the bounds (over a minute) counts as the bound: never dropped.
                self.latency_us.saturating_record((elapsed.as_micros() as u64).max(1));
            }
            Err(e) => *self.errors.entry(e).or_default() += 1,
        }
    }

    pub fn merge(&mut self, other: Tally) {
        let _ = self.latency_us.add(&other.latency_us);
        self.ok += other.ok;
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
    }
}

impl Default for Tally {
    fn default() -> Tally {
        Tally::new()
    }
}

/// One run, ready to print.
#[derive(Debug)]
pub struct Report {
    pub workload: String,
    pub endpoint: String,
    pub server_version: String,
    pub params: BTreeMap<&'static str, String>,
    pub elapsed: Duration,
    pub tally: Tally,
    /// Workload-specific counters (watch events delivered, ...).
    pub extra: BTreeMap<&'static str, u64>,
}

impl Report {
    pub fn requests(&self) -> u64 {
        self.tally.ok + self.errors()
    }

    pub fn errors(&self) -> u64 {
        self.tally.errors.values().sum()
    }

    pub fn throughput(&self) -> f64 {
        self.tally.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn percentile(&self, p: f64) -> u64 {
        self.tally.latency_us.value_at_quantile(p / 100.0)
    }

    pub fn text(&self) -> String {
        let h = &self.tally.latency_us;
        let mut out = format!(
            "\nSummary ({} against {}, server {}):\n",
            self.workload, self.endpoint, self.server_version
        );
        out += &format!("  Total time:\t{:.4} secs.\n", self.elapsed.as_secs_f64());
        out += &format!("  Requests:\t{}\n", self.requests());
        out += &format!("  Errors:\t{}\n", self.errors());
        out += &format!("  Throughput:\t{:.1} ops/s\n", self.throughput());
        for (k, v) in &self.extra {
            out += &format!("  {k}:\t{v}\n");
        }
        out += "\nLatency (µs):\n";
        out += &format!("  Avg:\t{:.1}\n  Min:\t{}\n  Max:\t{}\n", h.mean(), h.min(), h.max());
        for (name, p) in [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99.9", 99.9)] {
            out += &format!("  {name}:\t{}\n", self.percentile(p));
        }
        if self.errors() > 0 {
            out += &format!("\nThis run had {} failed requests:\n", self.errors());
            for (e, n) in &self.tally.errors {
                out += &format!("  {n}\t{e}\n");
            }
        }
        out
    }

    /// The report in the layout asked for, ready to write (it ends with a newline).
    pub fn render(&self, output: Output, precise: bool) -> String {
        match output {
            Output::Text => self.text() + "\n",
            Output::Json => self.json() + "\n",
            Output::Etcd => crate::etcd::layout(self, precise),
        }
    }

    /// Why the run failed, if any request did: its numbers would not describe a working
    /// system, so a script must see the failure in the exit status, not only in the report.
    pub fn failure(&self) -> Option<BenchError> {
        let (kind, n) = self.tally.errors.iter().max_by_key(|(_, n)| **n)?;
        Some(BenchError::Failed {
            failed: self.errors(),
            requests: self.requests(),
            most_common: format!("{n} x {kind}"),
        })
    }

    pub fn json(&self) -> String {
        let h = &self.tally.latency_us;
        let latency = serde_json::json!({
            "avg": h.mean(), "min": h.min(), "max": h.max(),
            "p50": self.percentile(50.0), "p90": self.percentile(90.0),
            "p99": self.percentile(99.0), "p999": self.percentile(99.9),
        });
        serde_json::json!({
            "workload": self.workload,
            "endpoint": self.endpoint,
            "server_version": self.server_version,
            "params": self.params,
            "results": {
                "total_secs": self.elapsed.as_secs_f64(),
                "requests": self.requests(),
                "ok": self.tally.ok,
                "errors": self.errors(),
                "error_kinds": self.tally.errors,
                "throughput_ops": self.throughput(),
                "latency_us": latency,
                "extra": self.extra,
            }
        })
        .to_string()
    }
}
