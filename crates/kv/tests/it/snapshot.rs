//! Snapshot images: a store installed from another's image reads, hashes and goes on exactly as
//! its source (and the model); a damaged image is refused and changes nothing; work executed
//! before an install never lands after it.

use crate::common;

use bytes::{BufMut, Bytes};
use cairn_kv::backend::{Backend, MemBackend, Record};
use cairn_kv::snapshot::{self, ImageError};
use cairn_kv::*;
use common::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Step {
    Cmd(Command),
    Flush,
    /// One bounded step of physical compaction.
    Compact(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        10 => command().prop_map(Step::Cmd),
        2 => Just(Step::Flush),
        1 => (1usize..4).prop_map(Step::Compact),
    ]
}

fn run(steps: &[Step]) -> Driven {
    let mut d = Driven::new();
    for s in steps {
        match s {
            Step::Cmd(cmd) => d.execute(cmd),
            Step::Flush => d.flush(),
            Step::Compact(n) => {
                d.store.compact_step(*n).unwrap();
            }
        }
    }
    d
}

/// Every read worth comparing: everything at each revision around the store's range, then `reads`.
fn requests(current: Revision, reads: &[RangeRequest]) -> Vec<RangeRequest> {
    (-1..=current.0 + 1).map(everything_at).chain(reads.iter().cloned()).collect()
}

fn observe<B: Backend>(
    store: &Store<B>,
    reqs: &[RangeRequest],
) -> Vec<Result<RangeResponse, KvError>> {
    reqs.iter().map(|r| store.range(r)).collect()
}

fn hashes<B: Backend>(store: &Store<B>) -> Vec<Result<KvHash, KvError>> {
    (-1..=store.current_revision().0 + 1).map(|r| store.hash_kv(Revision(r))).collect()
}

/// What a store shows of itself, beyond reads.
fn marks<B: Backend>(store: &Store<B>) -> (Revision, Revision, u64) {
    (store.current_revision(), store.compacted_revision(), store.executed_index())
}

