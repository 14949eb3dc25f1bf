//! The MVCC store over LMDB against the model, across restarts: the environment is closed and
//! reopened, and the index rebuilt from what LMDB holds.

use bytes::Bytes;
use cairn_kv::model::Model;
use cairn_kv::*;
use cairn_storage::lmdb::LmdbBackend;

struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn key(r: &mut Rng) -> Bytes {
    Bytes::from(["a", "ab", "b", "c", "d"][r.next(5) as usize].to_string())
}

fn command(r: &mut Rng, current: Revision) -> Command {
    match r.next(10) {
        0..=4 => Command::Put(PutRequest {
            key: key(r),
            value: Bytes::from(format!("v{}", r.next(100))),
            prev_kv: r.next(2) == 0,
            ..PutRequest::default()
        }),
        5 | 6 => Command::DeleteRange(DeleteRangeRequest {
            key: key(r),
            range_end: if r.next(2) == 0 { Bytes::new() } else { Bytes::from_static(b"c") },
            prev_kv: true,
        }),
        7 | 8 => Command::Txn(TxnRequest {
            compare: vec![Compare {
                key: key(r),
                range_end: Bytes::new(),
                target: CompareTarget::Version(r.next(3) as i64),
                result: CompareResult::Equal,
            }],
            success: vec![RequestOp::Put(PutRequest {
                key: key(r),
                value: Bytes::from_static(b"t"),
                ..PutRequest::default()
            })],
            failure: vec![RequestOp::Range(RangeRequest {
                key: key(r),
                ..RangeRequest::default()
            })],
        }),
        _ => Command::Compact(CompactRequest {
            revision: Revision(current.0 - r.next(4) as i64),
            physical: false,
        }),
    }
}

fn everything(rev: i64) -> RangeRequest {
    RangeRequest {
        key: Bytes::from_static(&[0]),
        range_end: Bytes::from_static(&[0]),
        revision: Revision(rev),
        ..RangeRequest::default()
    }
}

#[test]
fn lmdb_store_matches_the_model_across_restarts() {
    let dir = std::env::temp_dir().join(format!("cairn-lmdb-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut model = Model::default();
    let mut rng = Rng(42);
    let mut raft_index = 0;
    for round in 0..8 {
        let store = Store::open(LmdbBackend::open(&dir, 1 << 26).unwrap()).unwrap();
        assert_eq!(store.applied_index(), raft_index, "round {round}: applied index survives");
        assert_eq!(store.range(&everything(0)), model.range(&everything(0)));
        for _ in 0..60 {
            let cmd = command(&mut rng, model.current());
            raft_index += 1;
            let got = store.apply(&[(raft_index, Some(&cmd))]).unwrap().pop().flatten().unwrap();
            assert_eq!(got, model.apply(&cmd), "command {cmd:?}");
            let rev = model.current().0 - rng.next(5) as i64;
            assert_eq!(
                store.range(&everything(rev)),
                model.range(&everything(rev)),
                "read at {rev}"
            );
            if rng.next(4) == 0 {
                store.compact_step(3).unwrap();
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
