//! Joining a running cluster (`--initial-cluster-state existing`), as etcd joins one: the new
//! member's id was chosen by the member that ran `member add`, and the cluster's id by whoever
//! founded it, so neither can be derived from the flags. The member asks the others listed in
//! `--initial-cluster` for the membership (the transport's members query, over TLS for
//! `https://` URLs), checks that the flags describe exactly that membership (etcd's
//! `ValidateClusterAndAssignIDs`: every running member's peer URLs match one listed member's),
//! and takes the ids from the answer.
//!
//! A data directory that already has an identity is a restart: etcd then ignores the flags for
//! the log it has; so does cairn, except that a running member that answers and names another
//! cluster makes it refuse, since that directory was made for another cluster.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cairn_transport::members::{query, RemoteCluster};
use cairn_transport::url::is_tls;
use cairn_transport::ClientTls;

use crate::cluster::{ClusterConfig, ClusterState, JoinError, MemberSpec};
use crate::error::{EngineError, OpenError};

/// etcd's per-peer limit on the members request.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// [`resolve`] for an engine's configuration, if it names a cluster.
pub(crate) fn resolve_config(
    cfg: &mut crate::EngineConfig,
    member_dir: &Path,
) -> Result<(), EngineError> {
    match &mut cfg.cluster {
        Some(c) => resolve(c, &cfg.name, member_dir),
        None => Ok(()),
    }
}

/// Completes a joining member's cluster configuration from a running member; leaves a founding
/// member's untouched.
pub(crate) fn resolve(
    cluster: &mut ClusterConfig,
    name: &str,
    member_dir: &Path,
) -> Result<(), EngineError> {
    if cluster.state != ClusterState::Existing {
        return Ok(());
    }
    let open = |e| EngineError::Open(e);
    let urls = remote_urls(cluster, name);
    let tls = client_tls(cluster, &urls).map_err(open)?;
    let fetched = fetch(&urls, tls);
    let dir = member_dir.parent().unwrap_or(member_dir).to_path_buf();
    if let Some((member, cluster_id)) = crate::identity::stored(member_dir)? {
        if let Ok(remote) = &fetched {
            if remote.cluster_id != cluster_id {
                let expected = remote.cluster_id;
                return Err(open(OpenError::OtherCluster { dir, found: cluster_id, expected }));
            }
        }
        // The membership comes from the member's own log; the flags' other members may be
        // stale, so none is dialed before the log names it.
        let me = cluster.members.iter().find(|m| m.name == name).cloned();
        let peer_urls = me.map(|m| m.peer_urls).unwrap_or_default();
        cluster.members = vec![MemberSpec { name: name.to_string(), id: member, peer_urls }];
        cluster.local_id = member;
        cluster.cluster_id = cluster_id;
        return Ok(());
    }
    let remote =
        fetched.map_err(|last| open(OpenError::Join(JoinError::Unreachable { urls, last })))?;
    assign_ids(cluster, name, &remote).map_err(|e| open(OpenError::Join(e)))?;
    tracing::info!(
        "joining cluster {:016x} as member {:016x}, as the running members list it",
        cluster.cluster_id,
        cluster.local_id
    );
    Ok(())
}

/// The other members' peer URLs, sorted (etcd's `getRemotePeerURLs`).
fn remote_urls(cluster: &ClusterConfig, name: &str) -> Vec<String> {
    let mut urls: Vec<String> = cluster
        .members
        .iter()
        .filter(|m| m.name != name)
        .flat_map(|m| m.peer_urls.clone())
        .collect();
    urls.sort();
    urls
}

fn client_tls(
    cluster: &ClusterConfig,
    urls: &[String],
) -> Result<Option<Arc<ClientTls>>, OpenError> {
    let Some(url) = urls.iter().find(|u| is_tls(u)) else { return Ok(None) };
    let Some(files) = &cluster.peer_tls else {
        return Err(OpenError::PeerTlsMissing { url: url.clone(), listen: false });
    };
    Ok(Some(Arc::new(ClientTls::new(files.clone()).map_err(OpenError::PeerTls)?)))
}

