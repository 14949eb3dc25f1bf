//! The streamed image: the same bytes as the whole image, in pieces of the size asked for, its
//! length known up front, and unchanged by writes made while it is read.

use crate::common;

use bytes::Bytes;
use cairn_kv::snapshot;
use cairn_kv::*;
use common::*;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Step {
    Cmd(Command),
    Flush,
    Compact(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        10 => command().prop_map(Step::Cmd),
        2 => Just(Step::Flush),
        1 => (1usize..4).prop_map(Step::Compact),
    ]
}

fn apply(d: &mut Driven, s: &Step) {
    match s {
        Step::Cmd(cmd) => d.execute(cmd),
        Step::Flush => d.flush(),
        Step::Compact(n) => {
            d.store.compact_step(*n).expect("a compaction step");
        }
    }
}

/// Reads the whole stream in pieces of `chunk` bytes, checking each piece's size.
fn read_all(store: &Store<Shared>, chunk: usize, between: &mut dyn FnMut()) -> Bytes {
    let mut stream = store.image_stream().expect("a stream");
    let len = stream.len();
    let mut out = Vec::new();
    while let Some(piece) = stream.next_chunk(chunk).expect("a piece") {
        assert!(!piece.is_empty());
        out.extend_from_slice(&piece);
        if (out.len() as u64) < len {
            assert_eq!(piece.len(), chunk, "only the last piece is short");
        }
        between();
    }
    assert_eq!(out.len() as u64, len, "the length announced up front");
    Bytes::from(out)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any history, read in pieces of any size, gives exactly the whole image's bytes.
    #[test]
    fn the_stream_is_the_image(
        steps in prop::collection::vec(step(), 0..60),
        chunk in 1usize..300,
    ) {
        let mut d = Driven::new();
        for s in &steps {
            apply(&mut d, s);
        }
        let whole = d.store.image().expect("an image");
        let streamed = read_all(&d.store, chunk, &mut || {});
        prop_assert_eq!(&streamed, &whole);
        prop_assert!(snapshot::decode(&streamed).is_ok());
    }

    /// Writes, commits and compaction while the stream is read do not reach it: it shows the
    /// state of the moment it was taken.
    #[test]
    fn writes_during_the_stream_do_not_reach_it(
        before in prop::collection::vec(step(), 1..40),
        during in prop::collection::vec(step(), 1..40),
        chunk in 1usize..64,
    ) {
        let mut d = Driven::new();
        for s in &before {
            apply(&mut d, s);
        }
        let expected = d.store.image().expect("an image");
        let mut during = during.into_iter();
        let mut index = d.raft_index;
        let mut pending = std::mem::take(&mut d.pending);
        let store = &d.store;
        let streamed = read_all(store, chunk, &mut || match during.next() {
            Some(Step::Cmd(cmd)) => {
                index += 1;
                let (_, prepared) = store.execute(&[(index, Some(&cmd))]).expect("executes");
                pending.push(prepared);
            }
            Some(Step::Flush) => store.commit(std::mem::take(&mut pending)).expect("commits"),
            Some(Step::Compact(n)) => {
                store.compact_step(n).expect("a compaction step");
            }
            None => {}
        });
        prop_assert_eq!(streamed, expected);
    }

    /// A stream taken unmeasured, stopped anywhere and rewound, gives the whole image's bytes
    /// from the first one again (a broken transfer resumes by encoding up to the receiver's
    /// offset), writes in between notwithstanding, and knows its length at the end.
    #[test]
    fn a_rewound_unmeasured_stream_is_the_image_again(
        steps in prop::collection::vec(step(), 0..60),
        during in prop::collection::vec(step(), 0..20),
        chunk in 1usize..300,
        stop_after in 0usize..20,
    ) {
        let mut d = Driven::new();
        for s in &steps {
            apply(&mut d, s);
        }
        let whole = d.store.image().expect("an image");
        let mut stream = d.store.image_stream_unmeasured().expect("a stream");
        for _ in 0..stop_after {
            if stream.next_chunk(chunk).expect("a piece").is_none() {
                break;
            }
        }
        for s in &during {
            apply(&mut d, s);
        }
        stream.rewind();
        let mut out = Vec::new();
        while let Some(piece) = stream.next_chunk(chunk).expect("a piece") {
            out.extend_from_slice(&piece);
        }
        prop_assert_eq!(stream.len(), whole.len() as u64);
        prop_assert_eq!(Bytes::from(out), whole);
    }
}
