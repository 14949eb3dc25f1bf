//! Which member and cluster a data directory belongs to. A directory is created for one member
//! of one cluster and keeps that identity: opening it with flags that describe another member
//! or cluster is refused, since serving another member's log under a new name would corrupt
//! the cluster it came from.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

use crate::cluster::ClusterConfig;
use crate::error::{EngineError, OpenError};

/// The ids a data directory serves under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) member_id: u64,
    pub(crate) cluster_id: u64,
}

pub(crate) fn io_err<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> EngineError + 'a {
    move |e| {
        EngineError::Open(OpenError::Io { what, path: path.to_path_buf(), source: Arc::new(e) })
    }
}

/// Reads the directory's identity, checking it against the cluster flags if there are any,
/// and records it on first start.
pub(crate) fn open(
    member_dir: &Path,
    name: &str,
    cluster: Option<&ClusterConfig>,
    now_micros: u64,
) -> Result<Identity, EngineError> {
    let member_path = member_dir.join("member_id");
    let cluster_path = member_dir.join("cluster_id");
    let found_member = read_id(&member_path)?;
    let found_cluster = read_id(&cluster_path)?;
    let identity = match cluster {
        Some(c) => {
            let dir = member_dir.parent().unwrap_or(member_dir).to_path_buf();
            if let Some(found) = found_member.filter(|m| *m != c.local_id) {
                let expected = c.local_id;
                return Err(EngineError::Open(OpenError::OtherMember { dir, found, expected }));
            }
            if let Some(found) = found_cluster.filter(|m| *m != c.cluster_id) {
                let expected = c.cluster_id;
                return Err(EngineError::Open(OpenError::OtherCluster { dir, found, expected }));
            }
            Identity { member_id: c.local_id, cluster_id: c.cluster_id }
        }
        None => {
            let member_id = found_member.unwrap_or_else(|| fresh_member_id(name, now_micros));
            let cluster_id = found_cluster.unwrap_or_else(|| single_cluster_id(member_id));
            Identity { member_id, cluster_id }
        }
    };
    if found_member.is_none() {
        write_id(&member_path, identity.member_id)?;
    }
    if found_cluster.is_none() {
        write_id(&cluster_path, identity.cluster_id)?;
    }
    Ok(identity)
}

/// The (member, cluster) ids a data directory already serves under, if it has both.
pub(crate) fn stored(member_dir: &Path) -> Result<Option<(u64, u64)>, EngineError> {
    let member = read_id(&member_dir.join("member_id"))?;
    let cluster = read_id(&member_dir.join("cluster_id"))?;
    Ok(member.zip(cluster))
}

/// A member started without cluster flags gets an id from its name and the time of creation,
/// so such members of different one-member clusters do not collide.
fn fresh_member_id(name: &str, now_micros: u64) -> u64 {
    let now = now_micros.wrapping_mul(1000);
    let id = now
        ^ name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    id.max(1) & 0x7fff_ffff_ffff_ffff
}

/// The cluster id of a one-member cluster started without cluster flags (before the id was
/// recorded in its own file, it was derived like this, so old directories keep theirs).
fn single_cluster_id(member: u64) -> u64 {
    member.rotate_left(17) ^ 0x5bd1_e995
}

fn read_id(path: &Path) -> Result<Option<u64>, EngineError> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("open", path)(e)),
    };
    let mut s = String::new();
    f.read_to_string(&mut s).map_err(io_err("read", path))?;
    u64::from_str_radix(s.trim(), 16)
        .ok()
        .filter(|id| *id != 0)
        .map(Some)
        .ok_or(EngineError::Open(OpenError::BadMemberId { path: path.to_path_buf() }))
}

fn write_id(path: &Path, id: u64) -> Result<(), EngineError> {
    let mut f = crate::datadir::open_private(path).map_err(io_err("create", path))?;
    f.set_len(0).map_err(io_err("truncate", path))?;
    writeln!(f, "{id:016x}").map_err(io_err("write", path))?;
    f.sync_all().map_err(io_err("sync", path))
}
