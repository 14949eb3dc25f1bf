//! The server's memory, read from /proc when it runs on this machine (`--server-pid`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the sampler reads the RSS.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);

/// A process's resident set size in KiB (`VmRSS` of /proc/<pid>/status), if it can be read.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    line.split_whitespace().next()?.parse().ok()
}

/// Reads a process's RSS every [`SAMPLE_EVERY`] until finished, keeping the peak.
#[derive(Debug)]
pub struct RssSampler {
    pid: u32,
    start: Option<u64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<u64>,
}

impl RssSampler {
    pub fn start(pid: u32) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut peak = 0;
            loop {
                peak = peak.max(rss_kib(pid).unwrap_or(0));
                if flag.load(Ordering::Relaxed) {
                    return peak;
                }
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
        });
        RssSampler { pid, start: rss_kib(pid), stop, task }
    }

    /// Stops sampling; returns the RSS at the start, the peak and the RSS now (KiB, 0 when the
    /// process could not be read).
    pub async fn finish(self) -> [(&'static str, u64); 3] {
        self.stop.store(true, Ordering::Relaxed);
        let end = rss_kib(self.pid).unwrap_or(0);
        let peak = self.task.await.unwrap_or(0).max(end);
        [
            ("server_rss_start_kib", self.start.unwrap_or(0)),
            ("server_rss_peak_kib", peak),
            ("server_rss_end_kib", end),
        ]
    }
}
