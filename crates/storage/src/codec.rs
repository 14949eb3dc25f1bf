//! Byte encodings of the Raft types the WAL stores. The core's types are not serializable on
//! purpose; their disk format is defined here, once, in explicit big-endian fields.
//!
//! - Entry: `term u64 | index u64 | kind u8 | body` where kind 0 is normal data (the body is the
//!   data) and kind 1 a membership change (`leave_joint u8 | count u32 | (op u8, node u64)*`).
//! - HardState: `term u64 | vote u64 (0 = none) | commit u64`.
//! - SnapshotMeta: `index u64 | term u64 | auto_leave u8 | four id sets` (voters, outgoing voters,
//!   learners, next learners), each `count u32 | node u64*`.

use std::collections::BTreeSet;

use bytes::{Buf, BufMut, Bytes};
use cairn_raft::{
    ConfChange, ConfChangeSingle, ConfState, Entry, EntryPayload, HardState, LeaveJoint, LogIndex,
    NodeId, SnapshotMeta, Term,
};

/// Bytes that do not decode: the record passed its checksum, so this is a bug or a format change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

fn need(buf: &[u8], n: usize) -> Result<(), DecodeError> {
    if buf.len() < n {
        Err(DecodeError("record too short"))
    } else {
        Ok(())
    }
}

fn get_u64(buf: &mut &[u8]) -> Result<u64, DecodeError> {
    need(buf, 8)?;
    Ok(buf.get_u64())
}

fn get_u32(buf: &mut &[u8]) -> Result<u32, DecodeError> {
    need(buf, 4)?;
    Ok(buf.get_u32())
}

fn get_u8(buf: &mut &[u8]) -> Result<u8, DecodeError> {
    need(buf, 1)?;
    Ok(buf.get_u8())
}

pub fn encode_entry(e: &Entry, out: &mut Vec<u8>) {
    out.put_u64(e.term.0);
    out.put_u64(e.index.0);
    match &e.payload {
        EntryPayload::Normal(data) => {
            out.put_u8(0);
            out.put_slice(data);
        }
        EntryPayload::ConfChange(cc) => {
            out.put_u8(1);
            out.put_u8(u8::from(cc.leave_joint == LeaveJoint::Explicit));
            out.put_u32(cc.changes.len() as u32);
            for c in &cc.changes {
                let (op, id) = match c {
                    ConfChangeSingle::AddVoter(id) => (0, id),
                    ConfChangeSingle::AddLearner(id) => (1, id),
                    ConfChangeSingle::Remove(id) => (2, id),
                };
                out.put_u8(op);
                out.put_u64(id.0);
            }
            // The context runs to the record's end; records written before it existed end
            // right after the changes and decode with an empty one.
            out.put_slice(&cc.context);
        }
    }
}

pub fn decode_entry(mut buf: &[u8]) -> Result<Entry, DecodeError> {
    let term = Term(get_u64(&mut buf)?);
    let index = LogIndex(get_u64(&mut buf)?);
    let payload = match get_u8(&mut buf)? {
        0 => EntryPayload::Normal(Bytes::copy_from_slice(buf)),
        1 => {
            let leave_joint =
                if get_u8(&mut buf)? == 1 { LeaveJoint::Explicit } else { LeaveJoint::Auto };
            let n = get_u32(&mut buf)? as usize;
            let mut changes = Vec::with_capacity(n.min(64));
            for _ in 0..n {
                let op = get_u8(&mut buf)?;
                let id = NodeId(get_u64(&mut buf)?);
                changes.push(match op {
                    0 => ConfChangeSingle::AddVoter(id),
                    1 => ConfChangeSingle::AddLearner(id),
                    2 => ConfChangeSingle::Remove(id),
                    _ => return Err(DecodeError("unknown membership change")),
                });
            }
            let context = Bytes::copy_from_slice(buf);
            EntryPayload::ConfChange(ConfChange { changes, leave_joint, context })
        }
        _ => return Err(DecodeError("unknown entry kind")),
    };
    Ok(Entry { term, index, payload })
}

pub fn encode_hard_state(hs: &HardState, out: &mut Vec<u8>) {
    out.put_u64(hs.term.0);
    out.put_u64(hs.vote.map_or(0, |v| v.0));
    out.put_u64(hs.commit.0);
}

pub fn decode_hard_state(mut buf: &[u8]) -> Result<HardState, DecodeError> {
    let term = Term(get_u64(&mut buf)?);
    let vote = get_u64(&mut buf)?;
    let commit = LogIndex(get_u64(&mut buf)?);
    Ok(HardState { term, vote: (vote != 0).then_some(NodeId(vote)), commit })
}

fn put_ids(out: &mut Vec<u8>, ids: &BTreeSet<NodeId>) {
    out.put_u32(ids.len() as u32);
    for id in ids {
        out.put_u64(id.0);
    }
}