/// `store` (just installed from `image`, taken of `source`) is indistinguishable from it.
fn same_as_source<B: Backend>(
    store: &Store<B>,
    source: &Driven,
    image: &Bytes,
    reads: &[RangeRequest],
) -> Result<(), TestCaseError> {
    let reqs = requests(source.store.current_revision(), reads);
    prop_assert_eq!(marks(store), marks(&source.store));
    prop_assert_eq!(store.applied_index(), source.store.executed_index());
    prop_assert_eq!(observe(store, &reqs), observe(&source.store, &reqs));
    let model: Vec<_> = reqs.iter().map(|r| source.model.range(r)).collect();
    prop_assert_eq!(observe(store, &reqs), model);
    prop_assert_eq!(hashes(store), hashes(&source.store));
    prop_assert_eq!(store.members(), source.store.members());
    prop_assert_eq!(&store.members(), source.model.members());
    // The image is canonical: the installed store images to the same bytes.
    prop_assert_eq!(&store.image().unwrap(), image);
    prop_assert!(store.physically_compacted());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 120, ..ProptestConfig::default() })]

    /// An image installed into a fresh store and into one with another history (and executions
    /// not yet committed) reads, hashes and images as its source; a commit of the executions
    /// from before the install changes nothing; both stores then go on alike, and a restart
    /// keeps the installed state.
    #[test]
    fn installed_image_reads_as_its_source(
        src in prop::collection::vec(step(), 1..60),
        other in prop::collection::vec(step(), 0..40),
        reads in prop::collection::vec(range_req(), 0..6),
        after in prop::collection::vec(command(), 0..10),
    ) {
        let mut source = run(&src);
        let image = source.store.image().unwrap();
        let meta = snapshot::decode_meta(&image).unwrap();
        prop_assert_eq!(
            (meta.current, meta.compacted, meta.applied_index),
            marks(&source.store)
        );

        let fresh = Store::open(MemBackend::default()).unwrap();
        prop_assert_eq!(fresh.install(&image), Ok(meta));
        same_as_source(&fresh, &source, &image, &reads)?;

        let mut target = run(&other);
        prop_assert_eq!(target.store.install(&image), Ok(meta));
        same_as_source(&target.store, &source, &image, &reads)?;
        target.flush(); // executed before the install: void
        same_as_source(&target.store, &source, &image, &reads)?;

        source.flush();
        prop_assert_eq!(source.store.applied_index(), target.store.applied_index());
        target.model = source.model.clone();
        target.raft_index = meta.applied_index;
        for cmd in &after {
            source.execute(cmd);
            target.execute(cmd);
        }
        target.flush();
        drop(target.store);
        let reopened = Store::open(target.backend.clone()).unwrap();
        let reqs = requests(source.store.current_revision(), &reads);
        prop_assert_eq!(observe(&reopened, &reqs), observe(&source.store, &reqs));
        prop_assert_eq!(hashes(&reopened), hashes(&source.store));
        prop_assert_eq!(reopened.applied_index(), source.raft_index);
        prop_assert_eq!(reopened.members(), source.store.members());
    }

    /// Decoding arbitrary bytes never panics, and refuses them.
    #[test]
    fn arbitrary_bytes_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        prop_assert!(snapshot::decode(&bytes).is_err());
        prop_assert!(Store::open(MemBackend::default()).unwrap().install(&bytes).is_err());
    }

    /// Any strict prefix of an image, and any single flipped bit, is refused.
    #[test]
    fn damaged_images_are_refused(
        steps in prop::collection::vec(step(), 1..30),
        cut in any::<prop::sample::Index>(),
        flip in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let image = run(&steps).store.image().unwrap();
        prop_assert!(snapshot::decode(&image).is_ok());
        let cut = cut.index(image.len());
        prop_assert!(snapshot::decode(&image[..cut]).is_err(), "prefix of {} bytes", cut);
        let mut flipped = image.to_vec();
        flipped[flip.index(image.len())] ^= 1 << bit;
        prop_assert!(snapshot::decode(&flipped).is_err());
    }

    /// Garbage behind a valid checksum (what a buggy encoder could produce) never panics the
    /// decoder; whatever it accepts, it re-encodes to an image that decodes and re-encodes to
    /// the same bytes. (Not to the bytes it was given: those are an older version's image,
    /// which the encoder upgrades.)
    #[test]
    fn garbage_with_a_valid_checksum_never_panics(
        count in 0u64..4,
        body in prop::collection::vec(any::<u8>(), 0..120),
        current in -2i64..6,
        compacted in -3i64..6,
    ) {
        let raw = raw_image(3, 7, current, compacted, count, &body);
        if let Ok(image) = snapshot::decode(&raw) {
            let again =
                snapshot::encode(image.meta(), image.records(), image.members(), image.leases());
            let image = snapshot::decode(&again).expect("an encoded image decodes");
            let third =
                snapshot::encode(image.meta(), image.records(), image.members(), image.leases());
            prop_assert_eq!(third, again);
        }
    }
}

/// An image put together by hand, following the layout in `cairn_kv::snapshot`: magic, version,
/// applied index, current, compacted, record count, the records, an empty member section, an
/// empty lease section (version 3), and the crc32c of all that.
fn raw_image(
    version: u32,
    applied: u64,
    current: i64,
    compacted: i64,
    count: u64,
    records: &[u8],
) -> Vec<u8> {
    raw_image_with(version, applied, current, compacted, count, records, &0u64.to_be_bytes())
}

/// [`raw_image`] with the member section given (its count, then the members).
fn raw_image_with(
    version: u32,
    applied: u64,
    current: i64,
    compacted: i64,
    count: u64,
    records: &[u8],
    members: &[u8],
) -> Vec<u8> {
    let mut leases = if version >= 3 { 0u64.to_be_bytes().to_vec() } else { Vec::new() };
    if version >= 4 {
        leases.extend(new_auth_section());
    }
    if version >= 5 {
        leases.extend(0u64.to_be_bytes());
    }
    raw_image_leases(
        version,
        applied,
        current,
        compacted,
        count,
        records,
        &[members, &leases].concat(),
    )
}

