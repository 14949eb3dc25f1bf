//! Reading events for watchers: the recent revisions from the ring, older ones from the stored
//! history, each with the prev_kv etcd would send.

use std::sync::Arc;

use super::{Inner, Store};
use crate::backend::{Backend, BackendView, Record};
use crate::exec::Reader;
use crate::types::{KeyValue, Revision, RevisionId};
use crate::watch::{owned, Event, EventKind, EventRun, RevisionEvents};
use crate::KvError;

/// What [`Store::events`] found.
#[derive(Debug)]
pub enum History {
    /// Revisions from the one asked for; `None` when it is not executed yet.
    Events(Option<EventRun>),
    /// The revision asked for is below this compaction point: its history is gone.
    Compacted(Revision),
}

/// How many bytes of events one read gathers (at least one revision, however large): a read of
/// stored history holds the store's read lock, which execution waits for, and what is read
/// becomes replies a stream holds until its client takes them.
const READ_BYTES: usize = 256 << 10;

impl<B: Backend> Store<B> {
    /// The events of up to `max` consecutive revisions from `from` on, as executed: from the
    /// ring of recent revisions when it holds `from`, otherwise from the stored history, up to
    /// where the ring begins.
    pub fn events(&self, from: Revision, max: usize) -> Result<History, KvError> {
        let inner = self.read();
        if from < inner.exec_compacted {
            return Ok(History::Compacted(inner.exec_compacted));
        }
        if from > inner.exec_current || max == 0 {
            return Ok(History::Events(None));
        }
        if let Some(revisions) = inner.ring.from(from, max, READ_BYTES) {
            let last = revisions.last().map_or(from, |r| r.revision);
            return Ok(History::Events(Some(EventRun { first: from, last, revisions })));
        }
        let ring_start = inner.ring.first().map_or(inner.exec_current.next(), |f| f);
        let last = max_i64(from, max).min(Revision(ring_start.0 - 1)).min(inner.exec_current);
        let view = self.backend.view()?;
        let mut run = Run::new(&inner, &view);
        // Revisions up to `current` are committed: the view (opened under the lock) has them.
        // Later ones are executed only, and their records are in the overlay.
        let committed_end = inner.current.min(last);
        if from <= committed_end {
            view.scan(RevisionId { main: from, sub: 0 }, &mut |rev, rec| {
                rev.main <= committed_end && run.push(rev, rec)
            })?;
        }
        let mut rev = from.max(committed_end.next());
        'revisions: while rev <= last {
            let mut sub = 0;
            while let Some(rec) = inner.unflushed.get(&RevisionId { main: rev, sub }) {
                if !run.push(RevisionId { main: rev, sub }, rec.clone()) {
                    break 'revisions;
                }
                sub += 1;
            }
            rev = rev.next();
        }
        let covered = if run.cut { run.last_revision() } else { Some(last) };
        let revisions = run.finish()?;
        Ok(History::Events(covered.map(|last| EventRun { first: from, last, revisions })))
    }
}

fn max_i64(from: Revision, max: usize) -> Revision {
    let span = i64::try_from(max).unwrap_or(i64::MAX);
    Revision(from.0.saturating_add(span - 1))
}

/// Revisions being gathered from history records.
struct Run<'a, V: BackendView> {
    reader: Reader<'a, V>,
    revisions: Vec<Arc<RevisionEvents>>,
    current: Option<RevisionEvents>,
    bytes: usize,
    error: Option<KvError>,
    /// Stopped early, full: the run covers only the revisions it holds.
    cut: bool,
}

impl<'a, V: BackendView> Run<'a, V> {
    fn new(inner: &'a Inner, view: &'a V) -> Run<'a, V> {
        Run {
            reader: inner.reader(view),
            revisions: Vec::new(),
            current: None,
            bytes: 0,
            error: None,
            cut: false,
        }
    }

    fn full(&self) -> bool {
        self.bytes >= READ_BYTES || self.error.is_some()
    }

    /// Adds one record's event; false once the run is full and a new revision begins (so a
    /// revision is never split) or a read failed.
    fn push(&mut self, rev: RevisionId, rec: Record) -> bool {
        if self.current.as_ref().is_none_or(|c| c.revision != rev.main) {
            if self.full() {
                self.cut = true;
                return false;
            }
            self.close();
            self.current = Some(RevisionEvents { revision: rev.main, events: Vec::new() });
        }
        match self.event(rev, rec) {
            Ok(e) => {
                self.bytes += e.size_bytes();
                if let Some(c) = &mut self.current {
                    c.events.push(Arc::new(e));
                }
                true
            }
            Err(e) => {
                self.error = Some(e);
                false
            }
        }
    }

    fn event(&self, rev: RevisionId, rec: Record) -> Result<Event, KvError> {
        let prev = self.prev(&rec.key, rev.main, rec.tombstone || rec.version > 1)?;
        let (kind, kv) = if rec.tombstone {
            let kv = KeyValue { key: rec.key, mod_revision: rev.main, ..KeyValue::default() };
            (EventKind::Delete, kv)
        } else {
            let kv = KeyValue {
                key: rec.key,
                create_revision: rec.create,
                mod_revision: rev.main,
                version: rec.version,
                value: rec.value,
                lease: rec.lease,
            };
            (EventKind::Put, kv)
        };
        Ok(Event::new(kind, owned(kv), prev.map(owned)))
    }

    /// The key's state just before `rev`, as etcd's watch reads it (a Range at `rev - 1`): none
    /// for a creation, or when that revision is compacted.
    fn prev(&self, key: &[u8], rev: Revision, existed: bool) -> Result<Option<KeyValue>, KvError> {
        let before = Revision(rev.0 - 1);
        if !existed || before < self.reader.compacted {
            return Ok(None);
        }
        match self.reader.index.get(key, before) {
            Some(e) => {
                let key = bytes::Bytes::copy_from_slice(key);
                self.reader.kv(&key, e, true).map(Some)
            }
            None => Ok(None),
        }
    }

    fn last_revision(&self) -> Option<Revision> {
        self.current.as_ref().map(|c| c.revision).or(self.revisions.last().map(|r| r.revision))
    }

    fn close(&mut self) {
        if let Some(c) = self.current.take() {
            self.revisions.push(Arc::new(c));
        }
    }

    fn finish(mut self) -> Result<Vec<Arc<RevisionEvents>>, KvError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        self.close();
        Ok(self.revisions)
    }
}
