//! `cairn wal repair`: truncates a damaged write-ahead log on an operator's command.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use cairn_storage::fs::OsDir;

#[derive(clap::Subcommand)]
pub enum WalCmd {
    /// Truncate the log at its first damaged record, keeping a copy of what is cut beside the
    /// segments (`<segment>.cut-<offset>`). Entries cut are lost to this member: run it only
    /// when the other members hold them, or to rescue what precedes the damage.
    Repair {
        /// The member's data directory (as given to `--data-dir`).
        #[arg(long)]
        data_dir: PathBuf,
    },
}

pub fn run(cmd: WalCmd) -> Result<()> {
    let WalCmd::Repair { data_dir } = cmd;
    let member = data_dir.join("member");
    let wal = member.join("wal");
    if !wal.is_dir() {
        bail!("no write-ahead log at {}", wal.display());
    }
    // The member holds this lock while it runs: never cut a log in use.
    let lock_path = member.join("LOCK");
    let lock = std::fs::File::create(&lock_path)
        .with_context(|| format!("opening {}", lock_path.display()))?;
    if lock.try_lock().is_err() {
        bail!("{} is in use by a running member: stop it first", data_dir.display());
    }
    let dir = OsDir::create(&wal).with_context(|| format!("opening {}", wal.display()))?;
    let repaired =
        cairn_storage::repair(&dir).map_err(|e| anyhow::anyhow!("{}", e.in_dir(&wal)))?;
    if repaired.cuts.is_empty() {
        println!("{}: nothing to repair", wal.display());
    }
    for c in repaired.cuts {
        println!(
            "{}: cut at offset {} ({}); the cut bytes are in {}",
            wal.join(&c.file).display(),
            c.offset,
            c.reason,
            wal.join(&c.saved_as).display()
        );
    }
    match repaired.promise {
        None => {}
        Some(p) if p.read => println!(
            "kept the term and vote the cut held: term {}, vote {}",
            p.term.0,
            p.vote.map_or_else(|| "none".to_string(), |v| format!("{:x}", v.0))
        ),
        Some(p) => println!(
            "the damaged bytes may have held a vote: the member moves on to term {} without one",
            p.term.0
        ),
    }
    Ok(())
}