/// The auth section of a store that never changed its auth store (version 4 on).
fn new_auth_section() -> Vec<u8> {
    let auth = cairn_kv::auth::AuthState::default().encode();
    [&(auth.len() as u64).to_be_bytes()[..], &auth].concat()
}

/// [`raw_image_with`] with everything after the records given (members, then leases).
fn raw_image_leases(
    version: u32,
    applied: u64,
    current: i64,
    compacted: i64,
    count: u64,
    records: &[u8],
    members: &[u8],
) -> Vec<u8> {
    let mut out = Vec::new();
    out.put_slice(b"CAIRNKVI");
    out.put_u32(version);
    out.put_u64(applied);
    out.put_i64(current);
    out.put_i64(compacted);
    out.put_u64(count);
    out.put_slice(records);
    out.put_slice(members);
    out.put_u32(crc32c::crc32c(&out));
    out
}

/// One member entry as the layout has it: id, length, then the encoded attributes.
fn raw_member(id: u64, name: &str, urls: &[&str]) -> Vec<u8> {
    let mut attributes = Vec::new();
    attributes.put_u32(name.len() as u32);
    attributes.put_slice(name.as_bytes());
    attributes.put_u32(urls.len() as u32);
    for url in urls {
        attributes.put_u32(url.len() as u32);
        attributes.put_slice(url.as_bytes());
    }
    let mut out = Vec::new();
    out.put_u64(id);
    out.put_u64(attributes.len() as u64);
    out.put_slice(&attributes);
    out
}

/// A member section: the count, then the members.
fn member_section(members: &[Vec<u8>]) -> Vec<u8> {
    let mut out = (members.len() as u64).to_be_bytes().to_vec();
    members.iter().for_each(|m| out.extend_from_slice(m));
    out
}

fn publish(member: u64, name: &str, urls: &[&str]) -> Command {
    let client_urls = urls.iter().map(|u| u.to_string()).collect();
    Command::PublishMember {
        member,
        attributes: MemberAttributes { name: name.to_string(), client_urls, ..Default::default() },
    }
}

/// One record entry as the layout has it: main, sub, length, then the encoded record.
fn raw_record(main: i64, sub: u32, record: &Record) -> Vec<u8> {
    let mut out = Vec::new();
    let encoded = record.encode();
    out.put_i64(main);
    out.put_u32(sub);
    out.put_u64(encoded.len() as u64);
    out.put_slice(&encoded);
    out
}

fn put_record(key: &'static str, value: &'static str, create: i64, version: i64) -> Record {
    Record {
        key: Bytes::from_static(key.as_bytes()),
        value: Bytes::from_static(value.as_bytes()),
        create: Revision(create),
        version,
        lease: LeaseId(0),
        tombstone: false,
    }
}

fn tombstone(key: &'static str) -> Record {
    Record { tombstone: true, create: Revision(0), version: 0, ..put_record(key, "", 0, 0) }
}

fn put(key: &'static str, value: &'static str) -> Command {
    Command::Put(PutRequest {
        key: Bytes::from_static(key.as_bytes()),
        value: Bytes::from_static(value.as_bytes()),
        ..PutRequest::default()
    })
}

fn delete(key: &'static str) -> Command {
    Command::DeleteRange(DeleteRangeRequest {
        key: Bytes::from_static(key.as_bytes()),
        ..DeleteRangeRequest::default()
    })
}

fn compact(rev: i64) -> Command {
    Command::Compact(CompactRequest { revision: Revision(rev), physical: false })
}

