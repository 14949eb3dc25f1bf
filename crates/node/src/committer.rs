//! The store's committer: makes executed batches durable in the backend, syncs it when the log
//! wants to compact, and removes compacted history in bounded steps — all off the thread that
//! orders writes, whose only disk work is the log.
//!
//! [`Committer`] is the logic; [`spawn`] runs it on a thread that gathers work for
//! [`COMMIT_INTERVAL`] per backend transaction. The simulator calls the same [`Committer`] at
//! moments of its choosing.

use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_kv::backend::{Backend, BackendError};
use cairn_kv::{Prepared, Store};
use cairn_raft::LogIndex;

use crate::error::StorageError;
use crate::metrics::EngineMetrics;

/// Executed batches, and whether the store must be made durable, waiting for a commit.
#[derive(Debug)]
pub struct Committer<B: Backend> {
    store: Arc<Store<B>>,
    batches: Vec<Prepared>,
    sync_wanted: bool,
}

impl<B: Backend> Committer<B> {
    pub fn new(store: Arc<Store<B>>) -> Committer<B> {
        Committer { store, batches: Vec::new(), sync_wanted: false }
    }

    /// Queues an executed batch; batches commit in the order they were executed.
    pub fn push(&mut self, batch: Prepared) {
        self.batches.push(batch);
    }

    /// The next [`Committer::commit`] also makes the store durable.
    pub fn want_sync(&mut self) {
        self.sync_wanted = true;
    }

    pub fn queued(&self) -> usize {
        self.batches.len()
    }

    /// Commits every queued batch in one backend transaction. If a sync was asked for, makes
    /// everything committed durable and returns the applied index it covers.
    pub fn commit(&mut self) -> Result<Option<LogIndex>, BackendError> {
        if !self.batches.is_empty() {
            self.store.commit(std::mem::take(&mut self.batches))?;
        }
        if !std::mem::take(&mut self.sync_wanted) {
            return Ok(None);
        }
        Ok(Some(LogIndex(self.store.sync()?)))
    }

    /// One bounded step of physical compaction: removes at most `max` unreachable records.
    /// Returns whether work remains.
    pub fn compact_step(&mut self, max: usize) -> Result<bool, BackendError> {
        if !self.store.compaction_work() {
            return Ok(false);
        }
        self.store.compact_step(max)
    }

    pub fn store(&self) -> &Arc<Store<B>> {
        &self.store
    }
}

/// How long the committer gathers executed batches into one backend transaction. Writes are
/// answered before this (the WAL holds them), so it costs no latency; it keeps the store's fsync
/// from contending with the log's on every write.
pub const COMMIT_INTERVAL: Duration = Duration::from_millis(25);
/// Executed batches the committer may fall behind by before the driver waits (backpressure). It
/// holds more than one interval of batches at a few thousand batches per second, so the driver
/// rarely has to wake the committer early.
pub const COMMIT_QUEUE: usize = 256;
/// Batches one backend transaction takes at most.
const BATCH_MAX: usize = 4096;
/// History records one compaction step removes.
const COMPACT_STEP: usize = 1024;

/// Work for the committer thread.
#[derive(Debug)]
// A batch is sent once per commit interval, not per request: its 224 bytes on the channel cost
// less than a box's allocation.
#[allow(clippy::large_enum_variant)]
pub enum Job {
    Batch(Prepared),
    /// Make the store durable after committing what came before.
    Sync,
}

/// What the committer thread tells the driver.
#[derive(Debug)]
pub enum Report {
    /// The store is durable up to this index.
    Durable(LogIndex),
    /// Physical compaction has finished: answer who waits for it.
    CompactionDone,
    /// The backend failed; the committer stopped.
    Failed(BackendError),
}

/// The driver's end of a running committer thread.
#[derive(Debug)]
pub struct Handle {
    jobs: Option<SyncSender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Why the committer stopped, set before it lets go of its queue: a driver that finds the
    /// queue closed reports this cause, not merely that the committer is gone.
    failure: Arc<Mutex<Option<BackendError>>>,
}

