//! The log's sync thread: fdatasyncs the write-ahead log while the driver goes on (asynchronous
//! storage writes, as etcd raft's `AsyncStorageWrites`).
//!
//! The driver writes a `Ready`'s entries and hands the sync here (through the active segment
//! opened a second time: see `Wal::sync_handle`); it meanwhile takes the next
//! inputs, sends, applies what is durable and writes the next entries. A sync covers every write
//! made before it starts, so the thread takes every request queued and syncs once for the newest
//! (a request for an older segment is covered already: the log syncs a segment before it moves
//! past it). It reports the newest write number covered; the driver then lets the core count
//! those entries and sends the acknowledgements that waited for them.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_storage::fs::File;
use cairn_storage::SyncHandle;

use crate::config::LogSync;
use crate::driver::{Input, InputTx};
use crate::error::StorageError;
use crate::metrics::{DiskHistogram, TimedFile};

/// One request: make writes up to `write` durable, through `file` if it brings a new segment's
/// handle (else the last one given).
struct Request<F> {
    write: u64,
    file: Option<SyncHandle<F>>,
}

/// [`AutoPolicy`] moves syncs to the thread once the log's fsyncs average this long...
const SLOW_FSYNC_MICROS: u64 = 500;
/// ...and back once they average under this (apart, so a disk near the line does not flip).
const FAST_FSYNC_MICROS: u64 = 300;
/// The average is taken over a second at least (shorter windows of this disk's fsyncs under
/// load range from 200 to 500 µs), and 16 fsyncs.
const SAMPLE_WINDOW: Duration = Duration::from_secs(1);
const SAMPLE_FSYNCS: u64 = 16;
/// The thread pays only while others wait behind a sync: [`AutoPolicy`] moves syncs there
/// only once the log's writes carry this many entries each on average, or the driver's turns
/// take this many requests (in tenths)...
const SHARED_WRITES_TENTHS: u64 = 15;
/// ...and back once both are fewer than this: one client's puts, written one by one, gain
/// nothing from the thread and pay its two hand-offs (7% of their rate on 3 members sharing
/// a disk whose fsyncs averaged 600-900 µs, bench/results/2026-11-29-auto-sync.md).
const LONE_WRITES_TENTHS: u64 = 12;

/// The driver's side of the sync thread. Dropping it stops the thread.
#[derive(Debug)]
pub(crate) struct LogSyncer {
    tx: Sender<Request<TimedFile>>,
    /// The segment of the handle last given; a request for another brings a new handle.
    segment: Option<u64>,
    /// Under [`LogSync::Auto`], what decides where syncs run; `None`: always on the thread.
    auto: Option<AutoPolicy>,
    /// Turns that took clients' requests, and the requests they took ([`Totals::requests`]).
    requests: (u64, u64),
    /// A failed sync, set by the thread before it reports it: the driver checks it before
    /// every turn, so no later sync (inline, or a rotation's) can count writes durable that
    /// the failed one left unsynced, and the failure's cause is what the engine reports.
    failure: Arc<Mutex<Option<StorageError>>>,
}

/// Where [`LogSync::Auto`] syncs: on the driver's thread while the log's fsyncs are fast or
/// its writes are a lone writer's, on the sync thread once fsyncs are slow and writers share
/// them. A short fsync stalls the driver less than the two hand-offs to the thread and back
/// cost it (on a machine short of cores, each is a context switch); a long one stalls every
/// client behind it, but only if someone is behind it. Measured on a 2-core machine with 3
/// members (bench/results/2026-11-29-log-sync.md): with this disk's fsyncs (100-400 µs) the
/// thread costs one client's puts 17% and gains 100 clients nothing; with 2 ms added to each,
/// it carries 54% more puts from 100 clients.
#[derive(Debug)]
pub(crate) struct AutoPolicy {
    on_thread: bool,
    /// The totals when the averages were last taken, and when.
    sampled: (Totals, Instant),
}

/// What [`AutoPolicy`] averages over a window, as running totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    /// The fsync histogram's count and sum (ns).
    pub(crate) fsyncs: (u64, u64),
    /// The log's writes that carried entries, and their entries
    /// ([`crate::replica::Replica::log_write_totals`]).
    pub(crate) writes: (u64, u64),
    /// The driver's turns that took clients' requests, and the requests they took: reads
    /// wait behind an inline sync too, though they write nothing.
    pub(crate) requests: (u64, u64),
}

impl AutoPolicy {
    pub(crate) fn new(now: Instant) -> AutoPolicy {
        AutoPolicy { on_thread: false, sampled: (Totals::default(), now) }
    }