#[test]
fn the_image_layout_is_as_documented() {
    let store = Store::open(MemBackend::default()).unwrap();
    let cmds = [
        put("a", "1"),
        publish(9, "m9", &["http://x:1"]),
        put("b", "2"),
        put("a", "3"),
        publish(2, "m2", &[]),
        delete("b"),
        compact(4),
        publish(9, "m9", &["http://y:1", "http://y:2"]),
        Command::LeaseGrant { id: LeaseId(7), ttl: 10 },
        Command::LeaseGrant { id: LeaseId(-3), ttl: 60 },
        Command::LeaseCheckpoint { checkpoints: vec![(LeaseId(7), 4), (LeaseId(8), 1)] },
        Command::AlarmActivate(AlarmMember { member: 5, alarm: AlarmType::NoSpace }),
    ];
    for (i, cmd) in cmds.iter().enumerate() {
        store.apply(&[(i as u64 + 1, Some(cmd))]).unwrap();
    }
    // Compaction at 4 keeps b@3 and a@4 (each key's live change at 4) and b's deletion at 5
    // (above it); it drops a@2, superseded at 4. The publishes took no revision; member 9's
    // second replaced its first. Leases take no revision either; the checkpoint of a lease
    // that does not exist (8) changed nothing.
    let mut records = raw_record(3, 0, &put_record("b", "2", 3, 1));
    records.extend(raw_record(4, 0, &put_record("a", "3", 2, 2)));
    records.extend(raw_record(5, 0, &tombstone("b")));
    let mut after = member_section(&[
        raw_member(2, "m2", &[]),
        raw_member(9, "m9", &["http://y:1", "http://y:2"]),
    ]);
    after.put_u64(2);
    // Each lease with the index of the entry that granted it.
    for (id, ttl, remaining, granted) in [(-3i64, 60i64, 0i64, 10u64), (7, 10, 4, 9)] {
        after.put_i64(id);
        after.put_i64(ttl);
        after.put_i64(remaining);
        after.put_u64(granted);
    }
    after.extend(new_auth_section());
    // The alarms: 9 bytes long, member 5's NOSPACE (type 1).
    after.put_u64(9);
    after.put_u64(5);
    after.put_u8(1);
    let image = store.image().unwrap();
    assert_eq!(image, raw_image_leases(6, 12, 5, 4, 3, &records, &after));
    let alarm = AlarmMember { member: 5, alarm: AlarmType::NoSpace };
    let decoded = snapshot::decode(&image).unwrap();
    assert_eq!(decoded.alarms(), Some(&[alarm].into_iter().collect()));
    assert_eq!(snapshot::empty_image(9), raw_image(6, 9, 1, -1, 0, &[]));
    // Version 4 (no alarm section) is still read, as saying nothing of alarms.
    let v4 = snapshot::decode(&raw_image(4, 9, 1, -1, 0, &[])).unwrap();
    assert_eq!(v4.alarms(), None);
    // Version 3 (no auth section) is still read, as holding a new auth store.
    let v3 = snapshot::decode(&raw_image(3, 9, 1, -1, 0, &[])).unwrap();
    assert_eq!(*v3.auth(), cairn_kv::auth::AuthState::default());
    // Version 2 (no lease section) is still read, as holding no leases.
    let v2 = snapshot::decode(&raw_image(2, 9, 1, -1, 0, &[])).unwrap();
    assert!(v2.leases().is_empty());
}

/// Version 5 images, whose leases do not carry their grant's index, are still read: the
/// leases as granted at index 0, as a store an older cairn wrote reads them.
#[test]
fn a_version_5_image_holds_leases_granted_at_index_0() {
    let mut v5 = member_section(&[]);
    v5.put_u64(1);
    for field in [7i64, 10, 4] {
        v5.put_i64(field);
    }
    v5.extend(new_auth_section());
    v5.put_u64(0);
    let v5 = snapshot::decode(&raw_image_leases(5, 9, 1, -1, 0, &[], &v5)).unwrap();
    let lease = Lease { id: LeaseId(7), ttl: 10, remaining_ttl: 4, grant_index: 0 };
    assert_eq!(v5.leases().values().copied().collect::<Vec<_>>(), vec![lease]);
    assert_eq!(v5.alarms(), Some(&Default::default()), "version 5 has the alarm section");
}

