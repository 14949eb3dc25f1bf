//! The peer wire format: exact round trips, and refusal (never a panic, never a huge allocation)
//! of anything a broken or hostile peer could send.

use std::collections::BTreeSet;

use bytes::Bytes;
use cairn_raft::{
    ConfChange, ConfChangeSingle, ConfState, Entry, EntryPayload, HeartbeatSeq, LeaveJoint,
    LogIndex, Message, MessageBody, NodeId, ReadCtx, RejectHint, Snapshot, SnapshotMeta, Term,
};
use cairn_transport::codec::{
    decode_batch, decode_hello, decode_probe, decode_reply, decode_snap_frame, encode_batch,
    encode_hello, encode_probe, encode_reply, encode_snap_frame, parse_frame_header, DecodeError,
    Hello, SnapFrame, StreamKind, FRAME_HEADER_LEN, HELLO_LEN, MAGIC, MAX_REASON_LEN, VERSION,
};
use proptest::collection::{btree_set, vec};
use proptest::prelude::*;

/// Small values and full-width ones, so varints of every length (and zero) show up.
fn num() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..300, any::<u64>()]
}

fn node() -> impl Strategy<Value = NodeId> {
    num().prop_map(NodeId)
}

fn small_bytes() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..24).prop_map(Bytes::from)
}

