//! The engine's counters, kept where the numbers arise (the driver, the log's fsync, the
//! committer) as plain atomics. A server turns them into Prometheus series at scrape time; the
//! engine itself depends on no metrics crate, so an embedder builds without one.
//!
//! Recording costs one or two relaxed atomic operations: no lock, no allocation.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cairn_storage::fs::{Dir, File, OsDir, OsFile};

pub use cairn_transport::histogram::{Bounds, Histogram, HistogramSnapshot};

/// Upper bounds of etcd's disk histograms (`wal_fsync_duration_seconds`,
/// `backend_commit_duration_seconds`): 1 ms doubling to 8.192 s.
pub const DISK_BUCKETS: [f64; 14] = [
    0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096,
    8.192,
];

/// The bounds of the disk histograms, [`DISK_BUCKETS`].
#[derive(Debug)]
pub struct DiskBuckets;

impl Bounds for DiskBuckets {
    const BOUNDS: &'static [f64] = &DISK_BUCKETS;
}

/// A histogram of disk timings.
pub type DiskHistogram = Histogram<DiskBuckets>;

/// What the engine counts, read with [`crate::Engine::metrics`].
#[derive(Debug, Default)]
pub struct EngineMetrics {
    /// Times this member saw a new leader (etcd's `leader_changes_seen_total`).
    pub leader_changes: AtomicU64,
    /// The highest log index known committed (etcd's `proposals_committed_total`).
    pub committed_index: AtomicU64,
    /// The highest log index applied (etcd's `proposals_applied_total`).
    pub applied_index: AtomicU64,
    /// Proposals waiting to apply (etcd's `proposals_pending`).
    pub proposals_pending: AtomicU64,
    /// Proposals that failed to commit: no leader, timed out, replaced by another leader's
    /// entries, or cut off by a stop (etcd's `proposals_failed_total`).
    pub proposals_failed: AtomicU64,
    /// The log's fsyncs.
    pub wal_fsync: DiskHistogram,
    /// The store's backend transactions, with their sync when one was asked for.
    pub backend_commit: DiskHistogram,
    /// Log compactions (each one after a store sync).
    pub log_compactions: AtomicU64,
    /// Snapshots sent to followers.
    pub snapshots_sent: AtomicU64,
    /// Snapshots from a leader installed here.
    pub snapshots_installed: AtomicU64,
    /// Bytes to and from each peer, counted by the transport.
    pub peers: Arc<cairn_transport::PeerTraffic>,
}

impl EngineMetrics {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn set(gauge: &AtomicU64, v: u64) {
        gauge.store(v, Ordering::Relaxed);
    }

    /// Reads a counter or gauge.
    pub fn get(v: &AtomicU64) -> u64 {
        v.load(Ordering::Relaxed)
    }
}

/// The log's directory, each fsync of its files timed (etcd's `wal_fsync_duration_seconds`).
/// The replica keeps no clock; its seam to the disk is where the time is taken.
#[derive(Debug)]
pub(crate) struct TimedDir {
    dir: OsDir,
    metrics: Arc<EngineMetrics>,
}

impl TimedDir {
    pub(crate) fn new(dir: OsDir, metrics: Arc<EngineMetrics>) -> TimedDir {
        TimedDir { dir, metrics }
    }
}

impl Dir for TimedDir {
    type File = TimedFile;

    fn open(&self, name: &str) -> io::Result<TimedFile> {
        Ok(TimedFile { file: self.dir.open(name)?, metrics: self.metrics.clone() })
    }

    fn list(&self) -> io::Result<Vec<String>> {
        self.dir.list()
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        self.dir.remove(name)
    }

    fn sync(&self) -> io::Result<()> {
        self.dir.sync()
    }
}

/// A log file whose fsyncs are timed.
#[derive(Debug)]
pub(crate) struct TimedFile {
    file: OsFile,
    metrics: Arc<EngineMetrics>,
}

impl File for TimedFile {
    fn size(&self) -> io::Result<u64> {
        self.file.size()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_at(offset, buf)
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file.write_at(offset, data)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        let started = Instant::now();
        self.file.sync_data()?;
        self.metrics.wal_fsync.observe(started.elapsed());
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn histogram_buckets_have_etcd_bounds_and_one_above() {
        let h = DiskHistogram::default();
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(10));
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.buckets.len(), 15);
        assert_eq!(s.buckets[0], (0.001, 1));
        assert_eq!(s.buckets[1], (0.002, 0));
        assert_eq!(s.buckets[2], (0.004, 1));
        assert_eq!(s.buckets[13], (8.192, 0));
        // 10 s is above every bound.
        assert_eq!(s.buckets[14], (f64::INFINITY, 1));
        assert!((s.sum_seconds - 10.0035).abs() < 1e-9);
    }
}
