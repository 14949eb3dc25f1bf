//! `cargo xtask ci`: every check cairn's CI runs, in the order a developer wants failures.
//!
//! 1. formatting (`cargo fmt --check`);
//! 2. lints (`cargo clippy -D warnings` on every target);
//! 3. tests (unit, paper, interaction scripts with golden output, property tests, the simulator's
//!    planted-bug tests, the tidy checks in this crate) and doc tests; then three processes
//!    that each embed an engine form a cluster and lose their leader (`embedded_member
//!    --demo`, the binary the tests built), and the README's embedding program is built
//!    without the `server` feature;
//! 4. documentation builds without warnings;
//! 5. the simulator over 1,000 seeds (3 and 5 voters, both read modes, membership changes), then
//!    300 seeds at ten times the fault rate, then 300 seeds of the stack mix (every KV operation,
//!    power loss, the client history checked for linearizability);
//! 6. the compatibility suites against a release `cairn`: Debian's etcdctl (installed with apt
//!    if missing; also with JWT auth tokens), `cairn bench` against Debian's etcd and cairn,
//!    the comparison runner in its
//!    quick mode, and the official Go client (`tests/compat`, modules from the Go proxy), whose
//!    suite then runs against Debian's etcd too, to check its expectations against etcd itself;
//!    then `tests/kubernetes` (etcd client 3.6's kubernetes interface) the same two ways. The Go
//!    suites' shared helpers (`tests/harness`, a module of their own) are tested first.
//!
//! 7. the fault harness (`tests/cluster`): 3-member clusters of real processes under kill -9,
//!    SIGSTOP, partitions and leadership moves, histories judged by porcupine, over three seeds;
//!    cairn with a planted stale-read bug, which must be caught; then one seed against Debian's
//!    etcd, which checks the harness itself.
//!
//! `cargo xtask cluster-soak [DURATION]` runs the fault harness on fresh seeds for DURATION
//! (default 30m). `cargo xtask sim-soak` runs the long simulation documented for humans: 100,000 core seeds,
//! 20,000 at twenty times the fault rate with one entry per message, and 100,000 stack seeds.

mod embed;
mod harnesses;
mod tidy;

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Instant;

fn cargo_program() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn cargo(args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    run(".", &cargo_program(), args, env)
}