fn get_ids(buf: &mut &[u8]) -> Result<BTreeSet<NodeId>, DecodeError> {
    let n = get_u32(buf)?;
    (0..n).map(|_| get_u64(buf).map(NodeId)).collect()
}

pub fn encode_snapshot_meta(m: &SnapshotMeta, out: &mut Vec<u8>) {
    out.put_u64(m.index.0);
    out.put_u64(m.term.0);
    let cs = &m.conf_state;
    out.put_u8(u8::from(cs.auto_leave));
    for set in [&cs.voters, &cs.voters_outgoing, &cs.learners, &cs.learners_next] {
        put_ids(out, set);
    }
}

pub fn decode_snapshot_meta(mut buf: &[u8]) -> Result<SnapshotMeta, DecodeError> {
    let index = LogIndex(get_u64(&mut buf)?);
    let term = Term(get_u64(&mut buf)?);
    let auto_leave = get_u8(&mut buf)? == 1;
    let conf_state = ConfState {
        voters: get_ids(&mut buf)?,
        voters_outgoing: get_ids(&mut buf)?,
        learners: get_ids(&mut buf)?,
        learners_next: get_ids(&mut buf)?,
        auto_leave,
    };
    Ok(SnapshotMeta { index, term, conf_state })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn entry() -> impl Strategy<Value = Entry> {
        let change = (0u8..3, 1u64..100).prop_map(|(op, id)| match op {
            0 => ConfChangeSingle::AddVoter(NodeId(id)),
            1 => ConfChangeSingle::AddLearner(NodeId(id)),
            _ => ConfChangeSingle::Remove(NodeId(id)),
        });
        let payload = prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64).prop_map(|d| EntryPayload::Normal(d.into())),
            (
                prop::collection::vec(change, 0..4),
                any::<bool>(),
                prop::collection::vec(any::<u8>(), 0..16)
            )
                .prop_map(|(changes, explicit, context)| {
                    let leave_joint =
                        if explicit { LeaveJoint::Explicit } else { LeaveJoint::Auto };
                    let context = context.into();
                    EntryPayload::ConfChange(ConfChange { changes, leave_joint, context })
                }),
        ];
        (any::<u64>(), any::<u64>(), payload).prop_map(|(t, i, payload)| Entry {
            term: Term(t),
            index: LogIndex(i),
            payload,
        })
    }

    #[test]
    fn a_membership_change_logged_before_contexts_existed_reads_with_none() {
        // A record as this codec wrote it before `ConfChange::context`: term, index, kind 1,
        // leave_joint, one change (add voter 7).
        let mut old = Vec::new();
        old.extend_from_slice(&3u64.to_be_bytes());
        old.extend_from_slice(&1u64.to_be_bytes());
        old.extend_from_slice(&[1, 0]);
        old.extend_from_slice(&1u32.to_be_bytes());
        old.push(0);
        old.extend_from_slice(&7u64.to_be_bytes());
        let e = decode_entry(&old).expect("an old record decodes");
        let cc = ConfChange {
            changes: vec![ConfChangeSingle::AddVoter(NodeId(7))],
            ..ConfChange::default()
        };
        assert_eq!(e.payload, EntryPayload::ConfChange(cc));
    }

    proptest! {
        #[test]
        fn entries_round_trip(e in entry()) {
            let mut buf = Vec::new();
            encode_entry(&e, &mut buf);
            prop_assert_eq!(decode_entry(&buf), Ok(e));
        }

        #[test]
        fn hard_states_round_trip(t in any::<u64>(), v in 0u64..5, c in any::<u64>()) {
            let hs = HardState { term: Term(t), vote: (v != 0).then_some(NodeId(v)), commit: LogIndex(c) };
            let mut buf = Vec::new();
            encode_hard_state(&hs, &mut buf);
            prop_assert_eq!(decode_hard_state(&buf), Ok(hs));
        }

        #[test]
        fn snapshot_metas_round_trip(i in any::<u64>(), t in any::<u64>(), v in prop::collection::btree_set(1u64..9, 0..5), auto in any::<bool>()) {
            let conf_state = ConfState { voters: v.iter().map(|&x| NodeId(x)).collect(), auto_leave: auto, ..ConfState::default() };
            let m = SnapshotMeta { index: LogIndex(i), term: Term(t), conf_state };
            let mut buf = Vec::new();
            encode_snapshot_meta(&m, &mut buf);
            prop_assert_eq!(decode_snapshot_meta(&buf), Ok(m));
        }

        #[test]
        fn truncated_records_never_panic(e in entry(), cut in 0usize..40) {
            let mut buf = Vec::new();
            encode_entry(&e, &mut buf);
            let cut = cut.min(buf.len());
            let _ = decode_entry(&buf[..cut]);
        }
    }
}
