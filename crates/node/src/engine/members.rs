//! The engine's membership API (etcd's Cluster service): list, add, remove, update, promote.
//! Changes are decided by the leader's replica (`replica/members.rs`); the list is this
//! member's applied view.

use std::time::{SystemTime, UNIX_EPOCH};

use cairn_raft::NodeId;

use super::Engine;
use crate::driver::Input;
use crate::error::{EngineError, MembershipError};
use crate::replica::{MemberChange, Reply};

/// One member as `MemberList` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Member {
    /// Its id.
    pub id: u64,
    /// Its name, once it published it (empty before, as in etcd).
    pub name: String,
    /// Where its peers reach it.
    pub peer_urls: Vec<String>,
    /// Where it serves clients, once it published them.
    pub client_urls: Vec<String>,
    /// It is a learner: it replicates the log but does not vote.
    pub is_learner: bool,
}

/// etcd's id for a member added through the Cluster API: SHA-1 of its sorted peer URLs joined
/// with nothing, then the time in Unix seconds (the cluster name is empty for an added member).
pub fn added_member_id(peer_urls: &[String], unix_seconds: u64) -> u64 {
    crate::cluster::member_id(peer_urls, &unix_seconds.to_string())
}

/// URLs etcd accepts as peer URLs: `http` or `https`, a host and a port, nothing after.
fn check_urls(urls: &[String]) -> Result<(), EngineError> {
    let ok = !urls.is_empty()
        && urls.iter().all(|u| {
            let rest = u.strip_prefix("http://").or_else(|| u.strip_prefix("https://"));
            rest.and_then(|r| r.rsplit_once(':')).is_some_and(|(host, port)| {
                !host.is_empty() && !port.is_empty() && port.parse::<u16>().is_ok()
            })
        });
    if ok {
        Ok(())
    } else {
        Err(EngineError::Membership(MembershipError::BadUrls))
    }
}

/// Every member of the applied configuration, by id: what the store recorded of each, with the
/// flags' peer URLs for a founding member of a log that predates recorded URLs, and this
/// member's own name before it published it.
pub(crate) fn list(
    shared: &crate::shared::Shared,
    flags: &[crate::cluster::MemberSpec],
    own_name: &str,
) -> Vec<Member> {
    let conf = shared.conf.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let published = shared.store.members();
    let learners: Vec<NodeId> = conf.learners.iter().chain(&conf.learners_next).copied().collect();
    conf.members()
        .into_iter()
        .map(|id| {
            let a = published.get(&id.0).cloned().unwrap_or_default();
            let flag = flags.iter().find(|m| m.id == id.0);
            let mut m = Member {
                id: id.0,
                name: a.name,
                peer_urls: a.peer_urls,
                client_urls: a.client_urls,
                is_learner: learners.contains(&id),
            };
            if m.peer_urls.is_empty() {
                m.peer_urls = flag.map(|f| f.peer_urls.clone()).unwrap_or_default();
            }
            if m.name.is_empty() && id.0 == shared.member_id {
                m.name = own_name.to_string();
            }
            m
        })
        .collect()
}

impl Engine {
    /// Every member of the applied configuration, by id (as etcd lists them).
    pub fn member_list(&self) -> Vec<Member> {
        let flags = self.cfg.cluster.as_ref().map(|c| c.members.as_slice()).unwrap_or_default();
        list(&self.shared, flags, &self.cfg.name)
    }

    /// This member was removed from the cluster and stopped serving for good.
    pub fn is_removed(&self) -> bool {
        self.shared.removed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// This member is a learner: it serves serializable reads only.
    pub fn is_learner(&self) -> bool {
        let conf = self.shared.conf.lock().unwrap_or_else(|e| e.into_inner());
        let me = NodeId(self.shared.member_id);
        conf.learners.contains(&me) || conf.learners_next.contains(&me)
    }

    /// A learner serves serializable reads only: writes and linearizable reads are refused
    /// with etcd's error, as etcd refuses them before they reach Raft.
    pub(crate) fn refuse_learner(&self) -> Result<(), EngineError> {
        if self.is_learner() {
            return Err(EngineError::Membership(MembershipError::NotSupportedForLearner));
        }
        Ok(())
    }

    /// etcd's MemberAdd, on the leader: adds a member reached at `peer_urls`, a learner or a
    /// voter, under the id etcd derives for it; returns it once the change is applied here.
    pub async fn member_add(
        &self,
        peer_urls: Vec<String>,
        learner: bool,
    ) -> Result<Member, EngineError> {
        check_urls(&peer_urls)?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let id = added_member_id(&peer_urls, now);
        let added =
            Member { id, peer_urls: peer_urls.clone(), is_learner: learner, ..Member::default() };
        self.change_members(MemberChange::Add { id, peer_urls, learner }).await?;
        Ok(added)
    }

    /// etcd's MemberRemove, on the leader.
    pub async fn member_remove(&self, id: u64) -> Result<(), EngineError> {
        self.change_members(MemberChange::Remove { id }).await
    }

    /// etcd's MemberUpdate (new peer URLs), on the leader.
    pub async fn member_update(&self, id: u64, peer_urls: Vec<String>) -> Result<(), EngineError> {
        check_urls(&peer_urls)?;
        self.change_members(MemberChange::Update { id, peer_urls }).await
    }

    /// etcd's MemberPromote, on the leader: a learner whose log holds 90% of the leader's
    /// becomes a voter.
    pub async fn member_promote(&self, id: u64) -> Result<(), EngineError> {
        self.change_members(MemberChange::Promote { id }).await
    }

    async fn change_members(&self, change: MemberChange) -> Result<(), EngineError> {
        let id = self.ids.next_id();
        match self.ask(|reply| Input::MemberChange { id, change, reply }).await? {
            Reply::Command(_) => Ok(()),
            _ => Err(EngineError::Internal("a membership change answered as something else")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_ids_are_etcds() {
        // etcd 3.5.17's computeMemberId for ["http://127.0.0.1:2380"], "" and Unix time 1700000000.
        let urls = vec!["http://127.0.0.1:2380".to_string()];
        let mut h = <sha1::Sha1 as sha1::Digest>::new();
        sha1::Digest::update(&mut h, b"http://127.0.0.1:23801700000000");
        let digest = sha1::Digest::finalize(h);
        let mut b = [0u8; 8];
        b.copy_from_slice(&digest[..8]);
        assert_eq!(added_member_id(&urls, 1_700_000_000), u64::from_be_bytes(b));
    }

    #[test]
    fn peer_urls_must_be_urls() {
        for bad in [vec![], vec!["127.0.0.1:2380".to_string()], vec!["http://h".to_string()]] {
            assert_eq!(
                check_urls(&bad),
                Err(EngineError::Membership(MembershipError::BadUrls)),
                "{bad:?}"
            );
        }
        assert_eq!(check_urls(&["https://h:1".to_string()]), Ok(()));
    }
}
