//! `cairn snapshot restore` and `cairn snapshot status`: etcdutl's commands, for cairn's snapshot
//! files (what `etcdctl snapshot save` downloads from cairn).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use cairn_node::backup::{open_file, DIGEST_LEN};
use cairn_node::cluster::{ClusterConfig, ClusterState};
use cairn_node::restore::{restore, RestoreConfig};

#[derive(clap::Subcommand)]
pub enum SnapshotCmd {
    /// Build a new member's data directory from a snapshot file, as `etcdutl snapshot restore`
    /// does; start the member with `cairn serve` and the same --name and cluster flags.
    Restore {
        /// The snapshot file (from `etcdctl snapshot save` against cairn).
        file: PathBuf,
        /// The new member's data directory, which must be missing or empty [default: <name>.etcd].
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// The new member's name.
        #[arg(long, default_value = "default")]
        name: String,
        /// The new cluster's members, as name=peer-url pairs; without it, a single member as
        /// `cairn serve` starts without --initial-cluster.
        #[arg(long)]
        initial_cluster: Option<String>,
        /// The new cluster's token: it goes into every id.
        #[arg(long, default_value = cairn_node::cluster::DEFAULT_TOKEN)]
        initial_cluster_token: String,
        /// This member's peer URLs (comma-separated), as in its --initial-cluster entry.
        #[arg(long, default_value = "http://localhost:2380", value_delimiter = ',')]
        initial_advertise_peer_urls: Vec<String>,
        /// Restore even if the file's SHA-256 is missing or wrong (the image's own checksum is
        /// still checked).
        #[arg(long)]
        skip_hash_check: bool,
    },
    /// Print a snapshot file's hash, revision, total keys and total size, as `etcdutl snapshot
    /// status` does. The hash is the image's crc32c; total keys counts stored revisions.
    Status {
        /// The snapshot file.
        file: PathBuf,
        /// simple, table or json.
        #[arg(short = 'w', long = "write-out", default_value = "simple",
            value_parser = ["simple", "table", "json"])]
        write_out: String,
    },
}

pub fn run(cmd: SnapshotCmd) -> Result<()> {
    match cmd {
        SnapshotCmd::Restore {
            file,
            data_dir,
            name,
            initial_cluster,
            initial_cluster_token,
            initial_advertise_peer_urls,
            skip_hash_check,
        } => {
            let data_dir = data_dir.unwrap_or_else(|| PathBuf::from(format!("{name}.etcd")));
            let cluster = match initial_cluster {
                Some(initial) => Some(ClusterConfig::from_flags(
                    &name,
                    &initial,
                    &initial_cluster_token,
                    &initial_advertise_peer_urls,
                    &initial_advertise_peer_urls,
                    ClusterState::New,
                )?),
                None => None,
            };
            let bytes = read(&file)?;
            let cfg = RestoreConfig { data_dir, name, cluster, skip_hash_check };
            let done = restore(&bytes, &cfg).map_err(anyhow::Error::msg)?;
            println!(
                "restored snapshot at revision {} into {}: member {:x} of cluster {:x}",
                done.meta.current.0,
                cfg.data_dir.display(),
                done.member_id,
                done.cluster_id
            );
            Ok(())
        }
        SnapshotCmd::Status { file, write_out } => status(&file, &write_out),
    }
}

fn read(file: &PathBuf) -> Result<Vec<u8>> {
    std::fs::read(file).with_context(|| format!("reading {}", file.display()))
}

fn status(file: &PathBuf, write_out: &str) -> Result<()> {
    let bytes = read(file)?;
    let framed = open_file(&bytes, false).map_err(anyhow::Error::msg)?;
    let summary = cairn_kv::snapshot::summarize(framed.image)
        .map_err(|e| anyhow::anyhow!("snapshot file damaged: {e}"))?;
    let Some(size) = (bytes.len() as u64).checked_sub(DIGEST_LEN as u64) else {
        bail!("snapshot file truncated");
    };
    let row = [
        format!("{:x}", summary.checksum),
        summary.meta.current.0.to_string(),
        summary.records.to_string(),
        human_bytes(size),
    ];
    match write_out {
        "json" => println!(
            "{{\"hash\":{},\"revision\":{},\"totalKey\":{},\"totalSize\":{}}}",
            summary.checksum, summary.meta.current.0, summary.records, size
        ),
        "table" => print!("{}", table(&["HASH", "REVISION", "TOTAL KEYS", "TOTAL SIZE"], &row)),
        _ => println!("{}", row.join(", ")),
    }
    Ok(())
}

/// A size as etcdutl prints it (go-humanize's `Bytes`: powers of 1000, one decimal under 10).
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    if n < 10 {
        return format!("{n} B");
    }
    let mut exp = 0;
    let mut scaled = n as f64;
    while scaled >= 1000.0 && exp < UNITS.len() - 1 {
        scaled /= 1000.0;
        exp += 1;
    }
    let rounded = (scaled * 10.0 + 0.5).floor() / 10.0;
    if rounded < 10.0 {
        format!("{rounded:.1} {}", UNITS[exp])
    } else {
        format!("{rounded:.0} {}", UNITS[exp])
    }
}

/// One header row and one data row in etcdutl's table style.
fn table(header: &[&str], row: &[String]) -> String {
    let widths: Vec<usize> =
        header.iter().zip(row).map(|(h, r)| h.len().max(r.len()) + 2).collect();
    let rule: String =
        widths.iter().map(|w| format!("+{}", "-".repeat(*w))).collect::<String>() + "+\n";
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        for (cell, w) in cells.iter().zip(&widths) {
            out.push_str(&format!("|{cell:^w$}"));
        }
        out + "|\n"
    };
    let head = line(header.iter().map(|h| h.to_string()).collect());
    let body = line(row.to_vec());
    format!("{rule}{head}{rule}{body}{rule}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_etcdutl_prints_them() {
        assert_eq!(human_bytes(7), "7 B");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(2048), "2.0 kB");
        assert_eq!(human_bytes(41_000), "41 kB");
        assert_eq!(human_bytes(2_100_000), "2.1 MB");
    }
}
