//! A cluster as etcd's flags describe it: `--initial-cluster`, `--initial-cluster-token`,
//! `--initial-advertise-peer-urls`, `--initial-cluster-state`, with member and cluster ids
//! derived exactly as etcd derives them, so a cairn member reports the ids an etcd member
//! started with the same flags would.

use std::collections::BTreeSet;
use std::fmt;

use sha1::{Digest, Sha1};

/// etcd's default `--initial-cluster-token`.
pub const DEFAULT_TOKEN: &str = "etcd-cluster";

/// Whether the cluster is being founded or this member joins a running one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClusterState {
    /// Found the cluster with the listed members (`--initial-cluster-state new`, the default).
    #[default]
    New,
    /// Join a running cluster (`--initial-cluster-state existing`).
    Existing,
}

/// One member as `--initial-cluster` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberSpec {
    /// The member's name.
    pub name: String,
    /// Its id, derived from its peer URLs and the cluster token as etcd derives it.
    pub id: u64,
    /// Where its peers reach it.
    pub peer_urls: Vec<String>,
}

/// The cluster this member belongs to, and where it accepts its peers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// The cluster's id, derived from every member's id and the token as etcd derives it.
    pub cluster_id: u64,
    /// This member's id.
    pub local_id: u64,
    /// Every member, this one included, in `--initial-cluster` order.
    pub members: Vec<MemberSpec>,
    /// Founding the cluster, or joining it.
    pub state: ClusterState,
    /// `--listen-peer-urls`.
    pub listen_peer_urls: Vec<String>,
    /// `--peer-cert-file`, `--peer-key-file`, `--peer-trusted-ca-file` and
    /// `--peer-client-cert-auth`, for `https://` peer URLs: served on the peer listeners, and
    /// presented to (and verifying) the peers this member dials.
    pub peer_tls: Option<cairn_transport::TlsFiles>,
    /// Accept a peer's certificate from addresses it does not name (etcd's
    /// `--experimental-peer-skip-client-san-verification`; `cairn_transport::san`).
    pub peer_skip_client_san_verification: bool,
}

/// Why the cluster flags do not describe a cluster this member can start in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterError {
    /// An `--initial-cluster` item is not `name=url`.
    Malformed(String),
    /// `--initial-cluster` does not name this member.
    NotListed {
        /// This member's name (`--name`).
        name: String,
    },
    /// This member's URLs in `--initial-cluster` differ from `--initial-advertise-peer-urls`.
    UrlMismatch {
        /// This member's name.
        name: String,
        /// Its URLs in `--initial-cluster`.
        listed: Vec<String>,
        /// Its `--initial-advertise-peer-urls`.
        advertised: Vec<String>,
    },
    /// Two members share a peer URL.
    DuplicateUrl(String),
    /// Two members' URLs hash to the same id (only if the same URLs are listed twice).
    DuplicateId(u64),
}

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterError::Malformed(item) => {
                write!(f, "--initial-cluster item {item:?} is not of the form name=http://host:port")
            }
            ClusterError::NotListed { name } => write!(
                f,
                "couldn't find local name {name:?} in the initial cluster configuration (--initial-cluster must include this member's --name)"
            ),
            ClusterError::UrlMismatch { name, listed, advertised } => write!(
                f,
                "--initial-cluster has {name}={} but --initial-advertise-peer-urls is {}: they must be the same",
                listed.join(","),
                advertised.join(",")
            ),
            ClusterError::DuplicateUrl(u) => {
                write!(f, "peer URL {u} appears for more than one member in --initial-cluster")
            }
            ClusterError::DuplicateId(id) => {
                write!(f, "two members of --initial-cluster get the same id {id:x}")
            }
        }
    }
}

impl std::error::Error for ClusterError {}

/// Why a member started with `--initial-cluster-state existing` cannot join, in etcd's words
/// (`GetClusterFromRemotePeers`, `ValidateClusterAndAssignIDs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinError {
    /// No other member listed in `--initial-cluster` answered the members query.
    Unreachable {
        /// The peer URLs asked.
        urls: Vec<String>,
        /// Why the last one failed.
        last: String,
    },
    /// `--initial-cluster` lists more or fewer members than the running cluster (this member
    /// was not added with `member add`, or the flags are stale).
    CountUnequal {
        /// The running cluster, as a member listed it.
        existing: String,
    },
    /// A running member's peer URLs match no member of `--initial-cluster`.
    NoMatch {
        /// The running cluster, as a member listed it.
        existing: String,
        /// The unmatched member.
        id: u64,
        /// Its peer URLs.
        peer_urls: Vec<String>,
    },
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Unreachable { urls, last } => write!(
                f,
                "cannot fetch cluster info from peer urls: could not retrieve cluster information from the given URLs ({}; last error: {last})",
                urls.join(",")
            ),
            JoinError::CountUnequal { existing } => {
                write!(f, "error validating peerURLs {existing}: member count is unequal")
            }
            JoinError::NoMatch { existing, id, peer_urls } => write!(
                f,
                "error validating peerURLs {existing}: PeerURLs: no match found for existing member ({id:x}, {peer_urls:?}), last resolver error (<nil>)"
            ),
        }
    }
}

impl std::error::Error for JoinError {}