/// The first answer of the URLs asked in turn, or why the last one failed.
fn fetch(urls: &[String], tls: Option<Arc<ClientTls>>) -> Result<RemoteCluster, String> {
    let mut last = "no other member is listed in --initial-cluster".to_string();
    for url in urls {
        match query(url, tls.clone(), QUERY_TIMEOUT) {
            Ok(c) if !c.members.is_empty() => return Ok(c),
            Ok(_) => last = format!("{url}: failed to get raft cluster member(s)"),
            Err(e) => {
                tracing::warn!("failed to get cluster response from {url}: {e}");
                last = format!("{url}: {e}");
            }
        }
    }
    Err(last)
}

/// Takes every member's id from the running cluster, matching by peer URLs, and the cluster's
/// id; refuses flags that list other members than those running.
fn assign_ids(
    cluster: &mut ClusterConfig,
    name: &str,
    remote: &RemoteCluster,
) -> Result<(), JoinError> {
    let existing = describe(remote);
    if remote.members.len() != cluster.members.len() {
        return Err(JoinError::CountUnequal { existing });
    }
    let mut ids = vec![None; cluster.members.len()];
    for r in &remote.members {
        let found = cluster.members.iter().position(|m| same_urls(&m.peer_urls, &r.peer_urls));
        match found {
            Some(i) if ids[i].is_none() => ids[i] = Some(r.id),
            _ => {
                let (id, peer_urls) = (r.id, r.peer_urls.clone());
                return Err(JoinError::NoMatch { existing, id, peer_urls });
            }
        }
    }
    for (m, id) in cluster.members.iter_mut().zip(ids) {
        // Every slot is filled: as many members as slots, each matched to a distinct one.
        m.id = id.unwrap_or(m.id);
    }
    cluster.cluster_id = remote.cluster_id;
    if let Some(me) = cluster.members.iter().find(|m| m.name == name) {
        cluster.local_id = me.id;
    }
    Ok(())
}

fn same_urls(a: &[String], b: &[String]) -> bool {
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    a.sort();
    b.sort();
    a == b
}

/// The running cluster as an error names it: its id and each member's id and peer URLs.
fn describe(remote: &RemoteCluster) -> String {
    let members: Vec<String> =
        remote.members.iter().map(|m| format!("{:x}={}", m.id, m.peer_urls.join(","))).collect();
    format!("{{ClusterID:{:x} Members:[{}]}}", remote.cluster_id, members.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_transport::members::RemoteMember;

    fn flags(initial: &str, me: &str, url: &str) -> ClusterConfig {
        let adv = vec![url.to_string()];
        ClusterConfig::from_flags(me, initial, "t", &adv, &adv, ClusterState::Existing)
            .expect("flags")
    }

    fn running(members: &[(u64, &str)]) -> RemoteCluster {
        let members = members
            .iter()
            .map(|(id, url)| RemoteMember {
                id: *id,
                peer_urls: vec![url.to_string()],
                ..RemoteMember::default()
            })
            .collect();
        RemoteCluster { cluster_id: 0xc1, members }
    }

    #[test]
    fn ids_come_from_the_running_cluster() {
        let mut c = flags("a=http://h:1,b=http://h:2", "b", "http://h:2");
        let remote = running(&[(0xa, "http://h:1"), (0xb, "http://h:2")]);
        assign_ids(&mut c, "b", &remote).expect("matching flags");
        assert_eq!((c.cluster_id, c.local_id), (0xc1, 0xb));
        assert_eq!(c.members.iter().map(|m| m.id).collect::<Vec<_>>(), [0xa, 0xb]);
    }

    #[test]
    fn flags_that_differ_from_the_running_cluster_are_refused_in_etcds_words() {
        // Not added with `member add`: the running cluster has one member fewer.
        let mut c = flags("a=http://h:1,b=http://h:2", "b", "http://h:2");
        let e = assign_ids(&mut c, "b", &running(&[(0xa, "http://h:1")]));
        let e = e.expect_err("this member is not in the running cluster");
        assert!(e.to_string().ends_with("member count is unequal"), "{e}");
        // Added at another URL than the one it starts with.
        let e = assign_ids(&mut c, "b", &running(&[(0xa, "http://h:1"), (0xb, "http://h:3")]));
        let e = e.expect_err("this member's URLs are not in the running cluster");
        assert!(matches!(e, JoinError::NoMatch { id: 0xb, .. }), "{e:?}");
        assert!(e.to_string().contains("no match found for existing member (b, "), "{e}");
    }
}
