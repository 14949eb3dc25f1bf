//! Execution and commits from different threads, as the engine runs them: overwriting keys while
//! commits land concurrently must always find the previous values. Regression: `execute` opened
//! its backend view before taking the index lock, so a commit landing in between moved records
//! out of the overlay that the view did not have yet, and the engine stopped ("history record
//! missing"). The backend here pauses after opening a view to make that window wide.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_kv::backend::{Backend, BackendError, MemBackend, WriteBatch};
use cairn_kv::*;

#[derive(Debug, Default)]
struct SlowViews(MemBackend);

impl Backend for SlowViews {
    type View<'a> = <MemBackend as Backend>::View<'a>;
    fn view(&self) -> Result<Self::View<'_>, BackendError> {
        let v = self.0.view();
        std::thread::sleep(Duration::from_micros(200));
        v
    }
    fn commit(&self, batch: WriteBatch) -> Result<(), BackendError> {
        self.0.commit(batch)
    }
    fn replace(&self, batch: WriteBatch) -> Result<(), BackendError> {
        self.0.replace(batch)
    }
    fn sync(&self) -> Result<(), BackendError> {
        Ok(())
    }
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
}

#[test]
fn overwrites_race_with_concurrent_commits() {
    let store = Arc::new(Store::open(SlowViews::default()).unwrap());
    let (tx, rx) = mpsc::channel::<Prepared>();
    let committer = {
        let store = store.clone();
        std::thread::spawn(move || {
            while let Ok(first) = rx.recv() {
                let mut batch = vec![first];
                batch.extend(rx.try_iter());
                store.commit(batch).unwrap();
            }
        })
    };
    for i in 0..1_500u64 {
        let put = Command::Put(PutRequest {
            key: Bytes::from_static(b"k"),
            value: Bytes::from(i.to_string()),
            prev_kv: true,
            ..PutRequest::default()
        });
        let (mut outcomes, prepared) = store.execute(&[(i + 1, Some(&put))]).unwrap();
        match outcomes.pop().flatten() {
            Some(Ok(CommandResponse::Put(resp))) if i >= 1 => {
                let prev = resp.prev_kv.expect("an overwritten key has a previous value");
                assert_eq!(prev.value, Bytes::from((i - 1).to_string()));
            }
            Some(Ok(_)) => {}
            other => panic!("put {i} failed: {other:?}"),
        }
        tx.send(prepared).unwrap();
    }
    drop(tx);
    committer.join().unwrap();
    assert_eq!(store.applied_index(), 1_500);
}
