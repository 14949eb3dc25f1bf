//! etcd's periodic corruption check (`--corrupt-check-time`, 3.5's
//! `--experimental-corrupt-check-time`): the leader asks every other member over the client API
//! for its HashKV at the leader's revision, and raises a CORRUPT alarm for a member whose hash
//! differs at the same compaction point, which stops writes until an operator looks.

use std::time::Duration;

use cairn_kv::{AlarmMember, AlarmType, Revision};
use cairn_node::Engine;
use cairn_proto::etcdserverpb as pb;

/// How long one member may take to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// What a member's answer says about it, against the leader's own hash.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Same,
    /// Compacted at another point (or not yet at the revision): not comparable this round.
    Incomparable,
    Corrupt,
}

pub(crate) fn judge(mine: &cairn_kv::KvHash, theirs: &pb::HashKvResponse) -> Verdict {
    if theirs.compact_revision != mine.compact_revision.0 || theirs.hash_revision != mine.revision.0
    {
        Verdict::Incomparable
    } else if theirs.hash != mine.hash {
        Verdict::Corrupt
    } else {
        Verdict::Same
    }
}

/// Runs the check every `interval` while this member leads, until the process ends.
pub(crate) async fn run(engine: std::sync::Arc<Engine>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let me = engine.identity().1;
        if engine.leader() == Some(me) {
            check_once(&engine, me).await;
        }
    }
}

async fn ask(url: &str, rev: Revision) -> Result<pb::HashKvResponse, String> {
    let call = async {
        let mut c = pb::maintenance_client::MaintenanceClient::connect(url.to_string())
            .await
            .map_err(|e| e.to_string())?;
        let req = pb::HashKvRequest { revision: rev.0 };
        c.hash_kv(req).await.map(|r| r.into_inner()).map_err(|e| e.message().to_string())
    };
    tokio::time::timeout(ASK_TIMEOUT, call).await.map_err(|_| "timed out".to_string())?
}

async fn check_once(engine: &Engine, me: u64) {
    let rev = engine.revision();
    let Ok(mine) = engine.hash_kv(rev) else { return };
    for (id, attributes) in engine.members() {
        let Some(url) = attributes.client_urls.first().filter(|_| id != me) else { continue };
        let theirs = match ask(url, rev).await {
            Ok(h) => h,
            // Behind (a future revision to it), compacted past it, or unreachable: next round.
            Err(e) => {
                tracing::debug!("corruption check: member {id:016x} at {url}: {e}");
                continue;
            }
        };
        if judge(&mine, &theirs) != Verdict::Corrupt {
            continue;
        }
        tracing::error!(
            "corruption check: member {id:016x} hashes revision {} to {}, this leader to {}; \
             raising CORRUPT",
            rev.0,
            theirs.hash,
            mine.hash
        );
        let alarm = AlarmMember { member: id, alarm: AlarmType::Corrupt };
        if let Err(e) = engine.alarm_activate(alarm).await {
            tracing::warn!("raising CORRUPT for member {id:016x} failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_different_hash_at_the_same_revision_and_compaction_is_corrupt() {
        let mine =
            cairn_kv::KvHash { hash: 7, revision: Revision(10), compact_revision: Revision(3) };
        let theirs = |hash, hash_revision, compact_revision| pb::HashKvResponse {
            header: None,
            hash,
            hash_revision,
            compact_revision,
        };
        assert_eq!(judge(&mine, &theirs(7, 10, 3)), Verdict::Same);
        assert_eq!(judge(&mine, &theirs(8, 10, 3)), Verdict::Corrupt);
        assert_eq!(judge(&mine, &theirs(8, 10, 5)), Verdict::Incomparable);
        assert_eq!(judge(&mine, &theirs(8, 9, 3)), Verdict::Incomparable);
    }
}
