//! The Raft entry encoding of commands: round trips, and hostile bytes never panic.

use bytes::Bytes;
use cairn_kv::*;
use cairn_node::command::{decode, encode};
use proptest::prelude::*;

fn bytes() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..6).prop_map(Bytes::from)
}

fn rev() -> impl Strategy<Value = Revision> {
    any::<i64>().prop_map(Revision)
}

fn range() -> impl Strategy<Value = RangeRequest> {
    let sort = (0u8..3, 0u8..5).prop_map(|(o, t)| {
        (
            [SortOrder::None, SortOrder::Ascend, SortOrder::Descend][o as usize],
            [
                SortTarget::Key,
                SortTarget::Version,
                SortTarget::Create,
                SortTarget::Mod,
                SortTarget::Value,
            ][t as usize],
        )
    });
    (
        bytes(),
        bytes(),
        any::<i64>(),
        rev(),
        sort,
        any::<(bool, bool, bool)>(),
        (rev(), rev(), rev(), rev()),
    )
        .prop_map(
            |(
                key,
                range_end,
                limit,
                revision,
                (sort_order, sort_target),
                (serializable, keys_only, count_only),
                f,
            )| RangeRequest {
                key,
                range_end,
                limit,
                revision,
                sort_order,
                sort_target,
                serializable,
                keys_only,
                count_only,
                min_mod_revision: f.0,
                max_mod_revision: f.1,
                min_create_revision: f.2,
                max_create_revision: f.3,
            },
        )
}

fn put() -> impl Strategy<Value = PutRequest> {
    (bytes(), bytes(), any::<i64>(), any::<(bool, bool, bool)>()).prop_map(
        |(key, value, lease, (prev_kv, ignore_value, ignore_lease))| PutRequest {
            key,
            value,
            lease: LeaseId(lease),
            prev_kv,
            ignore_value,
            ignore_lease,
        },
    )
}

fn delete() -> impl Strategy<Value = DeleteRangeRequest> {
    (bytes(), bytes(), any::<bool>()).prop_map(|(key, range_end, prev_kv)| DeleteRangeRequest {
        key,
        range_end,
        prev_kv,
    })
}

fn compare() -> impl Strategy<Value = Compare> {
    let target = prop_oneof![
        any::<i64>().prop_map(CompareTarget::Version),
        rev().prop_map(CompareTarget::Create),
        rev().prop_map(CompareTarget::Mod),
        bytes().prop_map(CompareTarget::Value),
        any::<i64>().prop_map(|l| CompareTarget::Lease(LeaseId(l))),
    ];
    let result = prop::sample::select(vec![
        CompareResult::Equal,
        CompareResult::Greater,
        CompareResult::Less,
        CompareResult::NotEqual,
    ]);
    (bytes(), bytes(), target, result).prop_map(|(key, range_end, target, result)| Compare {
        key,
        range_end,
        target,
        result,
    })
}

