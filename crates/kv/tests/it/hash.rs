//! etcd's HashKV: pinned to values derived by hand from etcd's definition, equal for equal
//! histories whatever the progress of compaction, and different when the history differs.

use crate::common;

use bytes::Bytes;
use cairn_kv::backend::MemBackend;
use cairn_kv::*;
use common::*;
use proptest::prelude::*;

fn put(key: &'static str, value: &'static str) -> RequestOp {
    RequestOp::Put(PutRequest {
        key: Bytes::from_static(key.as_bytes()),
        value: Bytes::from_static(value.as_bytes()),
        ..PutRequest::default()
    })
}

fn delete(key: &'static str) -> RequestOp {
    RequestOp::DeleteRange(DeleteRangeRequest {
        key: Bytes::from_static(key.as_bytes()),
        ..DeleteRangeRequest::default()
    })
}

/// One command: a lone op as itself, several as a transaction (one revision, sub-revisions).
fn cmd(mut ops: Vec<RequestOp>) -> Command {
    match ops.pop() {
        Some(RequestOp::Put(p)) if ops.is_empty() => Command::Put(p),
        Some(RequestOp::DeleteRange(d)) if ops.is_empty() => Command::DeleteRange(d),
        last => {
            ops.extend(last);
            Command::Txn(TxnRequest { compare: vec![], success: ops, failure: vec![] })
        }
    }
}

fn compact(rev: i64) -> Command {
    Command::Compact(CompactRequest { revision: Revision(rev), physical: false })
}

fn store_of(cmds: &[Command]) -> Store<MemBackend> {
    let store = Store::open(MemBackend::default()).unwrap();
    for (i, c) in cmds.iter().enumerate() {
        let out = store.apply(&[(i as u64 + 1, Some(c))]).unwrap();
        assert!(matches!(out[0], Some(Ok(_))), "{c:?}: {out:?}");
    }
    store
}

/// The hash etcd computes over these bytes: a CRC-32C (Castagnoli) that starts with the bucket
/// name "key" and goes on with each hashed revision's bucket key and value.
fn etcd_crc(parts: &[&[u8]]) -> u32 {
    let mut all = b"key".to_vec();
    parts.iter().for_each(|p| all.extend_from_slice(p));
    crc32c::crc32c(&all)
}

/// A history small enough to hash by hand:
/// rev 2 put a=1; rev 3 put b=22; rev 4 a transaction putting a to "" (sub 0) and deleting b
/// (sub 1); rev 5 put c=x.
fn golden_history() -> Vec<Command> {
    vec![
        cmd(vec![put("a", "1")]),
        cmd(vec![put("b", "22")]),
        cmd(vec![put("a", ""), delete("b")]),
        cmd(vec![put("c", "x")]),
    ]
}

// Bucket keys: main as 8 big-endian bytes, '_' (0x5f), sub as 8 big-endian bytes, 't' for a
// deletion.
const REV_2_0: &[u8] = &[0, 0, 0, 0, 0, 0, 0, 2, 0x5f, 0, 0, 0, 0, 0, 0, 0, 0];
const REV_3_0: &[u8] = &[0, 0, 0, 0, 0, 0, 0, 3, 0x5f, 0, 0, 0, 0, 0, 0, 0, 0];
const REV_4_0: &[u8] = &[0, 0, 0, 0, 0, 0, 0, 4, 0x5f, 0, 0, 0, 0, 0, 0, 0, 0];
const REV_4_1_T: &[u8] = &[0, 0, 0, 0, 0, 0, 0, 4, 0x5f, 0, 0, 0, 0, 0, 0, 0, 1, b't'];
const REV_5_0: &[u8] = &[0, 0, 0, 0, 0, 0, 0, 5, 0x5f, 0, 0, 0, 0, 0, 0, 0, 0];
// Values: mvccpb.KeyValue in protobuf. Tags: 0x0a key, 0x10 create_revision, 0x18 mod_revision,
// 0x20 version, 0x2a value, 0x30 lease; every number here is a one-byte varint, zero and empty
// fields are left out.
/// a=1 created at 2, modified at 2, version 1.
const KV_A_2: &[u8] = &[0x0a, 1, b'a', 0x10, 2, 0x18, 2, 0x20, 1, 0x2a, 1, b'1'];
/// b=22 created at 3, modified at 3, version 1.
const KV_B_3: &[u8] = &[0x0a, 1, b'b', 0x10, 3, 0x18, 3, 0x20, 1, 0x2a, 2, b'2', b'2'];
/// a="" created at 2, modified at 4, version 2: the empty value is left out.
const KV_A_4: &[u8] = &[0x0a, 1, b'a', 0x10, 2, 0x18, 4, 0x20, 2];
/// The deletion of b: etcd stores `KeyValue { key }` alone.
const KV_B_DELETED: &[u8] = &[0x0a, 1, b'b'];
/// c=x created at 5, modified at 5, version 1.
const KV_C_5: &[u8] = &[0x0a, 1, b'c', 0x10, 5, 0x18, 5, 0x20, 1, 0x2a, 1, b'x'];

