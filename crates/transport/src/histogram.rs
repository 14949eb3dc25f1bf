//! A latency histogram recorded without locks: the transport's peer round trips use it, and
//! the engine's disk timings (`cairn_node::metrics`) too. Each kind of histogram names its
//! bucket bounds with a [`Bounds`] type, so the bounds are fixed where the metric is defined
//! (etcd's, for the series its dashboards plot) and a histogram costs no allocation per use.
//!
//! Recording costs three relaxed atomic additions.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The upper bounds of a kind of histogram, in seconds, ascending.
pub trait Bounds: Send + Sync + 'static {
    const BOUNDS: &'static [f64];
}

/// Upper bounds of etcd's `etcd_network_peer_round_trip_time_seconds`: 0.1 ms doubling 16
/// times, to 3.2768 s.
#[derive(Debug)]
pub struct RttBuckets;

impl Bounds for RttBuckets {
    const BOUNDS: &'static [f64] = &[
        0.0001, 0.0002, 0.0004, 0.0008, 0.0016, 0.0032, 0.0064, 0.0128, 0.0256, 0.0512, 0.1024,
        0.2048, 0.4096, 0.8192, 1.6384, 3.2768,
    ];
}

/// A latency histogram with `B`'s bounds.
#[derive(Debug)]
pub struct Histogram<B: Bounds> {
    /// Observations at or below each bound (not cumulative); the last slot is above them all.
    buckets: Box<[AtomicU64]>,
    sum_nanos: AtomicU64,
    count: AtomicU64,
    bounds: PhantomData<B>,
}

impl<B: Bounds> Default for Histogram<B> {
    fn default() -> Self {
        Histogram {
            buckets: (0..=B::BOUNDS.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
            count: AtomicU64::new(0),
            bounds: PhantomData,
        }
    }
}

/// A histogram as read at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramSnapshot {
    /// (upper bound in seconds, observations in that bucket and not the one below), the last
    /// bound infinite. Not cumulative: a reader adds them up as its format wants.
    pub buckets: Vec<(f64, u64)>,
    /// The sum of every observation, in seconds.
    pub sum_seconds: f64,
    /// Observations.
    pub count: u64,
}

impl<B: Bounds> Histogram<B> {
    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let slot = B::BOUNDS.iter().position(|b| secs <= *b).unwrap_or(B::BOUNDS.len());
        self.buckets[slot].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Observations so far and their sum in nanoseconds, read without a lock: a cheap mean
    /// over an interval from two readings.
    pub fn totals(&self) -> (u64, u64) {
        (self.count.load(Ordering::Relaxed), self.sum_nanos.load(Ordering::Relaxed))
    }

    /// The histogram now. Read without a lock, so a scrape during an observation may see its
    /// count before its bucket; the next scrape sees both.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let buckets = B::BOUNDS
            .iter()
            .chain(&[f64::INFINITY])
            .zip(self.buckets.iter())
            .map(|(bound, n)| (*bound, n.load(Ordering::Relaxed)))
            .collect();
        HistogramSnapshot {
            buckets,
            sum_seconds: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            count: self.count.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_buckets_are_etcds_and_one_above() {
        let h = Histogram::<RttBuckets>::default();
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_micros(100));
        h.observe(Duration::from_micros(150));
        h.observe(Duration::from_secs(4));
        let s = h.snapshot();
        assert_eq!(s.count, 4);
        assert_eq!(s.buckets.len(), 17);
        // A bound holds what equals it (Prometheus's `le`).
        assert_eq!(s.buckets[0], (0.0001, 2));
        assert_eq!(s.buckets[1], (0.0002, 1));
        assert_eq!(s.buckets[15], (3.2768, 0));
        assert_eq!(s.buckets[16], (f64::INFINITY, 1));
        for pair in RttBuckets::BOUNDS.windows(2) {
            assert!((pair[1] / pair[0] - 2.0).abs() < 1e-9, "{pair:?} do not double");
        }
        assert!((s.sum_seconds - 4.0003).abs() < 1e-9);
    }
}
