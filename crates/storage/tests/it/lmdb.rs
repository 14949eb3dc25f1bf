//! The MVCC store over LMDB against the model, across restarts: the environment is closed and
//! reopened, and the index rebuilt from what LMDB holds; members' published attributes survive
//! with it. Replacing the whole history (installing a snapshot image) is atomic and durable.

use bytes::Bytes;
use cairn_kv::backend::{Backend, BackendError, BackendView, Meta, Record, WriteBatch};
use cairn_kv::model::Model;
use cairn_kv::*;
use cairn_storage::lmdb::{LmdbBackend, LmdbError};

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
    if r.next(8) == 0 {
        let member = 1 + r.next(3);
        let attributes = MemberAttributes {
            name: format!("m{member}"),
            client_urls: (0..r.next(3)).map(|i| format!("http://m{member}-{i}:2379")).collect(),
            ..Default::default()
        };
        return Command::PublishMember { member, attributes };
    }
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
        assert_eq!(&store.members(), model.members(), "round {round}: attributes survive");
        assert!(round == 0 || !model.members().is_empty(), "the rounds published nothing");
        for _ in 0..60 {
            let cmd = command(&mut rng, model.current());
            raft_index += 1;
            let got = store.apply(&[(raft_index, Some(&cmd))]).unwrap().pop().flatten().unwrap();
            assert_eq!(got, model.apply_at(raft_index, &cmd), "command {cmd:?}");
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

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cairn-lmdb-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn rev_id(main: i64, sub: u32) -> RevisionId {
    RevisionId { main: Revision(main), sub }
}

fn record(key: &str, value: &str, create: i64) -> Record {
    Record {
        key: Bytes::from(key.to_string()),
        value: Bytes::from(value.to_string()),
        create: Revision(create),
        version: 1,
        lease: LeaseId(0),
        tombstone: false,
    }
}

fn meta(applied_index: u64, current: i64) -> Meta {
    Meta { applied_index, current: Revision(current), ..Meta::default() }
}

fn attributes(name: &[u8]) -> Vec<u8> {
    let name = String::from_utf8(name.to_vec()).unwrap();
    MemberAttributes {
        client_urls: vec![format!("http://{name}:2379")],
        name,
        ..Default::default()
    }
    .encode()
}

/// The members' attributes a batch of `records` stores (see `batch` below), decoded.
fn members_of(
    records: &[(RevisionId, Record)],
) -> std::collections::BTreeMap<u64, MemberAttributes> {
    let decode = |rec: &Record| MemberAttributes::decode(&attributes(&rec.key)).unwrap();
    records.iter().map(|(r, rec)| (r.main.0 as u64, decode(rec))).collect()
}

/// Everything a backend holds: its history and meta.
fn contents(backend: &LmdbBackend) -> (Vec<(RevisionId, Record)>, Meta) {
    let view = backend.view().unwrap();
    let mut records = Vec::new();
    view.scan(RevisionId::default(), &mut |rev, rec| {
        records.push((rev, rec));
        true
    })
    .unwrap();
    (records, view.meta().unwrap())
}

#[test]
fn replace_swaps_the_whole_history_atomically() {
    let dir = temp_dir("replace");
    let old: Vec<_> = (2..40).map(|i| (rev_id(i, 0), record("old", &format!("v{i}"), 2))).collect();
    let new = vec![(rev_id(3, 0), record("n1", "a", 3)), (rev_id(7, 1), record("n2", "b", 7))];
    let batch = |records: &[(RevisionId, Record)], meta: Meta| WriteBatch {
        puts: records.iter().map(|(r, rec)| (*r, rec.encode())).collect(),
        // A member for each record's key: the old batch's go, the new batch's stay.
        members: records.iter().map(|(r, rec)| (r.main.0 as u64, attributes(&rec.key))).collect(),
        meta: Some(meta),
        ..WriteBatch::default()
    };
    {
        let backend = LmdbBackend::open(&dir, 1 << 20).unwrap();
        backend.commit(batch(&old, meta(10, 39))).unwrap();
        let before = backend.view().unwrap();
        backend.replace(batch(&new, meta(20, 7))).unwrap();
        backend.sync().unwrap();
        // A reader that began before sees the old history whole; one after, the new one only.
        let mut seen = 0;
        before
            .scan(RevisionId::default(), &mut |_, _| {
                seen += 1;
                true
            })
            .unwrap();
        assert_eq!(seen, old.len());
        assert_eq!(before.meta().unwrap(), meta(10, 39));
        assert_eq!(before.members().unwrap(), members_of(&old));
        drop(before);
        assert_eq!(contents(&backend), (new.clone(), meta(20, 7)));
        assert_eq!(backend.view().unwrap().members().unwrap(), members_of(&new));

        // A replace that fails part way (the map is full) leaves the contents it found.
        let huge: Vec<_> = (0..64)
            .map(|i| (rev_id(100 + i, 0), record("big", &"x".repeat(64 << 10), 1)))
            .collect();
        let err = backend.replace(batch(&huge, meta(30, 200))).unwrap_err();
        assert!(matches!(err, BackendError::Engine(_)), "{err:?}");
        assert!(err.to_string().contains("lmdb: "), "{err}");
        assert_eq!(contents(&backend), (new.clone(), meta(20, 7)));
        assert_eq!(backend.view().unwrap().members().unwrap(), members_of(&new));
    }
    let reopened = LmdbBackend::open(&dir, 1 << 20).unwrap();
    assert_eq!(contents(&reopened), (new.clone(), meta(20, 7)));
    assert_eq!(reopened.view().unwrap().members().unwrap(), members_of(&new));
    drop(reopened);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_failure_to_open_names_the_directory() {
    let dir = temp_dir("open-failure");
    std::fs::write(&dir, b"a file, not a directory").unwrap();
    let err = LmdbBackend::open(&dir, 1 << 20).unwrap_err();
    let BackendError::Engine(engine) = &err else { panic!("not an engine error: {err:?}") };
    let lmdb = engine.downcast_ref::<LmdbError>().expect("the engine's error is an LmdbError");
    assert_eq!(lmdb.op(), "create directory");
    assert_eq!(lmdb.path(), Some(dir.as_path()));
    assert!(err.to_string().contains(&dir.display().to_string()), "{err}");
    std::fs::remove_file(&dir).unwrap();
}

/// An image installed over an LMDB store replaces its history durably: a batch executed before
/// the install does not land, and a reopen finds exactly the installed state.
#[test]
fn an_installed_image_survives_a_reopen() {
    let dir = temp_dir("install");
    let mut rng = Rng(7);
    let source = Store::open(cairn_kv::backend::MemBackend::default()).unwrap();
    let mut model = Model::default();
    for i in 1..=80 {
        let cmd = command(&mut rng, model.current());
        let _ = model.apply_at(i, &cmd);
        source.apply(&[(i, Some(&cmd))]).unwrap();
    }
    let image = source.image().unwrap();
    {
        let target = Store::open(LmdbBackend::open(&dir, 1 << 26).unwrap()).unwrap();
        for i in 1..=120 {
            let cmd = command(&mut rng, target.current_revision());
            target.apply(&[(i, Some(&cmd))]).unwrap();
        }
        let (_, stale) = target.execute(&[(121, Some(&command(&mut rng, Revision(1))))]).unwrap();
        let meta = target.install(&image).unwrap();
        assert_eq!(meta.applied_index, 80);
        target.commit(vec![stale]).unwrap();
        assert_eq!(target.applied_index(), 80);
    }
    let target = Store::open(LmdbBackend::open(&dir, 1 << 26).unwrap()).unwrap();
    assert_eq!(target.applied_index(), 80);
    assert_eq!(target.current_revision(), source.current_revision());
    assert_eq!(target.compacted_revision(), source.compacted_revision());
    for rev in source.compacted_revision().0.max(1)..=source.current_revision().0 {
        assert_eq!(target.range(&everything(rev)), source.range(&everything(rev)), "at {rev}");
        assert_eq!(target.range(&everything(rev)), model.range(&everything(rev)), "at {rev}");
        assert_eq!(target.hash_kv(Revision(rev)), source.hash_kv(Revision(rev)), "at {rev}");
    }
    // The image carries the members' attributes, and a reopen finds them.
    assert!(!source.members().is_empty(), "the source published nothing");
    assert_eq!(target.members(), source.members());
    assert_eq!(target.image().unwrap(), image);
    drop(target);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_auth_store_survives_a_reopen_and_a_replace_sets_it() {
    let dir = temp_dir("auth");
    {
        let backend = LmdbBackend::open(&dir, 1 << 26).expect("open");
        assert_eq!(backend.view().expect("view").auth().expect("auth"), None, "none stored yet");
        let batch = WriteBatch { auth: Some(b"first".to_vec()), ..WriteBatch::default() };
        backend.commit(batch).expect("commit");
        // A commit without an auth store keeps the stored one.
        backend
            .commit(WriteBatch { meta: Some(meta(3, 1)), ..WriteBatch::default() })
            .expect("commit");
    }
    let backend = LmdbBackend::open(&dir, 1 << 26).expect("reopen");
    assert_eq!(backend.view().expect("view").auth().expect("auth"), Some(b"first".to_vec()));
    backend.replace(WriteBatch::default()).expect("replace");
    assert_eq!(backend.view().expect("view").auth().expect("auth"), None, "an image without one");
    let batch = WriteBatch { auth: Some(b"second".to_vec()), ..WriteBatch::default() };
    backend.replace(batch).expect("replace");
    assert_eq!(backend.view().expect("view").auth().expect("auth"), Some(b"second".to_vec()));
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// An install's origin is written in the install's own write, survives a reopen and later
/// commits, and goes with the contents when a replace without one takes their place.
#[test]
fn an_installs_origin_comes_and_goes_with_the_contents() {
    let dir = temp_dir("installed-from");
    let origin = |b: &LmdbBackend| b.view().expect("view").installed_from().expect("origin");
    {
        let backend = LmdbBackend::open(&dir, 1 << 26).expect("open");
        assert_eq!(origin(&backend), None, "a fresh database came from no install");
        let batch = WriteBatch { installed_from: Some(b"42".to_vec()), ..WriteBatch::default() };
        backend.replace(batch).expect("replace");
        backend
            .commit(WriteBatch { meta: Some(meta(3, 43)), ..WriteBatch::default() })
            .expect("commit");
    }
    let backend = LmdbBackend::open(&dir, 1 << 26).expect("reopen");
    assert_eq!(origin(&backend), Some(b"42".to_vec()));
    backend.replace(WriteBatch::default()).expect("replace");
    assert_eq!(origin(&backend), None, "contents from elsewhere");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn the_size_follows_the_file_through_commits_and_replaces() {
    let dir = temp_dir("size");
    let file_len = || std::fs::metadata(dir.join("data.mdb")).unwrap().len();
    let backend = LmdbBackend::open(&dir, 64 << 20).unwrap();
    assert_eq!(backend.size_bytes(), file_len(), "at open");
    let start = backend.size_bytes();
    // Values large enough to grow the file by many pages.
    let records: Vec<_> =
        (2..200).map(|i| (rev_id(i, 0), record("k", &"v".repeat(8 << 10), 2))).collect();
    let puts = records.iter().map(|(r, rec)| (*r, rec.encode())).collect();
    backend.commit(WriteBatch { puts, meta: Some(meta(5, 199)), ..WriteBatch::default() }).unwrap();
    assert!(backend.size_bytes() > start + (1 << 20), "grew: {}", backend.size_bytes());
    assert_eq!(backend.size_bytes(), file_len(), "after a commit");
    let puts = vec![(rev_id(300, 0), record("k", "v", 300).encode())];
    backend
        .replace(WriteBatch { puts, meta: Some(meta(9, 300)), ..WriteBatch::default() })
        .unwrap();
    assert_eq!(backend.size_bytes(), file_len(), "after a replace");
    drop(backend);
    std::fs::remove_dir_all(&dir).unwrap();
}