/// The golden values were derived by hand from etcd's definition (the bytes above, CRC-32C'd by
/// `etcd_crc`) and match what etcd v3.5.17 and v3.6.10 (their mvcc package over bbolt) answer
/// for the same history.
#[test]
fn a_small_history_hashes_as_etcd_does() {
    let mut cmds = golden_history();
    let store = store_of(&cmds);
    // Never compacted: every revision up to the one asked for, the deletion included.
    let at_4 =
        etcd_crc(&[REV_2_0, KV_A_2, REV_3_0, KV_B_3, REV_4_0, KV_A_4, REV_4_1_T, KV_B_DELETED]);
    assert_eq!(at_4, 2_235_636_889);
    let want = KvHash { hash: at_4, revision: Revision(4), compact_revision: Revision(-1) };
    assert_eq!(store.hash_kv(Revision(4)), Ok(want));

    // Compacted at 4: below and at 4 only what a compaction at the hashed revision keeps (a@4,
    // live at 5; not b's deletion at 4, exactly at the compaction revision); above it, all.
    cmds.push(compact(4));
    let store = store_of(&cmds);
    let at_5 = etcd_crc(&[REV_4_0, KV_A_4, REV_5_0, KV_C_5]);
    assert_eq!(at_5, 1_262_371_546);
    let want = KvHash { hash: at_5, revision: Revision(5), compact_revision: Revision(4) };
    assert_eq!(store.hash_kv(Revision(0)), Ok(want));
    assert_eq!(store.hash_kv(Revision(5)), Ok(want));
    // At the compaction revision itself. (A running etcd answers this one from the hash it took
    // while compacting, with the previous compaction point, until it restarts; see
    // `cairn_kv::hash`. This is what it answers after a restart.)
    let at_4 = etcd_crc(&[REV_4_0, KV_A_4]);
    assert_eq!(at_4, 265_659_203);
    assert_eq!(store.hash_kv(Revision(4)).map(|h| h.hash), Ok(at_4));
    while store.compact_step(1).unwrap() {}
    assert_eq!(store.hash_kv(Revision(0)), Ok(want));
}

#[test]
fn revisions_are_checked_as_etcd_checks_them() {
    let mut cmds = golden_history();
    cmds.push(compact(3));
    let store = store_of(&cmds);
    assert_eq!(store.hash_kv(Revision(2)), Err(KvError::Compacted));
    assert_eq!(store.hash_kv(Revision(6)), Err(KvError::FutureRev));
    assert_eq!(store.hash_kv(Revision(3)).map(|h| h.revision), Ok(Revision(3)));
    assert_eq!(store.hash_kv(Revision(0)).map(|h| h.revision), Ok(Revision(5)));
    // etcd refuses no negative revision; it hashes nothing but the bucket name.
    let none =
        KvHash { hash: etcd_crc(&[]), revision: Revision(-1), compact_revision: Revision(3) };
    assert_eq!(store.hash_kv(Revision(-1)), Ok(none));
    // An empty store.
    let empty = Store::open(MemBackend::default()).unwrap();
    let want =
        KvHash { hash: etcd_crc(&[]), revision: Revision(1), compact_revision: Revision(-1) };
    assert_eq!(empty.hash_kv(Revision(0)), Ok(want));
}

/// A deletion at the compaction revision is left out, as a compaction by etcd before 3.5.16
/// removed it; one above the compaction revision counts.
#[test]
fn a_deletion_at_the_compaction_revision_is_not_hashed() {
    let deleted_at_4 = vec![
        cmd(vec![put("a", "1")]),
        cmd(vec![put("b", "22")]),
        cmd(vec![delete("a")]),
        compact(4),
    ];
    let rev_4_0_t: &[u8] = &[0, 0, 0, 0, 0, 0, 0, 4, 0x5f, 0, 0, 0, 0, 0, 0, 0, 0, b't'];
    let store = store_of(&deleted_at_4);
    assert_eq!(store.hash_kv(Revision(0)).map(|h| h.hash), Ok(etcd_crc(&[REV_3_0, KV_B_3])));
    let mut below = deleted_at_4.clone();
    below[3] = compact(3);
    let store = store_of(&below);
    let kv_a_deleted: &[u8] = &[0x0a, 1, b'a'];
    let want = etcd_crc(&[REV_3_0, KV_B_3, rev_4_0_t, kv_a_deleted]);
    assert_eq!(store.hash_kv(Revision(0)).map(|h| h.hash), Ok(want));
}