/// Where cargo puts what it builds, as cargo itself resolves it (`$CARGO_TARGET_DIR`,
/// `build.target-dir`, or `target/`): CI machines and shared hosts often move it.
fn target_dir(env: &[(&str, &str)]) -> Result<PathBuf, String> {
    let mut cmd = Command::new(cargo_program());
    cmd.args(["metadata", "--format-version", "1", "--no-deps"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("cargo metadata printed no JSON: {e}"))?;
    meta["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| "cargo metadata gave no target_directory".into())
}

/// The optimized profile the checks build with: `release` as users get it, but without its
/// whole-program (fat) LTO and single codegen unit, which make the binary small and the build
/// several times longer, and CI builds cairn three times (see `[profile.ci]`).
const PROFILE: &str = "ci";

/// An optimized binary of this workspace, by name, as a string for the harnesses' environment.
fn release_bin(name: &str) -> Result<String, String> {
    let bin = target_dir(&[])?.join(PROFILE).join(name);
    bin.into_os_string().into_string().map_err(|_| "non-UTF-8 target directory".into())
}

/// Runs an example that `cargo test --workspace` built: cargo builds every example for its
/// tests (`debug/examples/`, test profile), so this compiles nothing, where `cargo run -p cairn`
/// would resolve one package's features rather than the workspace's and rebuild much of the
/// tree (a minute and more on CI's two cores).
fn built_example(name: &str, args: &[&str]) -> Result<(), String> {
    let bin = target_dir(&[])?.join("debug").join("examples").join(name);
    if !bin.is_file() {
        return Err(format!("{} is missing: `cargo test --workspace` builds it", bin.display()));
    }
    let bin = bin.into_os_string().into_string().map_err(|_| "non-UTF-8 target directory")?;
    run(".", &bin, args, &[])
}

fn sim(args: &[&str]) -> Result<(), String> {
    let mut all = vec!["run", "--quiet", "--profile", PROFILE, "--package", "cairn-sim", "--"];
    all.extend_from_slice(args);
    cargo(&all, &[])
}

/// Installs the toolchain components the checks need, so `cargo xtask ci` works on a bare
/// machine that has only rustup's default profile.
fn ensure_components() -> Result<(), String> {
    let have = |sub: &str| {
        Command::new("cargo").args([sub, "--version"]).output().is_ok_and(|o| o.status.success())
    };
    if have("fmt") && have("clippy") {
        return Ok(());
    }
    println!("==> rustup component add rustfmt clippy");
    let status = Command::new("rustup")
        .args(["component", "add", "rustfmt", "clippy"])
        .status()
        .map_err(|e| format!("rustfmt or clippy missing and rustup not found: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err("could not install rustfmt and clippy".into())
    }
}

fn run(dir: &str, program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    let started = Instant::now();
    println!("==> {program} {}", args.join(" "));
    let mut cmd = Command::new(program);
    cmd.args(args).current_dir(dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let status = cmd.status().map_err(|e| format!("cannot run {program}: {e}"))?;
    println!("    ({:.1}s)", started.elapsed().as_secs_f64());
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{program} {}` failed ({status})", args.join(" ")))
    }
}

fn have(program: &str) -> bool {
    Command::new(program).arg("version").output().is_ok()
}

/// Debian's etcdctl and etcd, for the smoke tests; installed if missing (CI runs as root).
fn ensure_etcd_packages() -> Result<(), String> {
    let etcd_present = std::path::Path::new("/usr/bin/etcd").exists();
    if have("etcdctl") && etcd_present {
        return Ok(());
    }
    run(".", "apt-get", &["update", "-qq"], &[])?;
    let pkgs = ["install", "-y", "-qq", "--no-install-recommends", "etcd-client", "etcd-server"];
    run(".", "apt-get", &pkgs, &[("DEBIAN_FRONTEND", "noninteractive")])
}

/// The compatibility suites that drive a real `cairn` binary: etcdctl and the Go client.
fn compat() -> Result<(), String> {
    cargo(&["build", "--profile", PROFILE, "--quiet", "--package", "cairn"], &[])?;
    let bin = &release_bin("cairn")?;
    ensure_etcd_packages()?;
    run(".", "bash", &["tests/etcdctl_smoke.sh"], &[("CAIRN_BIN", bin)])?;
    run(".", "bash", &["tests/etcdctl_jwt.sh"], &[("CAIRN_BIN", bin)])?;
    run(".", "bash", &["tests/bench_smoke.sh"], &[("CAIRN_BIN", bin)])?;
    // The comparison runner in its quick mode (one small round, report under /tmp), so the
    // script that produces bench/results keeps working.
    run(".", "python3", &["scripts/compare.py", "--quick"], &[("CAIRN_BIN", bin)])?;
    if !have("go") {
        return Err("Go is needed for tests/compat (the official etcd client); install it".into());
    }
    // The harness the Go suites share (a local module they take by `replace`), on its own first:
    // a broken helper then fails here, by name, rather than as every suite's start-up error.
    run("tests/harness", "go", &["test", "-count=1", "./..."], &[])?;
    run("tests/compat", "go", &["test", "-count=1", "./..."], &[("CAIRN_BIN", bin)])?;
    // The same suite against Debian's etcd: the expectations are claims about etcd's behaviour,
    // so etcd itself must pass them too.
    run("tests/compat", "go", &["test", "-count=1", "./..."], &[("COMPAT_ETCD", "/usr/bin/etcd")])?;
    // What kube-apiserver relies on, through etcd client 3.6's kubernetes interface; also
    // checked against Debian's etcd.
    run("tests/kubernetes", "go", &["test", "-count=1", "./..."], &[("CAIRN_BIN", bin)])?;
    run("tests/kubernetes", "go", &["test", "-count=1", "./..."], &[("K8S_ETCD", "/usr/bin/etcd")])
}

/// The fault harness against real clusters (see `tests/cluster`). `env` adds to what it sets.
fn cluster(env: &[(&str, &str)], go_args: &[&str]) -> Result<(), String> {
    // The planted-bug build first, kept aside, then the real one back in its place.
    cargo(
        &["build", "--profile", PROFILE, "--quiet", "-p", "cairn", "--features", "planted-bugs"],
        &[],
    )?;
    let (bin, planted) = (release_bin("cairn")?, release_bin("cairn-planted")?);
    std::fs::copy(&bin, &planted).map_err(|e| format!("cannot keep the planted-bug build: {e}"))?;
    cargo(&["build", "--profile", PROFILE, "--quiet", "-p", "cairn"], &[])?;
    if !have("go") {
        return Err("Go is needed for tests/cluster (the official etcd client); install it".into());
    }
    let mut all = vec![("CAIRN_BIN", bin.as_str()), ("CAIRN_PLANTED_BIN", planted.as_str())];
    all.extend_from_slice(env);
    let mut args = vec!["test", "-count=1", "-v"];
    args.extend_from_slice(go_args);
    args.push("./...");
    run("tests/cluster", "go", &args, &all)
}

/// Each phase of `cargo xtask ci` with its wall time, printed at the end (also when a phase
/// fails), so a CI log says where its minutes went.
struct Phases(Vec<(&'static str, std::time::Duration)>);

impl Phases {
    fn run(
        &mut self,
        name: &'static str,
        f: impl FnOnce() -> Result<(), String>,
    ) -> Result<(), String> {
        let start = Instant::now();
        let result = f();
        self.0.push((name, start.elapsed()));
        result
    }
}

impl Drop for Phases {
    fn drop(&mut self) {
        let total: std::time::Duration = self.0.iter().map(|(_, d)| *d).sum();
        eprintln!("\nxtask ci: wall time by phase");
        for (name, d) in &self.0 {
            eprintln!("  {name:<34} {:>4}:{:02}", d.as_secs() / 60, d.as_secs() % 60);
        }
        eprintln!("  {:<34} {:>4}:{:02}", "total", total.as_secs() / 60, total.as_secs() % 60);
    }
}

fn ci() -> Result<(), String> {
    ensure_components()?;
    let mut p = Phases(Vec::new());
    p.run("fmt", || cargo(&["fmt", "--all", "--check"], &[]))?;
    p.run("clippy", || {
        cargo(&["clippy", "--workspace", "--all-targets", "--quiet", "--", "-D", "warnings"], &[])
    })?;
    p.run("cargo test", || cargo(&["test", "--workspace"], &[]))?;
    // Three programs that each embed an engine form one cluster; the leader's is killed.
    p.run("embedded cluster (3 processes)", || built_example("embedded_member", &["--demo"]))?;
    // The README's embedding program, built as an embedder builds it: without the server.
    p.run("embed example (no server)", || {
        cargo(
            &["run", "--quiet", "-p", "cairn", "--no-default-features", "--example", "embed"],
            &[],
        )
    })?;
    p.run("rustdoc", || {
        cargo(&["doc", "--workspace", "--no-deps", "--quiet"], &[("RUSTDOCFLAGS", "-D warnings")])
    })?;
    p.run("simulator", || {
        sim(&["--seeds", "1..1000"])?;
        sim(&["--seeds", "1001..1300", "--chaos", "10"])?;
        // Slow log syncs: crashes and elections land between a write and its sync.
        sim(&["--seeds", "1301..1500", "--async-writes", "--sync-rate", "0.01"])?;
        sim(&["--stack", "--seeds", "1..300"])
    })?;
    p.run("compat (etcdctl, Go client, k8s)", compat)?;
    p.run("cluster fault harness", || cluster(&[], &[]))?;
    // One seed against etcd: every expectation of the harness holds for etcd too.
    let etcd = [("CLUSTER_ETCD", "/usr/bin/etcd"), ("FAULT_SEEDS", "1")];
    p.run("cluster harness vs etcd", || {
        run("tests/cluster", "go", &["test", "-count=1", "./..."], &etcd)
    })
}

fn main() -> ExitCode {
    let task = std::env::args().nth(1).unwrap_or_default();
    let result = match task.as_str() {
        "ci" => ci(),
        "compat" => compat(),
        "cluster" => cluster(&[], &[]),
        "cluster-soak" => {
            let d = std::env::args().nth(2).unwrap_or_else(|| "30m".into());
            cluster(
                &[("FAULT_SOAK", &d)],
                &["-timeout", "0", "-run", "TestLinearizableUnderFaults"],
            )
        }
        "sim-soak" => sim(&["--seeds", "1..100000"])
            .and_then(|()| sim(&["--seeds", "1..20000", "--chaos", "20", "--max-msg-bytes", "1"]))
            .and_then(|()| sim(&["--seeds", "1..20000", "--async-writes", "--sync-rate", "0.01"]))
            .and_then(|()| sim(&["--stack", "--seeds", "1..100000"])),
        _ => Err("usage: cargo xtask ci | compat | cluster | cluster-soak [30m] | sim-soak".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The binary the harnesses get is where cargo builds it, wherever CARGO_TARGET_DIR sends
    /// it: `target/release/cairn` was hard-coded, and missing on machines that set it.
    #[test]
    fn the_target_directory_is_cargos() {
        let elsewhere = std::env::temp_dir().join("cairn-xtask-target");
        let dir = elsewhere.to_str().expect("utf-8");
        assert_eq!(target_dir(&[("CARGO_TARGET_DIR", dir)]), Ok(elsewhere));
        // A relative one is relative to where cargo runs, as cargo takes it.
        let relative = target_dir(&[("CARGO_TARGET_DIR", "rel-target")]).expect("relative");
        assert!(relative.is_absolute() && relative.ends_with("rel-target"), "{relative:?}");
    }
}
