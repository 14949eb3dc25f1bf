//! `Maintenance.Alarm` and the alarms in `Maintenance.Status`, as etcd answers them.

use std::collections::BTreeSet;

use cairn_kv::{AlarmMember, AlarmType};
use cairn_proto::etcdserverpb as pb;
use tonic::{Response, Status};

use crate::errors::status;
use crate::services::Ctx;

fn to_pb(a: AlarmMember) -> pb::AlarmMember {
    pb::AlarmMember { member_id: a.member, alarm: a.alarm as i32 }
}

/// etcd's Alarm: GET lists the raised alarms of the type asked (NONE: every type, whatever
/// the member id); ACTIVATE and DEACTIVATE go through Raft and answer the alarm they changed.
pub(crate) async fn alarm(
    ctx: &Ctx,
    r: pb::AlarmRequest,
) -> Result<Response<pb::AlarmResponse>, Status> {
    let alarm = AlarmType::from_i32(r.alarm)
        .ok_or_else(|| Status::invalid_argument(format!("unknown alarm type {}", r.alarm)))?;
    let target = AlarmMember { member: r.member_id, alarm };
    use pb::alarm_request::AlarmAction;
    let action = AlarmAction::try_from(r.action)
        .map_err(|_| Status::invalid_argument(format!("unknown alarm action {}", r.action)))?;
    let alarms: Vec<AlarmMember> = match action {
        AlarmAction::Get => {
            let all = ctx.engine.alarms().await.map_err(status)?;
            all.into_iter().filter(|a| alarm == AlarmType::None || a.alarm == alarm).collect()
        }
        AlarmAction::Activate => {
            ctx.engine.alarm_activate(target).await.map_err(status)?.into_iter().collect()
        }
        AlarmAction::Deactivate => {
            ctx.engine.alarm_deactivate(target).await.map_err(status)?.into_iter().collect()
        }
    };
    let rev = ctx.engine.revision();
    Ok(Response::new(pb::AlarmResponse {
        header: ctx.header().at(rev),
        alarms: alarms.into_iter().map(to_pb).collect(),
    }))
}

/// Status's `errors`: a storage failure, then each raised alarm as etcd prints it (the
/// protobuf text of its `AlarmMember`), which `etcdctl endpoint status` shows.
pub(crate) fn status_errors(s: &cairn_node::Status, alarms: &BTreeSet<AlarmMember>) -> Vec<String> {
    let failure = s.failure.iter().map(|e| format!("storage failure: {e}"));
    let alarms = alarms.iter().map(|a| format!("memberID:{} alarm:{} ", a.member, a.alarm.name()));
    failure.chain(alarms).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lists_alarms_as_etcd_prints_them() {
        let alarms = [
            AlarmMember { member: 10276657743932975437, alarm: AlarmType::NoSpace },
            AlarmMember { member: 1, alarm: AlarmType::Corrupt },
        ]
        .into_iter()
        .collect();
        let got = status_errors(&cairn_node::Status::default(), &alarms);
        assert_eq!(
            got,
            ["memberID:1 alarm:CORRUPT ", "memberID:10276657743932975437 alarm:NOSPACE "]
        );
    }
}