/// etcd skips a revision at or below the compaction point unless a compaction at the hashed
/// revision would keep it, except when that would keep nothing (no key live): then it hashes
/// every revision compaction left. Both values were checked against etcd.
#[test]
fn with_no_key_live_what_compaction_kept_is_hashed() {
    let rev_3_0_t: &[u8] = &[0, 0, 0, 0, 0, 0, 0, 3, 0x5f, 0, 0, 0, 0, 0, 0, 0, 0, b't'];
    let rev_4_0_t: &[u8] = &[0, 0, 0, 0, 0, 0, 0, 4, 0x5f, 0, 0, 0, 0, 0, 0, 0, 0, b't'];
    let kv_a_deleted: &[u8] = &[0x0a, 1, b'a'];
    // a@2 survives the compaction at 2 and nothing is live at 3: a@2 counts.
    let store = store_of(&[cmd(vec![put("a", "1")]), compact(2), cmd(vec![delete("a")])]);
    let want = etcd_crc(&[REV_2_0, KV_A_2, rev_3_0_t, kv_a_deleted]);
    assert_eq!(want, 3_520_211_144);
    assert_eq!(store.hash_kv(Revision(0)).map(|h| h.hash), Ok(want));
    // With b live, a@2 (not live at the hashed revision) does not count.
    let cmds =
        [cmd(vec![put("a", "1")]), cmd(vec![put("b", "22")]), compact(3), cmd(vec![delete("a")])];
    let store = store_of(&cmds);
    let want = etcd_crc(&[REV_3_0, KV_B_3, rev_4_0_t, kv_a_deleted]);
    assert_eq!(want, 3_427_254_728);
    assert_eq!(store.hash_kv(Revision(0)).map(|h| h.hash), Ok(want));
}

#[test]
fn one_different_value_changes_the_hash() {
    let mut cmds = golden_history();
    let store = store_of(&cmds);
    cmds[1] = cmd(vec![put("b", "23")]);
    let other = store_of(&cmds);
    assert_eq!(store.hash_kv(Revision(2)), other.hash_kv(Revision(2)));
    for rev in 3..=5 {
        let (a, b) = (store.hash_kv(Revision(rev)).unwrap(), other.hash_kv(Revision(rev)).unwrap());
        assert_ne!(a.hash, b.hash, "at {rev}");
    }
}

#[derive(Clone, Debug)]
enum Step {
    Cmd(Command),
    Flush,
    /// A bounded step of physical compaction, in the first store only.
    Compact(usize),
    /// Restart the second store (index rebuilt from its backend, compacted at once).
    Restart,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        10 => command().prop_map(Step::Cmd),
        2 => Just(Step::Flush),
        2 => (1usize..4).prop_map(Step::Compact),
        1 => Just(Step::Restart),
    ]
}

fn all_hashes<B: cairn_kv::backend::Backend>(store: &Store<B>) -> Vec<Result<KvHash, KvError>> {
    (-1..=store.current_revision().0 + 1).map(|r| store.hash_kv(Revision(r))).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]

    /// Three stores run the same commands: one compacts physically now and then, one restarts
    /// (which compacts its index at once), one never compacts physically. Their hashes at every
    /// revision, and their images, agree all along.
    #[test]
    fn equal_histories_hash_alike_whatever_the_compaction_progress(
        steps in prop::collection::vec(step(), 1..60),
    ) {
        let mut stores = [Driven::new(), Driven::new(), Driven::new()];
        for s in &steps {
            match s {
                Step::Cmd(c) => stores.iter_mut().for_each(|d| d.execute(c)),
                Step::Flush => stores.iter_mut().for_each(Driven::flush),
                Step::Compact(n) => {
                    stores[0].store.compact_step(*n).unwrap();
                }
                Step::Restart => {
                    let d = &mut stores[1];
                    d.flush();
                    d.store = Store::open(d.backend.clone()).unwrap();
                }
            }
            let want = all_hashes(&stores[2].store);
            prop_assert_eq!(&all_hashes(&stores[0].store), &want);
            prop_assert_eq!(&all_hashes(&stores[1].store), &want);
            let image = stores[2].store.image().unwrap();
            prop_assert_eq!(&stores[0].store.image().unwrap(), &image);
            prop_assert_eq!(&stores[1].store.image().unwrap(), &image);
        }
    }
}