/// A lease record an older cairn stored (`ttl | remaining_ttl`, 16 bytes) still reads, as
/// granted at index 0; what this one stores adds the grant's index.
#[test]
fn an_older_lease_record_reads_as_granted_at_index_0() {
    let old = [10i64.to_be_bytes(), 4i64.to_be_bytes()].concat();
    let lease = backend::decode_lease(LeaseId(7), &old).unwrap();
    assert_eq!(lease, Lease { id: LeaseId(7), ttl: 10, remaining_ttl: 4, grant_index: 0 });
    let new = Lease { grant_index: 12, ..lease };
    assert_eq!(backend::decode_lease(LeaseId(7), &backend::encode_lease(&new)).unwrap(), new);
    assert!(backend::decode_lease(LeaseId(7), &old[..12]).is_err());
}

/// A store with some history, and its image.
fn source() -> (Store<MemBackend>, Bytes) {
    let store = Store::open(MemBackend::default()).unwrap();
    let cmds = [put("a", "1"), put("b", "2"), put("a", "3"), delete("b"), put("c", "4")];
    for (i, cmd) in cmds.iter().enumerate() {
        store.apply(&[(i as u64 + 1, Some(cmd))]).unwrap();
    }
    let image = store.image().unwrap();
    (store, image)
}

/// Images damaged in transit or at rest: cut short, not an image, or with a flipped bit.
fn damaged_images() -> Vec<(Vec<u8>, ImageError)> {
    let (_, good) = source();
    let mut flipped = good.to_vec();
    flipped[30] ^= 0x10;
    let mut wrong_magic = good.to_vec();
    wrong_magic[0] = b'X';
    let short = &good[..good.len() - 1];
    vec![
        (vec![], ImageError::Truncated),
        (short.to_vec(), checksum_error(short)),
        (good[..40].to_vec(), ImageError::Truncated),
        (wrong_magic, ImageError::WrongMagic),
        (raw_image(1, 1, 1, -1, 0, &[]), ImageError::UnknownVersion(1)),
        (flipped.clone(), checksum_error(&flipped)),
    ]
}

