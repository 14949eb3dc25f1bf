//! What an embedder of the `cairn` crate gets: the engine without the server's stack, and the
//! README's program, which CI runs (`cargo run -p cairn --no-default-features --example embed`).

#![cfg(test)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The server's stack: none of it may reach a build of `cairn` without its `server` feature.
const SERVER_ONLY: [&str; 8] = [
    "axum",
    "cairn-bench",
    "cairn-proto",
    "clap",
    "hyper",
    "indicatif",
    "tonic",
    "tracing-subscriber",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// The packages a build of `cairn` compiles (normal dependencies only), by name.
fn cairn_packages(features: &[&str]) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut args = vec!["tree", "-p", "cairn", "-e", "normal", "--prefix", "none"];
    args.extend_from_slice(&["--format", "{p}"]);
    args.extend_from_slice(features);
    let out = Command::new(cargo).args(&args).current_dir(root()).output().expect("cargo tree");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cargo {}: {stderr}", args.join(" "));
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    text.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect()
}

#[test]
fn an_embedder_compiles_the_engine_without_the_server() {
    let has = |pkgs: &[String], name: &str| pkgs.iter().any(|p| p == name);
    let server = cairn_packages(&[]);
    // The check below means something only if the names are found where they are.
    let missing: Vec<_> = SERVER_ONLY.iter().filter(|n| !has(&server, n)).collect();
    assert!(missing.is_empty(), "the server build no longer has {missing:?}: update SERVER_ONLY");
    let embedded = cairn_packages(&["--no-default-features"]);
    assert!(has(&embedded, "cairn-node"), "{embedded:?}");
    let leaked: Vec<_> = SERVER_ONLY.iter().filter(|n| has(&embedded, n)).collect();
    assert!(leaked.is_empty(), "cairn without `server` compiles {leaked:?}: gate them");
}

/// The README shows the example CI runs, verbatim, so the snippet users copy compiles.
#[test]
fn the_readme_embeds_the_example_ci_runs() {
    let example = std::fs::read_to_string(root().join("crates/server/examples/embed.rs"))
        .expect("the embedding example");
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let block = format!("```rust\n{example}```\n");
    assert!(
        readme.contains(&block),
        "README.md's embedding program differs from examples/embed.rs"
    );
}