impl ClusterConfig {
    /// The cluster etcd's flags describe, from this member's point of view. A name may appear
    /// several times in `initial_cluster`, once per URL, as in etcd.
    pub fn from_flags(
        name: &str,
        initial_cluster: &str,
        token: &str,
        advertise_peer_urls: &[String],
        listen_peer_urls: &[String],
        state: ClusterState,
    ) -> Result<ClusterConfig, ClusterError> {
        let mut named: Vec<(String, Vec<String>)> = Vec::new();
        for item in initial_cluster.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (n, url) =
                item.split_once('=').ok_or_else(|| ClusterError::Malformed(item.into()))?;
            if n.is_empty() || url.is_empty() {
                return Err(ClusterError::Malformed(item.into()));
            }
            match named.iter_mut().find(|(m, _)| m == n) {
                Some((_, urls)) => urls.push(url.to_string()),
                None => named.push((n.to_string(), vec![url.to_string()])),
            }
        }
        let mut seen = BTreeSet::new();
        let mut members = Vec::new();
        for (n, urls) in named {
            for u in &urls {
                if !seen.insert(u.clone()) {
                    return Err(ClusterError::DuplicateUrl(u.clone()));
                }
            }
            members.push(MemberSpec { id: member_id(&urls, token), name: n, peer_urls: urls });
        }
        let me = members
            .iter()
            .find(|m| m.name == name)
            .ok_or_else(|| ClusterError::NotListed { name: name.to_string() })?;
        if sorted(&me.peer_urls) != sorted(advertise_peer_urls) {
            return Err(ClusterError::UrlMismatch {
                name: name.to_string(),
                listed: me.peer_urls.clone(),
                advertised: advertise_peer_urls.to_vec(),
            });
        }
        let ids: BTreeSet<u64> = members.iter().map(|m| m.id).collect();
        if ids.len() != members.len() {
            return Err(ClusterError::DuplicateId(me.id));
        }
        Ok(ClusterConfig {
            cluster_id: cluster_id(ids.iter().copied()),
            local_id: me.id,
            members,
            state,
            listen_peer_urls: listen_peer_urls.to_vec(),
            peer_tls: None,
            peer_skip_client_san_verification: false,
        })
    }

    /// Every member but this one.
    pub fn peers(&self) -> impl Iterator<Item = &MemberSpec> {
        self.members.iter().filter(move |m| m.id != self.local_id)
    }
}

fn sorted(urls: &[String]) -> Vec<String> {
    let mut v = urls.to_vec();
    v.sort();
    v
}

/// etcd's member id: the first 8 bytes (big-endian) of SHA-1 over the sorted peer URLs joined
/// with nothing, then the cluster token.
pub fn member_id(peer_urls: &[String], token: &str) -> u64 {
    let mut h = Sha1::new();
    h.update(sorted(peer_urls).concat().as_bytes());
    h.update(token.as_bytes());
    first_u64(&h.finalize())
}

/// etcd's cluster id: SHA-1 over the sorted member ids, each 8 bytes big-endian.
pub fn cluster_id(ids: impl IntoIterator<Item = u64>) -> u64 {
    let mut ids: Vec<u64> = ids.into_iter().collect();
    ids.sort_unstable();
    let mut h = Sha1::new();
    for id in ids {
        h.update(id.to_be_bytes());
    }
    first_u64(&h.finalize())
}

fn first_u64(digest: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(b)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn urls(u: &[&str]) -> Vec<String> {
        u.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ids_match_etcds_defaults() {
        // etcd started with no flags reports these two ids.
        let id = member_id(&urls(&["http://localhost:2380"]), DEFAULT_TOKEN);
        assert_eq!(id, 0x8e9e_05c5_2164_694d);
        assert_eq!(cluster_id([id]), 0xcdf8_1819_4e3a_8c32);
    }

    #[test]
    fn parses_a_three_member_cluster_from_each_members_view() {
        let ic = "a=http://127.0.0.1:1,b=http://127.0.0.1:2,c=http://127.0.0.1:3";
        let views: Vec<ClusterConfig> = ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let adv = urls(&[&format!("http://127.0.0.1:{}", i + 1)]);
                ClusterConfig::from_flags(n, ic, "t", &adv, &[], ClusterState::New).unwrap()
            })
            .collect();
        assert!(views.iter().all(|v| v.cluster_id == views[0].cluster_id));
        assert_eq!(views[1].local_id, views[1].members[1].id);
        assert_eq!(views[0].peers().count(), 2);
        let other_token = ClusterConfig::from_flags(
            "a",
            ic,
            "u",
            &urls(&["http://127.0.0.1:1"]),
            &[],
            ClusterState::New,
        )
        .unwrap();
        assert_ne!(other_token.cluster_id, views[0].cluster_id);
    }

    #[test]
    fn refuses_what_etcd_refuses() {
        let adv = urls(&["http://127.0.0.1:1"]);
        let new = ClusterState::New;
        let e = ClusterConfig::from_flags("z", "a=http://127.0.0.1:1", "t", &adv, &[], new);
        assert!(matches!(e, Err(ClusterError::NotListed { .. })));
        let e = ClusterConfig::from_flags("a", "a=http://127.0.0.1:9", "t", &adv, &[], new);
        assert!(matches!(e, Err(ClusterError::UrlMismatch { .. })));
        let e = ClusterConfig::from_flags("a", "a", "t", &adv, &[], new);
        assert!(matches!(e, Err(ClusterError::Malformed(_))));
        let dup = "a=http://127.0.0.1:1,b=http://127.0.0.1:1";
        let e = ClusterConfig::from_flags("a", dup, "t", &adv, &[], new);
        assert!(matches!(e, Err(ClusterError::DuplicateUrl(_))));
        let one = ClusterConfig::from_flags("a", "a=http://127.0.0.1:1", "t", &adv, &[], new);
        let one = one.unwrap();
        assert_eq!((one.members.len(), one.peers().count()), (1, 0));
    }
}
