//! Whether this process runs under a CPU bandwidth limit (a container's CPU limit).
//!
//! `--spin-wait` spends idle CPU to spare threads their wakeups. Under a CFS quota that CPU is
//! not idle for the process: every cycle counts against the quota, and a process that runs out
//! of it is stopped for the rest of the period (100 ms by default), which would cost far more
//! than the wakeups saved. So the default wait is off under a quota.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// `--spin-wait` when the flag is not given: none under a CPU quota, else 500 µs.
pub(crate) fn default_spin_wait() -> Duration {
    if limited() {
        tracing::info!("a CPU quota applies: threads sleep at once (--spin-wait 0)");
        Duration::ZERO
    } else {
        Duration::from_micros(500)
    }
}

/// True if the process's cgroup, or one above it, has a CPU quota (cgroup v2's `cpu.max`, or
/// v1's `cpu.cfs_quota_us`). Unreadable files count as no quota.
pub(crate) fn limited() -> bool {
    let Ok(cgroups) = std::fs::read_to_string("/proc/self/cgroup") else { return false };
    limited_in(&cgroups, Path::new("/sys/fs/cgroup"))
}

/// [`limited`] for the lines of `/proc/self/cgroup` and the cgroup file system at `root`.
fn limited_in(cgroups: &str, root: &Path) -> bool {
    candidates(cgroups, root).iter().any(|file| {
        std::fs::read_to_string(file).is_ok_and(|text| {
            if file.ends_with("cpu.max") {
                v2_limited(&text)
            } else {
                v1_limited(&text)
            }
        })
    })
}

/// The quota files that may apply, from `/proc/self/cgroup`'s lines: the process's cgroup and
/// every one above it, in either hierarchy.
fn candidates(cgroups: &str, root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (dir, file) = match controllers {
            // cgroup v2: one hierarchy, no controller list.
            "" => (root.to_path_buf(), "cpu.max"),
            c if c.split(',').any(|c| c == "cpu") => (root.join(c), "cpu.cfs_quota_us"),
            _ => continue,
        };
        let mut at = Some(Path::new(path.trim_start_matches('/')));
        while let Some(p) = at {
            files.push(dir.join(p).join(file));
            at = p.parent();
        }
    }
    files
}

/// cgroup v2's `cpu.max`: "max 100000" has no quota, "50000 100000" has one.
fn v2_limited(text: &str) -> bool {
    text.split_whitespace().next().is_some_and(|quota| quota != "max")
}

/// cgroup v1's `cpu.cfs_quota_us`: -1 has no quota.
fn v1_limited(text: &str) -> bool {
    text.trim().parse::<i64>().is_ok_and(|quota| quota > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_files_are_read_as_the_kernel_writes_them() {
        assert!(!v2_limited("max 100000\n"));
        assert!(v2_limited("50000 100000\n"));
        assert!(!v2_limited(""));
        assert!(!v1_limited("-1\n"));
        assert!(v1_limited("50000\n"));
        assert!(!v1_limited("garbage"));
    }

    #[test]
    fn every_cgroup_from_the_process_s_up_to_the_root_is_looked_at() {
        let paths = |p: &[&str]| p.iter().map(PathBuf::from).collect::<Vec<_>>();
        let root = Path::new("/cg");
        assert_eq!(
            candidates("0::/kubepods/pod1/ctr\n", root),
            paths(&[
                "/cg/kubepods/pod1/ctr/cpu.max",
                "/cg/kubepods/pod1/cpu.max",
                "/cg/kubepods/cpu.max",
                "/cg/cpu.max",
            ])
        );
        assert_eq!(
            candidates("4:memory:/x\n2:cpu,cpuacct:/docker/abc\n0::/\n", root),
            paths(&[
                "/cg/cpu,cpuacct/docker/abc/cpu.cfs_quota_us",
                "/cg/cpu,cpuacct/docker/cpu.cfs_quota_us",
                "/cg/cpu,cpuacct/cpu.cfs_quota_us",
                "/cg/cpu.max",
            ])
        );
    }

    #[test]
    fn a_quota_in_a_real_cgroup_tree_is_found() {
        let dir = std::env::temp_dir().join(format!("cairn-cgroup-{}", std::process::id()));
        let ctr = dir.join("pod/ctr");
        std::fs::create_dir_all(&ctr).expect("the cgroup directories");
        std::fs::write(ctr.join("cpu.max"), "max 100000\n").expect("the container's file");
        assert!(!limited_in("0::/pod/ctr\n", &dir), "no quota anywhere");
        std::fs::write(dir.join("pod/cpu.max"), "200000 100000\n").expect("the pod's file");
        let found = limited_in("0::/pod/ctr\n", &dir);
        std::fs::remove_dir_all(&dir).expect("the directories removed");
        assert!(found, "the pod's quota applies to its container");
    }
}