/// Images with a valid checksum and contents no encoder should produce.
fn malformed_images() -> Vec<(Vec<u8>, ImageError)> {
    let a2 = raw_record(2, 0, &put_record("a", "1", 2, 1));
    let a3 = raw_record(3, 0, &put_record("a", "2", 2, 2));
    let swapped = [a3.clone(), a2.clone()].concat();
    let two = [a2.clone(), a3.clone()].concat();
    let mut bad_flag = a2.clone();
    bad_flag[20] = 7; // The record's tombstone byte, after main, sub and length.
    let trailing = [a2.clone(), vec![0]].concat();
    let outside = "compacted revision outside -1..=current";
    let empty_key = raw_record(2, 0, &put_record("", "x", 2, 1));
    let (m5, m3) = (raw_member(5, "m5", &["http://a:1"]), raw_member(3, "m3", &[]));
    let mut not_utf8 = raw_member(4, "m\u{e9}", &[]);
    not_utf8[20] = 0xff; // The name's first byte, after id, length and name length.
    let mut short_member = raw_member(4, "m4", &["http://a:1"]);
    short_member[15] -= 1; // The attributes' length: one byte short of the URL's end.
    vec![
        (raw_image(2, 1, 0, -1, 0, &[]), bad_header("current revision below the initial one")),
        (raw_image(2, 1, 3, 4, 0, &[]), bad_header(outside)),
        (raw_image(2, 1, 3, -2, 0, &[]), bad_header(outside)),
        (raw_image(2, 1, 3, -1, 2, &swapped), ImageError::OutOfOrder(rev(2))),
        (
            raw_image(2, 1, 3, -1, 2, &[a2.clone(), a2.clone()].concat()),
            ImageError::OutOfOrder(rev(2)),
        ),
        (raw_image(2, 1, 2, -1, 2, &two), ImageError::RevisionOutOfRange(rev(3))),
        (raw_image(2, 1, 3, 3, 2, &two), ImageError::NotRetained(rev(3))),
        (
            raw_image(2, 1, 3, 3, 1, &raw_record(2, 0, &tombstone("a"))),
            ImageError::NotRetained(rev(2)),
        ),
        (
            raw_image(2, 1, 3, -1, 1, &bad_flag),
            bad_record(0, "history record with a bad tombstone flag"),
        ),
        (raw_image(2, 1, 3, -1, 1, &empty_key), bad_record(0, "empty key")),
        (raw_image(2, 1, 3, -1, 1, &a2[..30]), ImageError::Truncated),
        (raw_image(2, 1, 3, -1, 2, &a2), ImageError::Truncated),
        (raw_image(2, 1, 3, -1, 1, &trailing), ImageError::TrailingBytes),
        (
            raw_image_with(2, 1, 1, -1, 0, &[], &member_section(&[m5.clone(), m3])),
            bad_member(1, "member ids out of order"),
        ),
        (
            raw_image_with(2, 1, 1, -1, 0, &[], &member_section(&[m5.clone(), m5.clone()])),
            bad_member(1, "member ids out of order"),
        ),
        (
            raw_image_with(2, 1, 1, -1, 0, &[], &member_section(&[not_utf8])),
            bad_member(0, "member attributes not UTF-8"),
        ),
        (
            raw_image_with(2, 1, 1, -1, 0, &[], &member_section(&[short_member])),
            bad_member(0, "member attributes cut short"),
        ),
        (raw_image_with(2, 1, 1, -1, 0, &[], &[0, 0, 0, 0, 0, 0, 0, 2]), ImageError::Truncated),
        (raw_image_with(2, 1, 1, -1, 0, &[], &[]), ImageError::Truncated),
        (
            raw_image_with(2, 1, 1, -1, 0, &[], &[member_section(&[m5]), vec![0]].concat()),
            ImageError::TrailingBytes,
        ),
    ]
}

#[test]
fn every_kind_of_damage_is_refused_and_changes_nothing() {
    let cases = damaged_images().into_iter().chain(malformed_images());
    for (image, want) in cases {
        assert_eq!(snapshot::decode(&image).err(), Some(want.clone()), "decode");
        assert_eq!(snapshot::decode_meta(&image).err(), Some(want.clone()), "decode_meta");
        // The target has executed work not yet committed, so "unchanged" covers the overlay too.
        let (target, _) = source();
        target.execute(&[(6, Some(&put("d", "5")))]).unwrap();
        let before = (target.image().unwrap(), target.hash_kv(Revision(0)), marks(&target));
        let applied = target.applied_index();
        assert_eq!(target.install(&image), Err(InstallError::Corrupt(want)));
        assert_eq!((target.image().unwrap(), target.hash_kv(Revision(0)), marks(&target)), before);
        assert_eq!(target.applied_index(), applied);
    }
}

fn rev(main: i64) -> RevisionId {
    RevisionId { main: Revision(main), sub: 0 }
}

fn bad_header(why: &'static str) -> ImageError {
    ImageError::BadHeader(why)
}

fn bad_member(position: u64, reason: &'static str) -> ImageError {
    ImageError::BadMember { position, reason }
}

fn bad_record(position: u64, reason: &'static str) -> ImageError {
    ImageError::BadRecord { position, reason }
}

/// The mismatch `decode` reports for `image`: its last four bytes against the crc32c of the rest.
fn checksum_error(image: &[u8]) -> ImageError {
    let (body, stored) = image.split_at(image.len() - 4);
    let stored = u32::from_be_bytes(stored.try_into().unwrap());
    ImageError::ChecksumMismatch { stored, computed: crc32c::crc32c(body) }
}