    /// Given the running totals, and the time (read only once enough fsyncs were counted,
    /// since this runs every turn): whether to sync on the thread.
    pub(crate) fn decide(&mut self, t: Totals, now: impl FnOnce() -> Instant) -> bool {
        let (t0, at) = self.sampled;
        let fsyncs = t.fsyncs.0.saturating_sub(t0.fsyncs.0);
        if fsyncs < SAMPLE_FSYNCS {
            return self.on_thread;
        }
        let now = now();
        if now.saturating_duration_since(at) < SAMPLE_WINDOW {
            return self.on_thread;
        }
        let mean_micros = t.fsyncs.1.saturating_sub(t0.fsyncs.1) / fsyncs / 1000;
        // How many wait behind one sync: the entries a write carries (a follower's appends, a
        // leader's proposals) or the requests a turn takes (reads too), whichever is more. No
        // write and no request in the window (heartbeats only): nobody.
        let per = |(n, sum): (u64, u64), (n0, sum0): (u64, u64)| {
            (sum.saturating_sub(sum0) * 10).checked_div(n.saturating_sub(n0)).unwrap_or(0)
        };
        let sharing_tenths = per(t.writes, t0.writes).max(per(t.requests, t0.requests));
        self.sampled = (t, now);
        let was = self.on_thread;
        if mean_micros >= SLOW_FSYNC_MICROS && sharing_tenths >= SHARED_WRITES_TENTHS {
            self.on_thread = true;
        } else if mean_micros < FAST_FSYNC_MICROS || sharing_tenths < LONE_WRITES_TENTHS {
            self.on_thread = false;
        }
        if self.on_thread != was {
            let place = if self.on_thread { "its own thread" } else { "the Raft thread" };
            let sharing = sharing_tenths as f64 / 10.0;
            tracing::info!(
                mean_micros,
                sharing,
                "the log's fsyncs average {mean_micros} µs, shared by {sharing} writes or \
                 requests each: syncing on {place}"
            );
        }
        self.on_thread
    }
}

impl<F> std::fmt::Debug for Request<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Request({})", self.write)
    }
}

impl LogSyncer {
    /// Starts the thread for `mode` (not [`LogSync::Inline`]); it reports through `reports`.
    pub(crate) fn spawn(name: &str, mode: LogSync, reports: InputTx) -> std::io::Result<LogSyncer> {
        debug_assert!(mode != LogSync::Inline, "an inline log needs no sync thread");
        let (tx, rx) = mpsc::channel();
        let failure = Arc::new(Mutex::new(None));
        let failed = failure.clone();
        std::thread::Builder::new()
            .name(format!("cairn-sync-{name}"))
            .spawn(move || run(&rx, &reports, &failed))?;
        let auto = (mode == LogSync::Auto).then(|| AutoPolicy::new(Instant::now()));
        Ok(LogSyncer { tx, segment: None, auto, requests: (0, 0), failure })
    }

    /// Whether this turn's writes are synced on the thread (else on the driver's, as they
    /// are written). [`LogSync::Auto`] decides by the log's recent fsyncs (`fsyncs`, timed on
    /// both threads) and writes (`writes`, the replica's totals): see [`AutoPolicy`].
    pub(crate) fn on_thread(&mut self, fsyncs: &DiskHistogram, writes: (u64, u64)) -> bool {
        let requests = self.requests;
        match &mut self.auto {
            None => true,
            Some(policy) => {
                policy.decide(Totals { fsyncs: fsyncs.totals(), writes, requests }, Instant::now)
            }
        }
    }

    /// A turn took `n` requests of clients (writes, reads, lease renewals).
    pub(crate) fn took_requests(&mut self, n: usize) {
        if n > 0 {
            self.requests.0 += 1;
            self.requests.1 += n as u64;
        }
    }

