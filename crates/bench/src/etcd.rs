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

/// The report in etcd's layout, framed as etcd's command of the same workload frames it: range
/// prints a title first, put and txn-put print the report with `Println` (one more newline),
/// the others with `Printf("%s")`.
pub(crate) fn layout(r: &Report, precise: bool) -> String {
    let body = report(r, precise);
    match r.workload.as_str() {
        "range-l" | "seq-get" | "par-get" => format!("bench with linearizable range\n{body}"),
        "range-s" => format!("bench with serializable range\n{body}"),
        "put" | "txn-put" | "seq-put" | "par-put" | "mixed" => body + "\n",
        _ => body,
    }
}

/// etcd's `report.String()`: summary, histogram and distribution when any request succeeded,
/// then the errors.
fn report(r: &Report, precise: bool) -> String {
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
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{go_g, layout};
    use crate::tests::report;

    /// Stdout of etcd 3.5.17's `benchmark` against etcd 3.5.17, captured once: the progress
    /// bar, then the report.
    const PUT: &str = include_str!("../testdata/etcd-3.5.17-put.txt");
    const PUT_PRECISE: &str = include_str!("../testdata/etcd-3.5.17-put-precise.txt");
    const RANGE: &str = include_str!("../testdata/etcd-3.5.17-range.txt");
    const ERRORS: &str = include_str!("../testdata/etcd-3.5.17-put-errors.txt");

    /// What etcd printed, without its progress bar (a line of its own, drawn with `\r`:
    /// cairn's goes to standard error).
    fn etcd_report(captured: &str) -> String {
        let lines = captured.split_inclusive('\n');
        lines.filter(|l| !l.contains('\r')).collect()
    }

    /// A line's layout: its words, punctuation and tabs, with each number as `9` and the
    /// histogram bars (their lengths depend on the counts) left out.
    fn shape(text: &str) -> Vec<String> {
        let lines = text.split('\n');
        lines
            .map(|l| {
                let mut out = String::new();
                for c in l.chars().filter(|c| *c != '∎') {
                    let digit = c.is_ascii_digit();
                    if !(digit && out.ends_with('9')) {
                        out.push(if digit { '9' } else { c });
                    }
                }
                out
            })
            .collect()
    }

    /// Latencies spread like a run's: most near the low end, a tail to 5 ms.
    fn spread(n: u64) -> impl Iterator<Item = u64> {
        (0..n).map(move |i| 500 + (i * i * 4900) / (n * n))
    }

    #[test]
    fn the_layout_is_etcds_line_for_line() {
        let runs = [
            (PUT, "put", 300, false),
            (RANGE, "range-l", 1000, false),
            (PUT_PRECISE, "put", 300, true),
        ];
        for (captured, workload, n, precise) in runs {
            let mut r = report(workload, spread(n), &[]);
            // A time no rate divides evenly (Go's %g prints 600.0 as "600").
            r.elapsed = Duration::from_nanos(151_656_716);
            let ours = layout(&r, precise);
            assert_eq!(shape(&ours), shape(&etcd_report(captured)), "ours:\n{ours}");
        }
        let errors = [("etcdserver: request is too large", 5)];
        let ours = layout(&report("put", [], &errors), false);
        assert_eq!(ours, etcd_report(ERRORS));
    }

    #[test]
    fn numbers_follow_etcds_rules() {
        // 1000 latencies of 100, 101, ... 1099 µs in half a second.
        let out = layout(&report("lease-keepalive", 100..1100, &[]), false);
        let lines: Vec<&str> = out.lines().collect();
        for want in [
            "  Total:\t0.5000 secs.",
            "  Slowest:\t0.0011 secs.",
            "  Fastest:\t0.0001 secs.",
            "  Average:\t0.0006 secs.",
            "  Stddev:\t0.0003 secs.",
            "  Requests/sec:\t2000.0000",
            "  0.0001 [1]\t|",
            "  0.0011 [100]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎",
            "  10% in 0.0002 secs.",
            "  50% in 0.0006 secs.",
            "  99.9% in 0.0011 secs.",
        ] {
            assert!(lines.contains(&want), "no {want:?} in:\n{out}");
        }
        let counts: Vec<&str> = lines.iter().filter_map(|l| l.split(['[', ']']).nth(1)).collect();
        assert_eq!(
            counts,
            ["1", "99", "100", "100", "100", "100", "100", "100", "100", "100", "100"]
        );
        // Four latencies: each percentile takes the next one, and only three fit.
        let out = layout(&report("watch-latency", [1000, 2000, 3000, 4000], &[]), false);
        let dist = out.split("Latency distribution:\n").nth(1).expect("a distribution");
        assert_eq!(dist, "  10% in 0.0020 secs.\n  25% in 0.0030 secs.\n  50% in 0.0040 secs.\n");
    }

    #[test]
    fn precise_numbers_are_gos_g() {
        assert_eq!(go_g(0.0012573709000000001), "0.0012573709000000001");
        assert_eq!(go_g(1978.1517621679213), "1978.1517621679213");
        assert_eq!(go_g(0.0001), "0.0001");
        assert_eq!(go_g(5.5e-5), "5.5e-05");
        assert_eq!(go_g(1234567.0), "1.234567e+06");
        assert_eq!(go_g(100.0), "100");
        assert_eq!(go_g(0.0), "0");
    }
}
