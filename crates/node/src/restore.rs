//! `cairn snapshot restore`: a new member's data directory built from a snapshot file, as
//! `etcdutl snapshot restore` builds one from etcd's.
//!
//! The directory holds what a member of the new cluster would hold after applying the cluster's
//! founding configuration and then installing the snapshot from a leader: the store replaced by
//! the image, and a log that records that install at index `n` (the number of members, as etcd
//! uses), term 1, with the new cluster's members as voters. Every member restored from one file
//! with the same `--initial-cluster` therefore starts from the same state at the same index,
//! and `cairn serve` with those flags starts from it as from any compacted log.
//!
//! The image's members' attributes belong to the old cluster's members and are dropped; members
//! of the new one publish theirs when they start. Its applied index is replaced by `n`.

use std::fmt;
use std::path::{Path, PathBuf};

use cairn_kv::snapshot::{self, ImageError, ImageMeta};
use cairn_kv::{InstallError, Store};
use cairn_raft::{ConfState, HardState, LogIndex, NodeId, SnapshotMeta, Term};
use cairn_storage::fs::OsDir;
use cairn_storage::lmdb::LmdbBackend;
use cairn_storage::{Wal, WalOptions};

use crate::backup::{open_file, FileError};
use crate::cluster::ClusterConfig;
use crate::error::EngineError;

/// What to restore, and as which member.
#[derive(Clone, Debug)]
pub struct RestoreConfig {
    /// The new member's data directory: missing or empty.
    pub data_dir: PathBuf,
    /// The new member's name (`--name`).
    pub name: String,
    /// The new cluster (`--initial-cluster` and the rest); `None` for a single member started
    /// without cluster flags.
    pub cluster: Option<ClusterConfig>,
    /// Accept a file whose digest is missing or wrong (`--skip-hash-check`).
    pub skip_hash_check: bool,
}

/// What a restore built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restored {
    /// The new member's id.
    pub member_id: u64,
    /// The new cluster's id.
    pub cluster_id: u64,
    /// The image's revisions, and the log index the member starts at.
    pub meta: ImageMeta,
}

/// Why a restore failed. Nothing is left behind: a directory the restore created is removed.
#[derive(Debug)]
#[non_exhaustive]
pub enum RestoreError {
    /// The data directory exists and holds something (etcdutl's message).
    NotEmpty(PathBuf),
    /// The file's frame or digest is wrong.
    File(FileError),
    /// The image inside does not verify.
    Image(ImageError),
    /// Creating the directory, its store or its log failed.
    Create(String),
}

impl fmt::Display for RestoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RestoreError::NotEmpty(dir) => {
                write!(f, "data-dir {:?} not empty or could not be read", dir.display())
            }
            RestoreError::File(e) => e.fmt(f),
            RestoreError::Image(e) => write!(f, "snapshot file damaged: {e}"),
            RestoreError::Create(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for RestoreError {}

fn create_err(e: impl fmt::Display) -> RestoreError {
    RestoreError::Create(e.to_string())
}

/// Builds `cfg.data_dir` from the snapshot `file` (its whole bytes).
pub fn restore(file: &[u8], cfg: &RestoreConfig) -> Result<Restored, RestoreError> {
    let image = open_file(file, cfg.skip_hash_check).map_err(RestoreError::File)?.image;
    let image = snapshot::decode(image).map_err(RestoreError::Image)?;
    if !empty_or_missing(&cfg.data_dir) {
        return Err(RestoreError::NotEmpty(cfg.data_dir.clone()));
    }
    let existed = cfg.data_dir.exists();
    let built = build(image, cfg);
    if built.is_err() {
        // Leave the directory as it was: empty, or absent.
        let _ = if existed {
            std::fs::remove_dir_all(cfg.data_dir.join("member"))
        } else {
            std::fs::remove_dir_all(&cfg.data_dir)
        };
    }
    built
}

fn empty_or_missing(dir: &Path) -> bool {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

fn build(image: snapshot::Image, cfg: &RestoreConfig) -> Result<Restored, RestoreError> {
    let member = cfg.data_dir.join("member");
    crate::datadir::create_private(&cfg.data_dir).map_err(create_err)?;
    crate::datadir::create_private(&member).map_err(create_err)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_micros() as u64);
    let identity = crate::identity::open(&member, &cfg.name, cfg.cluster.as_ref(), now)
        .map_err(|e: EngineError| create_err(e))?;
    let voters: Vec<NodeId> = match &cfg.cluster {
        Some(c) => c.members.iter().map(|m| NodeId(m.id)).collect(),
        None => vec![NodeId(identity.member_id)],
    };
    let index = LogIndex(voters.len() as u64);
    let image = image.for_new_cluster(index.0);
    let db = member.join("db");
    let map_bytes = crate::EngineConfig::new(&cfg.name, &cfg.data_dir).map_bytes();
    let backend = LmdbBackend::open(&db, map_bytes).map_err(create_err)?;
    let store = Store::open(backend).map_err(create_err)?;
    let meta = store.install_image(image).map_err(|e: InstallError| create_err(e))?;
    drop(store);
    let wal_path = member.join("wal");
    let dir = OsDir::create(&wal_path).map_err(create_err)?;
    let (mut wal, _) = Wal::open(dir, WalOptions::default()).map_err(create_err)?;
    let conf_state = ConfState::with_voters(voters);
    let term = Term(1);
    wal.install_snapshot(&SnapshotMeta { index, term, conf_state }).map_err(create_err)?;
    let hard_state = HardState { term, vote: None, commit: index };
    wal.append(&[], Some(&hard_state)).map_err(create_err)?;
    wal.sync().map_err(create_err)?;
    Ok(Restored { member_id: identity.member_id, cluster_id: identity.cluster_id, meta })
}