fn txn() -> impl Strategy<Value = TxnRequest> {
    let leaf = prop_oneof![
        range().prop_map(RequestOp::Range),
        put().prop_map(RequestOp::Put),
        delete().prop_map(RequestOp::DeleteRange),
    ];
    let ops = leaf.prop_recursive(3, 12, 3, |inner| {
        (
            prop::collection::vec(compare(), 0..2),
            prop::collection::vec(inner.clone(), 0..3),
            prop::collection::vec(inner, 0..3),
        )
            .prop_map(|(compare, success, failure)| {
                RequestOp::Txn(TxnRequest { compare, success, failure })
            })
    });
    (
        prop::collection::vec(compare(), 0..3),
        prop::collection::vec(ops.clone(), 0..3),
        prop::collection::vec(ops, 0..3),
    )
        .prop_map(|(compare, success, failure)| TxnRequest { compare, success, failure })
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        put().prop_map(Command::Put),
        delete().prop_map(Command::DeleteRange),
        txn().prop_map(Command::Txn),
        (rev(), any::<bool>()).prop_map(|(revision, physical)| Command::Compact(CompactRequest {
            revision,
            physical
        })),
        (any::<u64>(), ".{0,4}", prop::collection::vec(".{0,8}", 0..3)).prop_map(
            |(member, name, client_urls)| Command::PublishMember {
                member,
                attributes: MemberAttributes { name, client_urls, ..Default::default() },
            }
        ),
        (any::<u64>(), 0u8..3, any::<bool>()).prop_map(|(member, t, on)| {
            let alarm = [AlarmType::None, AlarmType::NoSpace, AlarmType::Corrupt][t as usize];
            let a = AlarmMember { member, alarm };
            if on {
                Command::AlarmActivate(a)
            } else {
                Command::AlarmDeactivate(a)
            }
        }),
        (
            prop::collection::vec((any::<u64>(), prop::collection::vec(".{0,8}", 0..3)), 0..3),
            prop::collection::vec(any::<u64>(), 0..3)
        )
            .prop_map(|(peers, removed)| Command::Membership { peers, removed }),
        lease_command(),
    ]
}

fn lease_command() -> impl Strategy<Value = Command> {
    let id = || any::<i64>().prop_map(LeaseId);
    prop_oneof![
        (id(), any::<i64>()).prop_map(|(id, ttl)| Command::LeaseGrant { id, ttl }),
        id().prop_map(|id| Command::LeaseRevoke { id }),
        (id(), any::<u64>()).prop_map(|(id, grant_index)| Command::LeaseExpire { id, grant_index }),
        prop::collection::vec((id(), any::<i64>()), 0..3)
            .prop_map(|checkpoints| Command::LeaseCheckpoint { checkpoints }),
        prop::collection::vec((id(), any::<u64>(), any::<i64>()), 0..3).prop_map(|checkpoints| {
            let checkpoints = checkpoints
                .into_iter()
                .map(|(id, grant_index, remaining)| GrantCheckpoint { id, grant_index, remaining })
                .collect();
            Command::LeaseGrantCheckpoint { checkpoints }
        }),
    ]
}

proptest! {
    #[test]
    fn commands_round_trip(id in any::<u64>(), cmd in command()) {
        prop_assert_eq!(decode(&encode(id, &cmd)), Ok((id, cmd)));
    }

    #[test]
    fn truncated_or_garbage_input_never_panics(cmd in command(), cut in any::<prop::sample::Index>(), junk in prop::collection::vec(any::<u8>(), 0..64)) {
        let raw = encode(7, &cmd);
        let cut = cut.index(raw.len());
        if cut < raw.len() {
            prop_assert!(decode(&raw[..cut]).is_err());
        }
        let _ = decode(&junk);
    }
}

#[test]
fn member_attributes_that_are_not_utf8_are_refused() {
    let cmd = Command::PublishMember {
        member: 7,
        attributes: MemberAttributes {
            name: "m".into(),
            client_urls: vec!["u".into()],
            ..Default::default()
        },
    };
    let raw = encode(1, &cmd).to_vec();
    assert_eq!(decode(&raw), Ok((1, cmd)));
    // version, id, tag, member id, then the name: its length and its one byte.
    let name_at = 1 + 8 + 1 + 8 + 4;
    assert_eq!(raw[name_at], b'm');
    let mut bad = raw.clone();
    bad[name_at] = 0xff;
    assert!(decode(&bad).is_err(), "a name that is not UTF-8");
    let mut bad = raw;
    let last = bad.len() - 1;
    bad[last] = 0xfe;
    assert!(decode(&bad).is_err(), "a URL that is not UTF-8");
}