/// Mostly small data; with `big`, sometimes hundreds of KiB (patterned: generating that many
/// independent random bytes per case would make the suite crawl).
fn data(big: bool) -> BoxedStrategy<Bytes> {
    if !big {
        return small_bytes().boxed();
    }
    let large = (0usize..300_000, any::<u8>())
        .prop_map(|(n, seed)| (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect());
    prop_oneof![4 => small_bytes(), 1 => large.prop_map(|v: Vec<u8>| Bytes::from(v))].boxed()
}

fn ids() -> impl Strategy<Value = BTreeSet<NodeId>> {
    btree_set(node(), 0..5)
}

fn payload() -> impl Strategy<Value = EntryPayload> {
    let change = (0u8..3, node()).prop_map(|(op, id)| match op {
        0 => ConfChangeSingle::AddVoter(id),
        1 => ConfChangeSingle::AddLearner(id),
        _ => ConfChangeSingle::Remove(id),
    });
    let leave = prop_oneof![Just(LeaveJoint::Auto), Just(LeaveJoint::Explicit)];
    prop_oneof![
        small_bytes().prop_map(EntryPayload::Normal),
        (vec(change, 0..5), leave, small_bytes()).prop_map(|(changes, leave_joint, context)| {
            EntryPayload::ConfChange(ConfChange { changes, leave_joint, context })
        }),
    ]
}

fn entry() -> impl Strategy<Value = Entry> {
    (num(), num(), payload()).prop_map(|(t, i, payload)| Entry {
        term: Term(t),
        index: LogIndex(i),
        payload,
    })
}

fn snapshot(big: bool) -> impl Strategy<Value = Snapshot> {
    let conf =
        (ids(), ids(), ids(), ids(), any::<bool>()).prop_map(|(v, vo, l, ln, auto)| ConfState {
            voters: v,
            voters_outgoing: vo,
            learners: l,
            learners_next: ln,
            auto_leave: auto,
        });
    (num(), num(), conf, data(big)).prop_map(|(i, t, conf_state, data)| Snapshot {
        meta: SnapshotMeta { index: LogIndex(i), term: Term(t), conf_state },
        data,
    })
}

fn ctxs() -> impl Strategy<Value = Vec<ReadCtx>> {
    vec(small_bytes().prop_map(ReadCtx), 0..4)
}

fn body(big: bool) -> impl Strategy<Value = MessageBody> {
    let hint = (num(), num()).prop_map(|(i, t)| RejectHint { index: LogIndex(i), term: Term(t) });
    prop_oneof![
        (num(), num(), vec(entry(), 0..5), num()).prop_map(|(pi, pt, entries, c)| {
            MessageBody::Append {
                prev_index: LogIndex(pi),
                prev_term: Term(pt),
                entries,
                commit: LogIndex(c),
            }
        }),
        (num(), proptest::option::of(hint))
            .prop_map(|(i, reject)| MessageBody::AppendResp { index: LogIndex(i), reject }),
        (any::<bool>(), num(), num(), any::<bool>()).prop_map(|(pre_vote, li, lt, transfer)| {
            MessageBody::Vote { pre_vote, last_index: LogIndex(li), last_term: Term(lt), transfer }
        }),
        (any::<bool>(), any::<bool>())
            .prop_map(|(pre_vote, granted)| MessageBody::VoteResp { pre_vote, granted }),
        (num(), num()).prop_map(|(c, s)| MessageBody::Heartbeat {
            commit: LogIndex(c),
            seq: HeartbeatSeq(s)
        }),
        num().prop_map(|s| MessageBody::HeartbeatResp { seq: HeartbeatSeq(s) }),
        snapshot(big).prop_map(|snapshot| MessageBody::Snapshot { snapshot }),
        vec(payload(), 0..4).prop_map(|payloads| MessageBody::Propose { payloads }),
        ctxs().prop_map(|ctxs| MessageBody::ReadIndex { ctxs }),
        (ctxs(), num())
            .prop_map(|(ctxs, i)| MessageBody::ReadIndexResp { ctxs, index: LogIndex(i) }),
        node().prop_map(|target| MessageBody::TransferLeader { target }),
        Just(MessageBody::TimeoutNow),
    ]
}

fn message(big: bool) -> impl Strategy<Value = Message> {
    (node(), node(), num(), body(big)).prop_map(|(from, to, t, body)| Message {
        from,
        to,
        term: Term(t),
        body,
    })
}

fn batch(big: bool) -> impl Strategy<Value = Vec<Message>> {
    vec(message(big), 0..8)
}

/// Encodes a batch and splits the frame into its checked header fields and payload.
fn frame_of(msgs: &[Message]) -> (Bytes, u32) {
    let mut buf = Vec::new();
    encode_batch(msgs, &mut buf);
    split_frame(buf)
}

fn split_frame(buf: Vec<u8>) -> (Bytes, u32) {
    let header: [u8; FRAME_HEADER_LEN] = buf[..FRAME_HEADER_LEN].try_into().unwrap();
    let (len, crc) = parse_frame_header(&header, u32::MAX).unwrap();
    assert_eq!(len as usize, buf.len() - FRAME_HEADER_LEN);
    (Bytes::from(buf).slice(FRAME_HEADER_LEN..), crc)
}

/// Decodes a payload whose checksum is right, so only its structure is on trial.
fn decode_unchecked(payload: &[u8]) -> Result<Vec<Message>, DecodeError> {
    decode_batch(Bytes::copy_from_slice(payload), crc32c::crc32c(payload))
}

fn msg(body: MessageBody) -> Message {
    Message { from: NodeId(1), to: NodeId(2), term: Term(3), body }
}

proptest! {
    #[test]
    fn batches_round_trip(msgs in batch(true)) {
        let (payload, crc) = frame_of(&msgs);
        prop_assert_eq!(decode_batch(payload, crc), Ok(msgs));
    }

    #[test]
    fn frames_append_to_what_is_in_the_buffer(a in batch(false), b in batch(false)) {
        let mut buf = Vec::new();
        encode_batch(&a, &mut buf);
        let first = buf.len();
        encode_batch(&b, &mut buf);
        let (pa, ca) = split_frame(buf[..first].to_vec());
        let (pb, cb) = split_frame(buf[first..].to_vec());
        prop_assert_eq!(decode_batch(pa, ca), Ok(a));
        prop_assert_eq!(decode_batch(pb, cb), Ok(b));
    }

    #[test]
    fn every_strict_prefix_is_truncated(msgs in batch(false)) {
        let (payload, _) = frame_of(&msgs);
        for cut in 0..payload.len() {
            prop_assert_eq!(decode_unchecked(&payload[..cut]), Err(DecodeError::Truncated));
        }
    }

    #[test]
    fn any_flipped_bit_fails_the_checksum(msgs in batch(false), bit in any::<prop::sample::Index>()) {
        let (payload, crc) = frame_of(&msgs);
        let mut bad = payload.to_vec();
        let bit = bit.index(bad.len() * 8);
        bad[bit / 8] ^= 1 << (bit % 8);
        let result = decode_batch(Bytes::from(bad), crc);
        prop_assert!(matches!(result, Err(DecodeError::ChecksumMismatch { .. })), "{:?}", result);
    }

    #[test]
    fn random_payloads_never_panic(bytes in vec(any::<u8>(), 0..512)) {
        let _ = decode_unchecked(&bytes);
    }

    #[test]
    fn corrupted_payloads_never_panic(
        msgs in batch(false),
        edits in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let (payload, _) = frame_of(&msgs);
        let mut bad = payload.to_vec();
        for (at, byte) in edits {
            let at = at.index(bad.len());
            bad[at] = byte;
        }
        let _ = decode_unchecked(&bad);
    }

    #[test]
    fn hellos_round_trip(cluster_id in any::<u64>(), from in node(), to in node(), snap in 0u8..5) {
        let kind = match snap {
            0 => StreamKind::Messages,
            1 => StreamKind::Snapshot,
            2 => StreamKind::SnapshotStream,
            3 => StreamKind::Members,
            _ => StreamKind::Probe,
        };
        let h = Hello { cluster_id, from, to, kind };
        let mut buf = vec![0xAA];
        encode_hello(&h, &mut buf);
        prop_assert_eq!(buf.len(), 1 + HELLO_LEN);
        prop_assert_eq!(&buf[1..9], &MAGIC[..]);
        prop_assert_eq!(&buf[9..11], &VERSION.to_le_bytes()[..]);
        let arr: [u8; HELLO_LEN] = buf[1..].try_into().unwrap();
        prop_assert_eq!(decode_hello(&arr), Ok(h));
    }

    #[test]
    fn refusals_round_trip(reason in vec(any::<char>(), 0..600)) {
        let reason: String = reason.into_iter().collect();
        let mut expected = String::new();
        for c in reason.chars() {
            if expected.len() + c.len_utf8() > MAX_REASON_LEN {
                break;
            }
            expected.push(c);
        }
        let mut buf = Vec::new();
        encode_reply(Err(&reason), &mut buf);
        let (payload, crc) = split_frame(buf);
        prop_assert_eq!(decode_reply(payload, crc), Ok(Err(expected)));
    }

    #[test]
    fn probes_round_trip(seq in any::<u64>()) {
        let mut buf = vec![0xAA];
        encode_probe(seq, &mut buf);
        let (payload, crc) = split_frame(buf[1..].to_vec());
        prop_assert_eq!(decode_probe(payload, crc), Ok(seq));
    }
}

#[test]
fn malformed_probes_are_refused() {
    let check = |p: &[u8]| decode_probe(Bytes::copy_from_slice(p), crc32c::crc32c(p));
    assert_eq!(check(&[]), Err(DecodeError::Truncated));
    assert_eq!(check(&[7, 0]), Err(DecodeError::TrailingBytes));
    assert_eq!(check(&[0x80]), Err(DecodeError::Truncated));
    assert_eq!(
        decode_probe(Bytes::from_static(&[7]), 0),
        Err(DecodeError::ChecksumMismatch { expected: 0, actual: crc32c::crc32c(&[7]) })
    );
}

#[test]
fn empty_and_edge_values_round_trip() {
    let msgs = vec![
        Message { from: NodeId(0), to: NodeId(0), term: Term(0), body: MessageBody::TimeoutNow },
        msg(MessageBody::Append {
            prev_index: LogIndex(u64::MAX),
            prev_term: Term(0),
            entries: vec![Entry {
                term: Term(3),
                index: LogIndex(u64::MAX),
                payload: EntryPayload::Normal(Bytes::new()),
            }],
            commit: LogIndex(0),
        }),
        msg(MessageBody::ReadIndex { ctxs: vec![ReadCtx(Bytes::new()), ReadCtx(Bytes::new())] }),
        msg(MessageBody::AppendResp { index: LogIndex(5), reject: None }),
        msg(MessageBody::Snapshot { snapshot: Snapshot::default() }),
    ];
    let (payload, crc) = frame_of(&msgs);
    assert_eq!(decode_batch(payload, crc), Ok(msgs));
    let (payload, crc) = frame_of(&[]);
    assert_eq!(&payload[..], &[0]);
    assert_eq!(decode_batch(payload, crc), Ok(vec![]));
}

#[test]
fn large_snapshots_round_trip_without_copying() {
    let data: Bytes = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect::<Vec<_>>().into();
    let entry_data = Bytes::from_static(b"some entry");
    let msgs = vec![
        msg(MessageBody::Snapshot {
            snapshot: Snapshot {
                meta: SnapshotMeta {
                    index: LogIndex(1 << 40),
                    term: Term(7),
                    conf_state: ConfState::with_voters([NodeId(1), NodeId(2), NodeId(3)]),
                },
                data: data.clone(),
            },
        }),
        msg(MessageBody::Append {
            prev_index: LogIndex(1),
            prev_term: Term(1),
            entries: vec![Entry {
                term: Term(1),
                index: LogIndex(2),
                payload: EntryPayload::Normal(entry_data.clone()),
            }],
            commit: LogIndex(1),
        }),
    ];
    let (payload, crc) = frame_of(&msgs);
    let range = payload.as_ptr_range();
    let decoded = decode_batch(payload.clone(), crc).unwrap();
    assert_eq!(decoded, msgs);
    let inside = |b: &Bytes| range.contains(&b.as_ptr()) && b.as_ptr_range().end <= range.end;
    let MessageBody::Snapshot { snapshot } = &decoded[0].body else { panic!() };
    assert!(inside(&snapshot.data), "snapshot data was copied");
    let MessageBody::Append { entries, .. } = &decoded[1].body else { panic!() };
    let EntryPayload::Normal(d) = &entries[0].payload else { panic!() };
    assert!(inside(d), "entry data was copied");
}

#[test]
fn huge_counts_fail_as_truncated() {
    // A batch claiming 2^32 messages in a 20-byte payload.
    let mut p = vec![0x80, 0x80, 0x80, 0x80, 0x10];
    p.resize(20, 0);
    assert_eq!(decode_unchecked(&p), Err(DecodeError::Truncated));
    // One Append claiming 2^32 entries; and one snapshot claiming 2^63 bytes of data.
    let append = [1, 1, 2, 3, 1, 0, 0, 0, 0x80, 0x80, 0x80, 0x80, 0x10, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(decode_unchecked(&append), Err(DecodeError::Truncated));
    let mut snap = vec![1, 1, 2, 3, 7, 0, 0, 0, 0, 0, 0, 0];
    snap.extend([0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]);
    assert_eq!(decode_unchecked(&snap), Err(DecodeError::Truncated));
}

#[test]
fn structural_errors_are_specific() {
    let (payload, _) = frame_of(&[msg(MessageBody::TimeoutNow)]);
    assert_eq!(&payload[..], &[1, 1, 2, 3, 12]);
    let err = decode_unchecked(&[1, 1, 2, 3, 42]).unwrap_err();
    assert_eq!(err, DecodeError::UnknownTag { what: "message", tag: 42 });
    assert_eq!(err.to_string(), "unknown message tag 42");
    let err = decode_unchecked(&[1, 1, 2, 3, 12, 0]).unwrap_err();
    assert_eq!(err, DecodeError::TrailingBytes);
    assert_eq!(err.to_string(), "trailing bytes after message");
    assert_eq!(decode_unchecked(&[1, 1, 2, 3]).unwrap_err().to_string(), "truncated message");
    // VoteResp with a granted flag of 2.
    let err = decode_unchecked(&[1, 1, 2, 3, 4, 0, 2]).unwrap_err();
    assert_eq!(err, DecodeError::UnknownTag { what: "granted", tag: 2 });
    // An eleven-byte varint, and a ten-byte one with bits past 63.
    let mut long = vec![1];
    long.extend([0xFF; 10]);
    long.push(0);
    assert_eq!(decode_unchecked(&long), Err(DecodeError::VarintOverflow));
    let mut wide = vec![1];
    wide.extend([0xFF; 9]);
    wide.push(0x02);
    assert_eq!(decode_unchecked(&wide), Err(DecodeError::VarintOverflow));
    // A snapshot whose voters are listed twice, and out of order.
    for voters in [[2, 5, 5], [2, 5, 4]] {
        let mut p = vec![1, 1, 2, 3, 7, 0, 0, 0, 3];
        p.extend(voters);
        p.extend([0, 0, 0, 0]);
        assert_eq!(decode_unchecked(&p), Err(DecodeError::UnorderedIds));
    }
    let (payload, crc) = frame_of(&[msg(MessageBody::TimeoutNow)]);
    let err = decode_batch(payload, crc ^ 1).unwrap_err();
    assert!(err.to_string().starts_with("checksum mismatch"), "{err}");
}

#[test]
fn frame_headers_over_the_limit_are_refused() {
    let mut h = [0u8; FRAME_HEADER_LEN];
    h[..4].copy_from_slice(&99_999_999u32.to_le_bytes());
    h[4..].copy_from_slice(&0xDEAD_BEEFu32.to_le_bytes());
    let err = parse_frame_header(&h, 64 << 20).unwrap_err();
    assert_eq!(err, DecodeError::FrameTooLarge { len: 99_999_999, max: 64 << 20 });
    assert_eq!(err.to_string(), "frame of 99999999 bytes exceeds the limit of 67108864");
    assert_eq!(parse_frame_header(&h, 99_999_999), Ok((99_999_999, 0xDEAD_BEEF)));
}

fn hello_bytes() -> [u8; HELLO_LEN] {
    let h = Hello { cluster_id: 9, from: NodeId(1), to: NodeId(2), kind: StreamKind::Messages };
    let mut buf = Vec::new();
    encode_hello(&h, &mut buf);
    buf.try_into().unwrap()
}

#[test]
fn strangers_and_other_versions_are_refused() {
    for i in 0..MAGIC.len() {
        let mut b = hello_bytes();
        b[i] ^= 0x20;
        let err = decode_hello(&b).unwrap_err();
        assert_eq!(err, DecodeError::BadMagic);
        assert_eq!(err.to_string(), "not a cairn peer (bad magic)");
    }
    let mut b = hello_bytes();
    b[8..10].copy_from_slice(&7u16.to_le_bytes());
    let err = decode_hello(&b).unwrap_err();
    assert_eq!(err, DecodeError::UnsupportedVersion { peer: 7 });
    assert_eq!(err.to_string(), "peer speaks wire version 7, this member speaks 1");
    // A request line from an HTTP client on the wrong port is a stranger, not a version problem.
    let mut b = [b' '; HELLO_LEN];
    b[..16].copy_from_slice(b"GET / HTTP/1.1\r\n");
    assert_eq!(decode_hello(&b), Err(DecodeError::BadMagic));
    let mut b = hello_bytes();
    b[10] = 3;
    assert_eq!(decode_hello(&b).map(|h| h.kind), Ok(StreamKind::Members));
    b[10] = 4;
    assert_eq!(decode_hello(&b).map(|h| h.kind), Ok(StreamKind::Probe));
    b[10] = 5;
    assert_eq!(decode_hello(&b), Err(DecodeError::UnknownTag { what: "stream kind", tag: 5 }));
}

fn snap_frame() -> impl Strategy<Value = SnapFrame> {
    prop_oneof![
        (num(), snapshot(false)).prop_map(|(image_id, mut snapshot)| {
            snapshot.data = Bytes::new();
            let msg = msg(MessageBody::Snapshot { snapshot });
            SnapFrame::Offer { image_id, msg }
        }),
        num().prop_map(|offset| SnapFrame::Resume { offset }),
        (num(), small_bytes()).prop_map(|(offset, data)| SnapFrame::Chunk { offset, data }),
        (num(), any::<u32>()).prop_map(|(len, crc)| SnapFrame::Done { len, crc }),
    ]
}

proptest! {
    /// Snapshot stream frames round-trip, and any flipped bit fails their checksum.
    #[test]
    fn snapshot_stream_frames_round_trip(f in snap_frame(), bit in any::<prop::sample::Index>()) {
        let mut buf = Vec::new();
        encode_snap_frame(&f, &mut buf);
        let (payload, crc) = split_frame(buf);
        prop_assert_eq!(decode_snap_frame(payload.clone(), crc), Ok(f));
        let mut bad = payload.to_vec();
        let i = bit.index(bad.len() * 8);
        bad[i / 8] ^= 1 << (i % 8);
        let flipped = decode_snap_frame(Bytes::from(bad), crc);
        prop_assert!(matches!(flipped, Err(DecodeError::ChecksumMismatch { .. })), "{:?}", flipped);
    }
}

#[test]
fn replies_round_trip() {
    let mut buf = Vec::new();
    encode_reply(Ok(()), &mut buf);
    let (payload, crc) = split_frame(buf);
    assert_eq!(decode_reply(payload, crc), Ok(Ok(())));

    let mut buf = Vec::new();
    encode_reply(Err("cluster id mismatch"), &mut buf);
    let (payload, crc) = split_frame(buf);
    assert_eq!(decode_reply(payload, crc), Ok(Err("cluster id mismatch".to_owned())));

    // 'é' is two bytes: 1023 of 'a' then 'é' cannot both fit, so the cut falls before 'é'.
    let long = format!("{}é{}", "a".repeat(MAX_REASON_LEN - 1), "b".repeat(5000));
    let mut buf = Vec::new();
    encode_reply(Err(&long), &mut buf);
    let (payload, crc) = split_frame(buf);
    assert_eq!(decode_reply(payload, crc), Ok(Err("a".repeat(MAX_REASON_LEN - 1))));
}

#[test]
fn malformed_replies_are_refused() {
    let check = |p: &[u8]| decode_reply(Bytes::copy_from_slice(p), crc32c::crc32c(p));
    assert_eq!(check(&[]), Err(DecodeError::Truncated));
    assert_eq!(check(&[0, 0]), Err(DecodeError::TrailingBytes));
    assert_eq!(check(&[2]), Err(DecodeError::UnknownTag { what: "reply", tag: 2 }));
    assert_eq!(check(&[1, 2, 0xC3]), Err(DecodeError::Truncated));
    assert_eq!(check(&[1, 2, 0xC3, 0x28]), Err(DecodeError::ReasonNotUtf8));
    let mut long = vec![1, 0x81, 0x08]; // 1025
    long.resize(3 + 1025, b'x');
    assert_eq!(check(&long), Err(DecodeError::ReasonTooLong { len: 1025 }));
    assert_eq!(
        decode_reply(Bytes::from_static(&[0]), 0),
        Err(DecodeError::ChecksumMismatch { expected: 0, actual: crc32c::crc32c(&[0]) })
    );
}