/// A batch executed before an install is dropped by the commit after it, and the installed state
/// is what a restart finds.
#[test]
fn work_executed_before_an_install_never_lands() {
    let (source, image) = source();
    let backend = Shared::default();
    let target = Store::open(backend.clone()).unwrap();
    for i in 1..=20u64 {
        target.apply(&[(i, Some(&put("z", "old")))]).unwrap();
    }
    let (_, stale) = target.execute(&[(21, Some(&put("y", "stale")))]).unwrap();
    target.install(&image).unwrap();
    target.commit(vec![stale]).unwrap();
    let reqs = requests(source.current_revision(), &[]);
    assert_eq!(observe(&target, &reqs), observe(&source, &reqs));
    assert_eq!(target.applied_index(), 5);
    // Work executed after the install commits as usual.
    let (_, fresh) = target.execute(&[(6, Some(&put("y", "new")))]).unwrap();
    target.commit(vec![fresh]).unwrap();
    source.apply(&[(6, Some(&put("y", "new")))]).unwrap();
    drop(target);
    let reopened = Store::open(backend).unwrap();
    let reqs = requests(source.current_revision(), &[]);
    assert_eq!(observe(&reopened, &reqs), observe(&source, &reqs));
    assert_eq!(hashes(&reopened), hashes(&source));
    assert_eq!(reopened.applied_index(), 6);
}

/// Installing the empty image empties a store.
#[test]
fn the_empty_image_empties_a_store() {
    let (store, _) = source();
    let meta = store.install(&snapshot::empty_image(40)).unwrap();
    assert_eq!(
        meta,
        ImageMeta { applied_index: 40, current: Revision(1), compacted: Revision(-1) }
    );
    assert_eq!(marks(&store), (Revision(1), Revision(-1), 40));
    assert_eq!(store.key_count(), 0);
    assert_eq!(store.image().unwrap(), snapshot::empty_image(40));
}

/// A reader that fails after `left` bytes, as a file on a failing disk.
struct FailingAfter<'a> {
    bytes: &'a [u8],
    left: usize,
}

impl snapshot::ImageReader for FailingAfter<'_> {
    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), String> {
        if self.left < buf.len() {
            return Err("injected read failure".into());
        }
        self.left -= buf.len();
        self.bytes.read_exact(buf)
    }
}

/// The streamed install (a follower's, from the file a snapshot was received into) sees the
/// records before the checksum: every damaged or malformed image, a flipped byte anywhere, and a
/// reader that fails part way must all be refused and change nothing, whichever check fires.
#[test]
fn a_streamed_install_refuses_what_install_refuses_and_changes_nothing() {
    let (_, image) = source();
    let flipped = (0..image.len()).map(|at| {
        let mut bad = image.to_vec();
        bad[at] ^= 0x40;
        bad
    });
    let cases = damaged_images().into_iter().chain(malformed_images()).map(|(i, _)| i);
    for bad in cases.chain(flipped) {
        let (target, _) = source();
        target.execute(&[(6, Some(&put("d", "5")))]).unwrap();
        let before = (target.image().unwrap(), target.hash_kv(Revision(0)), marks(&target));
        let got = target.install_from(&bad[..], bad.len() as u64);
        assert!(matches!(got, Err(InstallError::Corrupt(_))), "{got:?}");
        assert_eq!((target.image().unwrap(), target.hash_kv(Revision(0)), marks(&target)), before);
    }
    for left in [0, 10, image.len() / 2, image.len() - 1] {
        let (target, _) = source();
        let before = (target.image().unwrap(), marks(&target));
        let got = target.install_from(FailingAfter { bytes: &image, left }, image.len() as u64);
        assert!(matches!(got, Err(InstallError::Unreadable(_))), "{left}: {got:?}");
        assert_eq!((target.image().unwrap(), marks(&target)), before);
    }
    // And the whole image, streamed, installs what `install` installs.
    let (fresh, _) = source();
    let want = fresh.install(&image).unwrap();
    let target = Store::open(MemBackend::default()).unwrap();
    assert_eq!(target.install_from(&image[..], image.len() as u64), Ok(want));
    assert_eq!(target.image().unwrap(), image);
}
