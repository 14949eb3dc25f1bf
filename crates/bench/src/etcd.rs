//! `--output etcd`: the results in the layout of etcd's `benchmark` tool (its summary, response
//! time histogram, latency distribution and error distribution, in seconds), so scripts written
//! for that tool parse cairn's output unchanged.
//!
//! The numbers come from the run's HDR histogram (microseconds, 3 significant digits), so each
//! latency is its bucket's upper bound; the bucketing and the percentile picks follow etcd's
//! rules on the sorted latencies, including its quirk that one latency answers at most one
//! percentile (with few requests the later percentiles move up or vanish, as in etcd).

use std::fmt::Write;

use crate::report::Report;

/// The percentiles etcd prints, as etcd prints their names.
const PERCENTILES: [(f64, &str); 8] = [
    (10.0, "10"),
    (25.0, "25"),
    (50.0, "50"),
    (75.0, "75"),
    (90.0, "90"),
    (95.0, "95"),
    (99.0, "99"),
    (99.9, "99.9"),
];
/// Buckets of the response time histogram (etcd adds one for the slowest).
const BUCKETS: usize = 10;
/// The longest bar of the histogram.
const BAR_WIDTH: u64 = 40;

/// Latencies in seconds, sorted, each with how many requests took it.
struct Sorted(Vec<(f64, u64)>);

impl Sorted {
    fn of(report: &Report) -> Sorted {
        let h = &report.tally.latency_us;
        Sorted(
            h.iter_recorded()
                .map(|v| (v.value_iterated_to() as f64 / 1e6, v.count_at_value()))
                .collect(),
        )
    }

    fn count(&self) -> u64 {
        self.0.iter().map(|(_, n)| n).sum()
    }

    /// The latency at position `i` (from 0) of the sorted list.
    fn at(&self, i: u64) -> f64 {
        let mut seen = 0;
        for (v, n) in &self.0 {
            seen += n;
            if i < seen {
                return *v;
            }
        }
        self.0.last().map_or(0.0, |(v, _)| *v)
    }
}

/// Numbers as etcd prints them: `%4.4f`, or Go's shortest `%g` with `--precise`.
fn num(x: f64, precise: bool) -> String {
    if precise {
        go_g(x)
    } else {
        format!("{x:4.4}")
    }
}

/// Go's `%g` of a float64: the shortest digits that read back the same, in exponent form
/// when the exponent is below -4 or at least 6 (`1.2e-05`, `1.5e+06`).
pub(crate) fn go_g(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let e = format!("{x:e}");
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..6).contains(&exp) {
        return format!("{x}");
    }
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.abs())
}

/// The summary block, or nothing when no request succeeded (as etcd).
fn summary(out: &mut String, r: &Report, s: &Sorted, precise: bool) {
    let h = &r.tally.latency_us;
    let secs = |x: f64| format!("{} secs", num(x, precise));
    let (fastest, slowest) = (s.at(0), s.at(s.count().saturating_sub(1)));
    let total = r.elapsed.as_secs_f64();
    let _ = write!(out, "\nSummary:\n  Total:\t{}.\n", secs(total));
    let _ = write!(out, "  Slowest:\t{}.\n  Fastest:\t{}.\n", secs(slowest), secs(fastest));
    let _ = writeln!(out, "  Average:\t{}.", secs(h.mean() / 1e6));
    let _ = writeln!(out, "  Stddev:\t{}.", secs(h.stdev() / 1e6));
    let rps = s.count() as f64 / total.max(1e-9);
    let _ = writeln!(out, "  Requests/sec:\t{}", num(rps, precise));
}

/// Ten equal buckets from the fastest to the slowest latency, plus one at the slowest; each
/// latency counts in the first bucket whose bound it does not exceed.
fn histogram(out: &mut String, s: &Sorted, precise: bool) {
    let (fastest, slowest) = (s.at(0), s.at(s.count().saturating_sub(1)));
    let width = (slowest - fastest) / BUCKETS as f64;
    let mut bounds: Vec<f64> = (0..BUCKETS).map(|i| fastest + width * i as f64).collect();
    bounds.push(slowest);
    let mut counts = vec![0u64; bounds.len()];
    let mut b = 0;
    for (v, n) in &s.0 {
        while *v > bounds[b] && b < bounds.len() - 1 {
            b += 1;
        }
        counts[b] += n;
    }
    let most = counts.iter().copied().max().unwrap_or(0).max(1);
    out.push_str("\nResponse time histogram:\n");
    for (bound, n) in bounds.iter().zip(&counts) {
        let bar = "∎".repeat((n * BAR_WIDTH / most) as usize);
        let _ = writeln!(out, "  {} [{n}]\t|{bar}", num(*bound, precise));
    }
}

/// etcd's pick: percentile p is the latency at the first position i (after the previous
/// percentile's) with i * 100 / n >= p.
fn distribution(out: &mut String, s: &Sorted, precise: bool) {
    let n = s.count();
    out.push_str("\nLatency distribution:\n");
    let mut next = 0;
    for (p, name) in PERCENTILES {
        // Start near the answer and step: the test is etcd's, in floating point.
        let mut i = ((p * n as f64 / 100.0).floor() as u64).saturating_sub(1).max(next);
        while i < n && (i as f64) * 100.0 / (n as f64) < p {
            i += 1;
        }
        if i >= n {
            break;
        }
        let _ = writeln!(out, "  {name}% in {} secs.", num(s.at(i), precise));
        next = i + 1;
    }
}

/// The report in etcd's layout, ending as etcd's `fmt.Println` of it ends.
pub(crate) fn layout(r: &Report, precise: bool) -> String {
    let s = Sorted::of(r);
    let mut out = String::new();
    if s.count() > 0 {
        summary(&mut out, r, &s, precise);
        histogram(&mut out, &s, precise);
        distribution(&mut out, &s, precise);
    }
    if !r.tally.errors.is_empty() {
        out.push_str("\nError distribution:\n");
        for (e, n) in &r.tally.errors {
            let _ = writeln!(out, "  [{n}]\t{e}");
        }
    }
    out.push('\n');
    out
}
