//! The threads that do a large range's heavy work: counting, reading and encoding it.
//!
//! That work is tens of milliseconds of CPU per range and does not belong on the runtime's
//! threads (see large_response.rs). On tokio's blocking pool it competed with the put path's
//! threads (the runtime's, the Raft loop's, the committer's) on equal terms, so a put that woke
//! up behind four busy readers waited for the scheduler to get round to it. These threads run
//! at a lower CPU priority (nice [`NICE`]), so the scheduler prefers the short tasks of small
//! requests whenever both are ready; a range still gets the cores whenever nothing else wants
//! them. There are as many threads as cores: more would only queue inside the kernel.
//!
//! A low priority is safe only because these threads hold nothing a put waits for: a large
//! range walks a copy of the key index, not the index under the store's lock (cairn-kv's
//! store/read.rs). When they walked it under the lock, one that lost its core inside a step
//! made puts wait until it got one back (bench/results/2026-11-29-large-ranges-lock.md).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use tonic::Status;

/// The nice value of the bulk threads (0 is the default, 19 the lowest priority).
///
/// The lowest. At 10 (a CFS weight of 110 against the put path's 1,024) the readers still
/// showed in a put's p99; at 19 (weight 15), with 4 clients ranging 100,000 keys each, a
/// 1-client put's p99 fell from a median
/// of 5.5-5.8 ms to 4.5-4.6 ms (two sets of 6 alternating runs), and the readers' own rate did
/// not change (12.2-12.6 against 11.9-12.9 ranges/s beside that put; 8.0-8.1 against 8.0-8.7
/// beside 100 clients' puts): the cores are idle often enough for them.
const NICE: i32 = 19;

type Job = Box<dyn FnOnce() + Send>;

/// A fixed pool of low-priority threads.
pub struct BulkPool {
    jobs: mpsc::Sender<Job>,
}

impl std::fmt::Debug for BulkPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BulkPool").finish_non_exhaustive()
    }
}

impl BulkPool {
    /// Starts `threads` threads (at least one).
    ///
    /// # Errors
    /// A thread that could not be started.
    pub fn start(threads: usize) -> std::io::Result<Arc<BulkPool>> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..threads.max(1) {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("cairn-bulk-{i}"))
                .spawn(move || work(&queue))?;
        }
        Ok(Arc::new(BulkPool { jobs }))
    }

    /// Runs `job` on one of the pool's threads and waits (asynchronously) for its result.
    ///
    /// # Errors
    /// `Internal` if the job panicked (the thread survives it).
    pub async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, Status> {
        let (done, result) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            // A caller that has gone away does not want the result.
            let _ = done.send(job());
        });
        if self.jobs.send(job).is_err() {
            return Err(Status::unavailable("cairn: the server is stopping"));
        }
        result.await.map_err(|_| Status::internal("cairn: a range read failed (it panicked)"))
    }
}

/// A pool thread: lowers its own priority, then runs jobs until the pool is dropped.
fn work(queue: &Mutex<mpsc::Receiver<Job>>) {
    // On Linux the nice value is per thread; the `None` pid names the calling one. Relative
    // to the server's own: a server started with `nice` keeps its bulk threads below itself
    // (an absolute value would raise them above it, as root may).
    let own = rustix::process::getpriority_process(None).unwrap_or(0);
    if let Err(e) = rustix::process::setpriority_process(None, (own + NICE).min(19)) {
        tracing::warn!("range threads run at normal priority: setpriority failed: {e}");
    }
    loop {
        let job = match queue.lock() {
            Ok(queue) => queue.recv(),
            Err(_poisoned) => return,
        };
        let Ok(job) = job else { return };
        // The job's own result channel reports the panic to its caller.
        let _ = catch_unwind(AssertUnwindSafe(job));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_at_lower_priority_and_a_panic_leaves_the_pool_working() {
        let pool = BulkPool::start(1).expect("starts");
        let nice = pool.run(|| rustix::process::getpriority_process(None)).await;
        let before = rustix::process::getpriority_process(None).expect("own priority");
        assert_eq!(nice.expect("runs").expect("priority"), (before + NICE).min(19));
        let panicked = pool.run(|| -> u8 { panic!("a planted panic") }).await;
        assert!(panicked.expect_err("reported").message().contains("panicked"));
        assert_eq!(pool.run(|| 7).await.expect("the one thread still works"), 7);
    }
}
