//! The Prometheus client libraries' standard process metrics (`process_*`), which etcd exports
//! through Go's client, read from `/proc/self` at scrape time.

use prometheus_client::encoding::DescriptorEncoder;

use super::{counter_f64, gauge};

/// Clock ticks per second for `/proc/self/stat`'s times: 100 on every Linux platform Rust
/// supports (the kernel's USER_HZ, fixed by its ABI).
const TICKS_PER_SECOND: f64 = 100.0;

/// What `/proc/self/stat` says, past the command name (which may hold spaces).
struct Stat {
    cpu_seconds: f64,
    start_ticks: u64,
    virtual_bytes: u64,
}

fn stat() -> Option<Stat> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    // Fields from the state (the third in `man 5 proc`) on.
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    Some(Stat {
        cpu_seconds: (field(14)? + field(15)?) as f64 / TICKS_PER_SECOND,
        start_ticks: field(22)?,
        virtual_bytes: field(23)?,
    })
}

/// The resident set, from `/proc/self/status` (in kB there, which spares asking for the page
/// size).
fn resident_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = text.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    Some(kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok()? * 1024)
}

/// The boot time, from `/proc/stat`, to turn the start time in ticks since boot into a date.
fn boot_seconds() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    text.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

fn open_fds() -> Option<usize> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count())
}

fn max_fds() -> Option<u64> {
    let limits = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    limits.current
}

pub(super) fn encode(enc: &mut DescriptorEncoder) -> std::fmt::Result {
    if let Some(s) = stat() {
        let cpu = "Total user and system CPU time spent in seconds.";
        counter_f64(enc, "process_cpu_seconds", cpu, s.cpu_seconds)?;
        let vsize = "Virtual memory size in bytes.";
        gauge(enc, "process_virtual_memory_bytes", vsize, s.virtual_bytes as f64)?;
        if let Some(boot) = boot_seconds() {
            let start = boot as f64 + s.start_ticks as f64 / TICKS_PER_SECOND;
            let help = "Start time of the process since unix epoch in seconds.";
            gauge(enc, "process_start_time_seconds", help, start)?;
        }
    }
    if let Some(rss) = resident_bytes() {
        gauge(enc, "process_resident_memory_bytes", "Resident memory size in bytes.", rss as f64)?;
    }
    if let Some(n) = open_fds() {
        // Less the one this count held open while it read.
        let n = n.saturating_sub(1);
        gauge(enc, "process_open_fds", "Number of open file descriptors.", n as f64)?;
    }
    if let Some(n) = max_fds() {
        let help = "Maximum number of open file descriptors.";
        gauge(enc, "process_max_fds", help, n as f64)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_start_time_memory_and_descriptors() {
        let s = stat().expect("/proc/self/stat parses");
        assert!(s.virtual_bytes > 0 && s.cpu_seconds >= 0.0);
        assert!(resident_bytes().expect("VmRSS") > 0);
        assert!(boot_seconds().expect("btime") > 1_500_000_000);
        assert!(open_fds().expect("fd dir") >= 3);
        assert!(max_fds().expect("a limit") >= 3);
    }
}