    /// The sync thread's failure, if it had one: the engine must stop.
    pub(crate) fn check(&self) -> Result<(), StorageError> {
        match self.failure.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Whether a request for `segment` needs a new handle.
    pub(crate) fn needs_handle(&self, segment: u64) -> bool {
        self.segment != Some(segment)
    }

    /// Asks for writes up to `write` to be made durable; `file` when [`LogSyncer::needs_handle`].
    pub(crate) fn sync(
        &mut self,
        write: u64,
        file: Option<SyncHandle<TimedFile>>,
    ) -> Result<(), StorageError> {
        if let Some(f) = &file {
            self.segment = Some(f.segment());
        }
        // The thread exits only after a failed sync, which it recorded first.
        match self.tx.send(Request { write, file }) {
            Ok(()) => Ok(()),
            Err(_) => self.check().and(Err(StorageError::SyncerGone)),
        }
    }
}

fn run<F: File>(
    rx: &Receiver<Request<F>>,
    reports: &InputTx,
    failure: &Mutex<Option<StorageError>>,
) {
    let mut file: Option<SyncHandle<F>> = None;
    while let Ok(first) = rx.recv() {
        let mut write = first.write;
        file = first.file.or(file);
        // Everything queued meanwhile rides with this one sync.
        for next in rx.try_iter() {
            write = next.write;
            file = next.file.or(file);
        }
        let Some(f) = file.as_mut() else { continue };
        match f.sync() {
            Ok(()) => {
                if reports.send(Input::LogSynced(write)).is_err() {
                    return;
                }
            }
            Err(e) => {
                let e = StorageError::from(e);
                *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
                // Wakes the driver, whose next turn finds the failure (`check`).
                let _ = reports.send(Input::LogSyncFailed(e));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_storage::faulty::FaultyDir;
    use cairn_storage::{Wal, WalOptions};

    #[test]
    fn a_failed_sync_is_recorded_before_it_is_reported_and_ends_the_thread() {
        let disk = FaultyDir::default();
        let (wal, _) = Wal::open(disk.clone(), WalOptions::default()).expect("a new log");
        let (tx, rx) = mpsc::channel();
        let (reports, inputs, _poll) = crate::driver::channel().expect("a queue");
        let failure = Arc::new(Mutex::new(None));
        let failed = failure.clone();
        let thread = std::thread::spawn(move || run(&rx, &reports, &failed));
        let handle = wal.sync_handle().expect("a handle");
        tx.send(Request { write: 1, file: Some(handle) }).expect("the thread runs");
        assert!(matches!(inputs.recv().expect("a report"), Input::LogSynced(1)));
        disk.fail_after(0);
        tx.send(Request { write: 2, file: None }).expect("the thread runs");
        let report = inputs.recv().expect("a report");
        assert!(matches!(report, Input::LogSyncFailed(_)), "{report:?}");
        let recorded = failure.lock().expect("not poisoned").is_some();
        assert!(recorded, "recorded for the driver's next turn");
        thread.join().expect("the thread ends after a failure");
        assert!(tx.send(Request { write: 3, file: None }).is_err(), "and takes no more");
    }

    /// Totals after `n` more fsyncs of `micros` each, and as many writes of `per_write`
    /// entries each.
    fn more(t: Totals, n: u64, micros: u64, per_write: u64) -> Totals {
        Totals {
            fsyncs: (t.fsyncs.0 + n, t.fsyncs.1 + n * micros * 1000),
            writes: (t.writes.0 + n, t.writes.1 + n * per_write),
            requests: (t.requests.0 + n, t.requests.1 + n),
        }
    }

    #[test]
    fn auto_moves_to_the_thread_on_slow_fsyncs_and_back_with_a_margin() {
        let t0 = Instant::now();
        let sec = |n: u64| t0 + Duration::from_secs(n);
        let mut p = AutoPolicy::new(t0);
        let mut t = Totals::default();
        t = more(t, 100, 150, 8);
        assert!(!p.decide(t, || sec(1)), "fast fsyncs stay inline");
        t = more(t, 100, 900, 8);
        assert!(!p.decide(t, || sec(1) + Duration::from_millis(500)), "within a second");
        assert!(p.decide(t, || sec(2)), "slow fsyncs move to the thread");
        t = more(t, 100, 400, 8);
        assert!(p.decide(t, || sec(3)), "between the two bounds, it stays");
        t = more(t, 10, 100, 8);
        assert!(p.decide(t, || sec(4)), "too few fsyncs to judge");
        t = more(t, 10, 100, 8);
        assert!(!p.decide(t, || sec(5)), "fast again: back inline");
    }

    /// One client's puts are written one by one: however slow the disk, nothing waits behind
    /// a sync, and the thread's hand-offs would only add to each put.
    #[test]
    fn auto_keeps_a_lone_writer_inline_however_slow_its_fsyncs() {
        let t0 = Instant::now();
        let sec = |n: u64| t0 + Duration::from_secs(n);
        let mut p = AutoPolicy::new(t0);
        let mut t = Totals::default();
        t = more(t, 100, 900, 1);
        assert!(!p.decide(t, || sec(1)), "one entry per write stays inline");
        // Heartbeats and votes alone: fsyncs but no write with entries.
        t.fsyncs = (t.fsyncs.0 + 100, t.fsyncs.1 + 100 * 900_000);
        assert!(!p.decide(t, || sec(2)), "no entries written: nobody waits");
        t = more(t, 100, 900, 3);
        assert!(p.decide(t, || sec(3)), "writers sharing slow fsyncs move to the thread");
        t = more(t, 70, 900, 1);
        t = more(t, 30, 900, 2);
        assert!(p.decide(t, || sec(4)), "1.3 entries a write, above 1.2: it stays");
        t = more(t, 100, 900, 1);
        assert!(!p.decide(t, || sec(5)), "a lone writer again: back inline");
        // One writer, and readers whose requests wait behind each inline sync.
        t = more(t, 100, 900, 1);
        t.requests.1 += 400;
        assert!(p.decide(t, || sec(6)), "reads sharing the turns move it to the thread");
    }
}