/// Starts the committer thread for `store`; it sends its reports through `report` (which says
/// whether the driver still listens).
pub fn spawn<B: Backend + 'static>(
    name: &str,
    store: Arc<Store<B>>,
    metrics: Arc<EngineMetrics>,
    report: impl Fn(Report) -> bool + Send + 'static,
) -> std::io::Result<Handle> {
    let (jobs_tx, jobs) = std::sync::mpsc::sync_channel(COMMIT_QUEUE);
    let failure = Arc::new(Mutex::new(None));
    let failed = failure.clone();
    let thread =
        std::thread::Builder::new().name(format!("cairn-commit-{name}")).spawn(move || {
            if let Err(e) = run(Committer::new(store), &jobs, &report, &metrics) {
                *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
                report(Report::Failed(e));
            }
            // `jobs` is dropped only now, after the failure is recorded.
            drop(jobs);
        })?;
    Ok(Handle { jobs: Some(jobs_tx), thread: Some(thread), failure })
}

impl Handle {
    /// Hands a job to the committer. Batches do not wake it (it gathers for a whole interval,
    /// and a wakeup per write batch costs a context switch each); a full queue does, and then
    /// this waits. Fails if the committer has stopped.
    pub fn send(&self, job: Job) -> Result<(), StorageError> {
        let jobs = self.jobs.as_ref().ok_or(StorageError::CommitterGone)?;
        match jobs.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(job)) => {
                self.wake();
                jobs.send(job).map_err(|_| self.gone())
            }
            Err(TrySendError::Disconnected(_)) => Err(self.gone()),
        }
    }

    /// Why the committer is gone: its failure if it had one.
    fn gone(&self) -> StorageError {
        match self.failure.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            Some(e) => StorageError::Backend(e),
            None => StorageError::CommitterGone,
        }
    }

    fn wake(&self) {
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }

    /// Lets the committer commit what it was given, and waits for it to exit.
    pub fn stop(&mut self) {
        self.jobs = None;
        self.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The committer thread: gathers batches for [`COMMIT_INTERVAL`] per transaction (it sleeps
/// through the interval; the driver wakes it early only when its queue is full or it stops),
/// and between transactions removes compacted history in bounded steps.
fn run<B: Backend>(
    mut c: Committer<B>,
    jobs: &Receiver<Job>,
    report: &dyn Fn(Report) -> bool,
    metrics: &EngineMetrics,
) -> Result<(), BackendError> {
    let mut last_commit = Instant::now();
    loop {
        let open = if c.store().compaction_work() {
            take_ready_jobs(&mut c, jobs)
        } else {
            gather(&mut c, jobs, last_commit + COMMIT_INTERVAL)
        };
        let busy = c.queued() > 0 || c.sync_wanted;
        let started = Instant::now();
        let durable = c.commit()?;
        last_commit = Instant::now();
        if busy {
            metrics.backend_commit.observe(last_commit - started);
        }
        if let Some(index) = durable {
            report(Report::Durable(index));
        }
        let had_work = c.store().compaction_work();
        if had_work && !c.compact_step(COMPACT_STEP)? {
            report(Report::CompactionDone);
        }
        if !open {
            return Ok(());
        }
    }
}

fn accept<B: Backend>(c: &mut Committer<B>, job: Job) {
    match job {
        Job::Batch(p) => c.push(p),
        Job::Sync => c.want_sync(),
    }
}

/// Takes whatever is queued without waiting (compaction has work to do meanwhile). Returns
/// whether the driver is still connected.
fn take_ready_jobs<B: Backend>(c: &mut Committer<B>, jobs: &Receiver<Job>) -> bool {
    while c.queued() < BATCH_MAX {
        match jobs.try_recv() {
            Ok(job) => accept(c, job),
            Err(TryRecvError::Empty) => return true,
            Err(TryRecvError::Disconnected) => return false,
        }
    }
    true
}

/// Waits for a first job, then gathers until `deadline`, a full transaction, or a wakeup.
/// Returns whether the driver is still connected.
fn gather<B: Backend>(c: &mut Committer<B>, jobs: &Receiver<Job>, deadline: Instant) -> bool {
    match jobs.recv() {
        Ok(job) => accept(c, job),
        Err(_) => return false,
    }
    loop {
        if !take_ready_jobs(c, jobs) {
            return false;
        }
        let now = Instant::now();
        if c.queued() >= BATCH_MAX || now >= deadline {
            return true;
        }
        // Woken early by the driver (see `Handle::send`), or spuriously: either way the queue
        // is drained again and the deadline checked.
        std::thread::park_timeout(deadline - now);
    }
}
