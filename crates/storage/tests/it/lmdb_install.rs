//! Installing a snapshot image over LMDB writes it into a fresh environment beside the database
//! and exchanges the two: the file holds the image and no more, however many installs a member
//! goes through, and a crash before the exchange leaves the old state whole.

use bytes::Bytes;
use cairn_kv::backend::{Backend, MemBackend};
use cairn_kv::{PutRequest, Store};
use cairn_storage::lmdb::LmdbBackend;

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cairn-install-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn put(key: String, value_len: usize, fill: u8) -> cairn_kv::Command {
    cairn_kv::Command::Put(PutRequest {
        key: Bytes::from(key),
        value: Bytes::from(vec![fill; value_len]),
        ..PutRequest::default()
    })
}

/// An image of `keys` keys holding 4 KiB values, at applied index `keys`.
fn image(keys: usize, fill: u8) -> Bytes {
    let store = Store::open(MemBackend::default()).unwrap();
    for i in 0..keys {
        store.apply(&[(i as u64 + 1, Some(&put(format!("k{i:06}"), 4096, fill)))]).unwrap();
    }
    store.image().unwrap()
}

/// Directories an install or a defragmentation left beside `db`.
fn leftovers(db: &std::path::Path) -> Vec<String> {
    let name = db.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::read_dir(db.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("{name}.")))
        .collect()
}

/// Replacing the contents in place, in one transaction, left the file larger by the image at
/// every install (LMDB cannot reuse the pages a transaction frees within it): a learner that
/// installed three snapshots of a 500 MB store held 1.5 GB. Written aside, the file is the
/// image's size, install after install.
#[test]
fn installs_leave_a_file_the_size_of_the_image() {
    let dir = temp_dir("size");
    let (a, b) = (image(2_000, b'a'), image(2_000, b'b'));
    let store = Store::open(LmdbBackend::open(&dir, 1 << 30).unwrap()).unwrap();
    for i in 0..1_500u64 {
        store.apply(&[(i + 1, Some(&put(format!("old{i:06}"), 4096, b'o')))]).unwrap();
    }
    // What the image takes in a database of its own (4 KiB values take two pages each).
    let alone = temp_dir("size-alone");
    Store::open(LmdbBackend::open(&alone, 1 << 30).unwrap()).unwrap().install(&a).unwrap();
    let bound = std::fs::metadata(alone.join("data.mdb")).unwrap().len() * 21 / 20 + (1 << 20);
    std::fs::remove_dir_all(&alone).unwrap();
    for (n, image) in [&a, &b, &a, &b].into_iter().enumerate() {
        store.install(image).unwrap();
        let size = std::fs::metadata(dir.join("data.mdb")).unwrap().len();
        assert!(size <= bound, "install {n}: {size} bytes, {bound} at most");
        assert_eq!(leftovers(&dir), Vec::<String>::new(), "install {n}");
        assert_eq!(store.image().unwrap(), *image, "install {n}");
    }
    drop(store);
    let reopened = Store::open(LmdbBackend::open(&dir, 1 << 30).unwrap()).unwrap();
    assert_eq!(reopened.image().unwrap(), b);
    drop(reopened);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A crash while the image is written aside (here: the replacement is leaked, as a crash would
/// leave it) leaves the old contents, and the next open removes the unfinished copy; so does an
/// install abandoned on an error (dropped).
#[test]
fn a_crash_before_the_exchange_leaves_the_old_state_and_no_copy() {
    let dir = temp_dir("crash");
    let rev1 = cairn_kv::RevisionId { main: cairn_kv::Revision(1), sub: 0 };
    {
        let store = Store::open(LmdbBackend::open(&dir, 1 << 26).unwrap()).unwrap();
        store.apply(&[(1, Some(&put("kept".into(), 10, b'k')))]).unwrap();
    }
    {
        // Abandoned on an error (dropped before the swap): the copy goes at once.
        let lmdb = LmdbBackend::open(&dir, 1 << 26).unwrap();
        let mut r = lmdb.begin_replace().unwrap();
        r.put(rev1, b"x").unwrap();
        assert_eq!(leftovers(&dir).len(), 1, "the copy is written beside the database");
        drop(r);
        assert_eq!(leftovers(&dir), Vec::<String>::new());
        // A crash: nothing after this runs, the copy stays.
        let mut r = lmdb.begin_replace().unwrap();
        r.put(rev1, b"x").unwrap();
        r.prepare(cairn_kv::backend::WriteBatch::default()).unwrap();
        std::mem::forget(r);
        assert_eq!(leftovers(&dir).len(), 1);
    }
    let store = Store::open(LmdbBackend::open(&dir, 1 << 26).unwrap()).unwrap();
    assert_eq!(leftovers(&dir), Vec::<String>::new(), "the next open removes the copy");
    assert_eq!(store.applied_index(), 1);
    let all = cairn_kv::RangeRequest {
        key: Bytes::from_static(b"\0"),
        range_end: Bytes::from_static(b"\0"),
        ..Default::default()
    };
    let got = store.range(&all).unwrap();
    assert_eq!(got.kvs.len(), 1, "the old state, whole");
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}