#[test]
fn deeply_nested_transactions_are_refused_not_overflowed() {
    // version, id, tag Txn, then 100k nested "one success op that is a txn" levels.
    let mut raw = vec![1u8];
    raw.extend_from_slice(&0u64.to_be_bytes());
    raw.push(3);
    for _ in 0..100_000 {
        raw.extend_from_slice(&0u32.to_be_bytes()); // no compares
        raw.extend_from_slice(&1u32.to_be_bytes()); // one success op
        raw.push(3); // a nested txn
    }
    assert!(decode(&raw).is_err());
}

/// A revoke an older cairn wrote (tag 7, the id alone) still decodes as the unconditional
/// revoke it was; the leader's expiry of one grant has a tag of its own (10).
#[test]
fn lease_revokes_keep_their_encoding_and_expiries_name_the_grant() {
    let mut old = vec![1u8];
    old.extend_from_slice(&42u64.to_be_bytes());
    old.push(7);
    old.extend_from_slice(&9i64.to_be_bytes());
    assert_eq!(decode(&old), Ok((42, Command::LeaseRevoke { id: LeaseId(9) })));
    let expire = Command::LeaseExpire { id: LeaseId(9), grant_index: 1234 };
    let mut raw = old[..9].to_vec();
    raw.push(10);
    raw.extend_from_slice(&9i64.to_be_bytes());
    raw.extend_from_slice(&1234u64.to_be_bytes());
    assert_eq!(encode(42, &expire).to_vec(), raw);
    assert_eq!(decode(&raw), Ok((42, expire)));
}

/// A checkpoint an older cairn wrote (tag 8, leases by id alone) still decodes as the checkpoint
/// by id it was; checkpoints that name their grant have a tag of their own (11), each record
/// `id i64 | grant_index u64 | remaining i64`.
#[test]
fn checkpoints_by_id_keep_their_encoding_and_checkpoints_of_a_grant_name_it() {
    let mut old = vec![1u8];
    old.extend_from_slice(&42u64.to_be_bytes());
    old.push(8);
    old.extend_from_slice(&2u32.to_be_bytes());
    for (id, remaining) in [(9i64, 30i64), (-4, 0)] {
        old.extend_from_slice(&id.to_be_bytes());
        old.extend_from_slice(&remaining.to_be_bytes());
    }
    let by_id = Command::LeaseCheckpoint { checkpoints: vec![(LeaseId(9), 30), (LeaseId(-4), 0)] };
    assert_eq!(decode(&old), Ok((42, by_id.clone())));
    assert_eq!(encode(42, &by_id).to_vec(), old);

    let of_grant = GrantCheckpoint { id: LeaseId(9), grant_index: 1234, remaining: 30 };
    let cmd = Command::LeaseGrantCheckpoint { checkpoints: vec![of_grant] };
    let mut raw = old[..9].to_vec();
    raw.push(11);
    raw.extend_from_slice(&1u32.to_be_bytes());
    raw.extend_from_slice(&9i64.to_be_bytes());
    raw.extend_from_slice(&1234u64.to_be_bytes());
    raw.extend_from_slice(&30i64.to_be_bytes());
    assert_eq!(encode(42, &cmd).to_vec(), raw);
    assert_eq!(decode(&raw), Ok((42, cmd)));
}

/// A checkpoint count larger than the input could hold is refused before anything is made for
/// it, for either tag.
#[test]
fn a_checkpoint_count_beyond_the_input_is_refused() {
    for (tag, record) in [(8u8, 16usize), (11, 24)] {
        let mut raw = vec![1u8];
        raw.extend_from_slice(&7u64.to_be_bytes());
        raw.push(tag);
        // Two records claimed, one and a half present: within the bytes-per-element bound
        // `count` checks, beyond the record size.
        raw.extend_from_slice(&2u32.to_be_bytes());
        raw.extend(std::iter::repeat_n(0u8, record + record / 2));
        let err = decode(&raw).map(|_| ()).map_err(|e| e.to_string());
        assert_eq!(err, Err("malformed command: truncated".into()), "tag {tag}");
        let mut huge = raw[..10].to_vec();
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode(&huge).is_err(), "tag {tag}");
    }
}
