//! The write-ahead log for Raft entries, hard state and snapshot markers.
//!
//! Layout: segment files named `{seq:016x}-{first_index:016x}.wal`, preallocated with zeros to
//! [`WalOptions::segment_bytes`]. A segment is a run of records (framing in `record.rs`): 1 entry,
//! 2 hard state, 3 compaction marker (entries at or below its index are gone), 4 installed
//! snapshot (every earlier entry is gone). A zero length ends the data of a segment. Every
//! segment begins with the latest snapshot marker and hard state, so removing older segments
//! never loses them.
//!
//! Commit protocol: [`Wal::append`] writes records (no fsync); [`Wal::sync`] makes everything
//! appended so far durable with one fdatasync (group commit). An entry at index `i` supersedes any
//! earlier-written entries at `i` and above (the Raft log's suffix truncation), so truncation is
//! just writing.
//!
//! Recovery: segments are replayed in order. In the last segment, bad bytes after the last valid
//! record with no valid record anywhere after them are a torn write from a crash: they are cut
//! off and zeroed. A bad record with a valid record after it, or any bad bytes in an earlier
//! segment, is corruption: opening fails with the file and offset and changes no byte; only
//! [`crate::repair`], run on purpose, truncates there (keeping a copy of what it cuts).
//! Media assumption: the disk may lose or tear unsynced writes, persists a file's writes in order,
//! and does not corrupt synced data silently (the checksums detect it when it does).

use cairn_raft::{Entry, HardState, LogIndex, SnapshotMeta};

use crate::codec;
use crate::error::io_err;
pub use crate::error::WalError;
use crate::fs::{Dir, File};
use crate::record::{put_record, KIND_ENTRY, KIND_HARD_STATE, KIND_INSTALL, KIND_SNAPSHOT};
pub use crate::replay::Recovered;
use crate::replay::Replayed;

/// Tuning of the log.
#[derive(Clone, Copy, Debug)]
pub struct WalOptions {
    /// Size a segment is preallocated to; the log moves to a new segment when a write would pass it.
    pub segment_bytes: u64,
}

impl Default for WalOptions {
    fn default() -> WalOptions {
        WalOptions { segment_bytes: 64 << 20 }
    }
}

#[derive(Clone, Debug)]
struct Segment {
    seq: u64,
    name: String,
    /// The highest entry index written to this segment; it may be removed once compacted past it.
    max_index: LogIndex,
}

/// The write-ahead log over a directory.
#[derive(Debug)]
pub struct Wal<D: Dir> {
    dir: D,
    opts: WalOptions,
    /// Invariant: at least one; the last is the active segment; sequence numbers increase.
    segments: Vec<Segment>,
    active: D::File,
    /// Where the next record goes in the active segment.
    offset: u64,
    hard_state: HardState,
    snapshot: Option<SnapshotMeta>,
    last_index: LogIndex,
    /// Set by the first error; every later call fails.
    poisoned: bool,
}

/// The log's active segment opened a second time, to sync it on another thread while the log
/// goes on writing ([`Wal::sync_handle`]).
#[derive(Debug)]
pub struct SyncHandle<F> {
    segment: u64,
    name: String,
    file: F,
}

impl<F: File> SyncHandle<F> {
    /// The sequence number of the segment this handle syncs ([`Wal::active_segment`]).
    pub fn segment(&self) -> u64 {
        self.segment
    }

    /// Makes every write to the segment so far durable (fdatasync).
    pub fn sync(&mut self) -> Result<(), WalError> {
        self.file.sync_data().map_err(io_err("sync", &self.name))
    }
}

fn segment_name(seq: u64, first: LogIndex) -> String {
    format!("{seq:016x}-{:016x}.wal", first.0)
}

fn parse_segment_name(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".wal")?;
    let (seq, first) = stem.split_once('-')?;
    u64::from_str_radix(first, 16).ok()?;
    u64::from_str_radix(seq, 16).ok()
}

/// The directory's segments as (sequence number, file name), oldest first.
pub(crate) fn segment_names<D: Dir>(dir: &D) -> Result<Vec<(u64, String)>, WalError> {
    let mut names: Vec<(u64, String)> = dir
        .list()
        .map_err(io_err("list", "wal directory"))?
        .into_iter()
        .filter_map(|n| parse_segment_name(&n).map(|seq| (seq, n)))
        .collect();
    names.sort();
    Ok(names)
}

impl<D: Dir> Wal<D> {
    /// Opens the log in `dir`, creating it if empty, and returns what it holds.
    pub fn open(dir: D, opts: WalOptions) -> Result<(Wal<D>, Recovered), WalError> {
        let names = segment_names(&dir)?;
        if names.is_empty() {
            let name = segment_name(1, LogIndex(1));
            let mut active = dir.open(&name).map_err(io_err("create", &name))?;
            active.set_len(opts.segment_bytes).map_err(io_err("preallocate", &name))?;
            active.sync_data().map_err(io_err("sync", &name))?;
            dir.sync().map_err(io_err("sync", "wal directory"))?;
            let segments = vec![Segment { seq: 1, name, max_index: LogIndex::ZERO }];
            let wal = Wal {
                dir,
                opts,
                segments,
                active,
                offset: 0,
                hard_state: HardState::default(),
                snapshot: None,
                last_index: LogIndex::ZERO,
                poisoned: false,
            };
            return Ok((wal, Recovered::default()));
        }
        let replayed = crate::replay::replay(&dir, names)?;
        let recovered = replayed.recovered.clone();
        Ok((Wal::from_replay(dir, opts, replayed), recovered))
    }

    pub(crate) fn from_replay(dir: D, opts: WalOptions, replayed: Replayed<D::File>) -> Wal<D> {
        let Replayed { recovered, segments, active, offset } = replayed;
        let segments = segments
            .into_iter()
            .map(|(seq, name, max_index)| Segment { seq, name, max_index })
            .collect();
        Wal {
            dir,
            opts,
            segments,
            active,
            offset,
            hard_state: recovered.hard_state,
            snapshot: recovered.snapshot.clone(),
            last_index: recovered.entries.last().map_or_else(
                || recovered.snapshot.as_ref().map_or(LogIndex::ZERO, |s| s.index),
                |e| e.index,
            ),
            poisoned: false,
        }
    }

    /// Writes entries and (if given) the hard state after them. Not durable until [`Wal::sync`].
    pub fn append(
        &mut self,
        entries: &[Entry],
        hard_state: Option<&HardState>,
    ) -> Result<(), WalError> {
        let mut buf =
            Vec::with_capacity(entries.iter().map(|e| e.size_bytes() as usize + 32).sum());
        for e in entries {
            put_record(&mut buf, KIND_ENTRY, |out| codec::encode_entry(e, out));
        }
        if let Some(hs) = hard_state {
            put_record(&mut buf, KIND_HARD_STATE, |out| codec::encode_hard_state(hs, out));
        }
        self.write(&buf)?;
        if let Some(last) = entries.last() {
            self.last_index = last.index;
            let active = self.segments.last_mut().expect("an active segment");
            active.max_index = active.max_index.max(last.index);
        }
        if let Some(hs) = hard_state {
            self.hard_state = *hs;
        }
        Ok(())
    }

    /// Records that the log is compacted up to `meta.index`: replay drops entries at or below it
    /// and keeps the ones after.
    pub fn save_compaction(&mut self, meta: &SnapshotMeta) -> Result<(), WalError> {
        self.write_snapshot_marker(KIND_SNAPSHOT, meta)?;
        self.last_index = self.last_index.max(meta.index);
        Ok(())
    }

    /// Records that a snapshot from the leader replaced the whole log: replay drops every entry
    /// written before this record. Write it after the snapshot's data is durable.
    pub fn install_snapshot(&mut self, meta: &SnapshotMeta) -> Result<(), WalError> {
        self.write_snapshot_marker(KIND_INSTALL, meta)?;
        self.last_index = meta.index;
        Ok(())
    }

    fn write_snapshot_marker(&mut self, kind: u8, meta: &SnapshotMeta) -> Result<(), WalError> {
        let mut buf = Vec::new();
        put_record(&mut buf, kind, |out| codec::encode_snapshot_meta(meta, out));
        self.write(&buf)?;
        self.snapshot = Some(meta.clone());
        Ok(())
    }

    /// Makes everything appended so far durable: one fdatasync for the whole batch.
    pub fn sync(&mut self) -> Result<(), WalError> {
        self.check()?;
        let name = self.segments.last().map(|s| s.name.clone()).unwrap_or_default();
        let result = self.active.sync_data().map_err(io_err("sync", &name));
        self.poison_on(result)
    }

    /// A handle to the active segment for syncing it elsewhere (another thread), with the
    /// segment's sequence number so the caller can keep one handle per segment. A sync through it
    /// makes durable every write made before it: the log syncs a segment before it moves to the
    /// next, so the active one is all that can be behind.
    ///
    /// The handle is the segment opened again, not a `dup` of the log's descriptor: Linux
    /// reports a failed writeback once to each open file, so through a shared one, an error
    /// the other thread's sync consumed would leave this log's next sync reporting success.
    pub fn sync_handle(&self) -> Result<SyncHandle<D::File>, WalError> {
        self.check()?;
        let seg = self.segments.last().expect("an active segment");
        let file = self.dir.open(&seg.name).map_err(io_err("open", &seg.name))?;
        Ok(SyncHandle { segment: seg.seq, name: seg.name.clone(), file })
    }

    /// The active segment's sequence number: it changes when the log moves to a new segment.
    pub fn active_segment(&self) -> u64 {
        self.segments.last().map_or(0, |s| s.seq)
    }

    /// Removes whole segments whose entries are all at or below `index` (never the active one).
    /// Call after the snapshot covering `index` is durable.
    pub fn compact(&mut self, index: LogIndex) -> Result<(), WalError> {
        self.check()?;
        let removable = self.segments[..self.segments.len() - 1]
            .iter()
            .take_while(|s| s.max_index <= index)
            .count();
        for seg in self.segments.drain(..removable).collect::<Vec<_>>() {
            let result = self.dir.remove(&seg.name).map_err(io_err("remove", &seg.name));
            self.poison_on(result)?;
        }
        if removable > 0 {
            let result = self.dir.sync().map_err(io_err("sync", "wal directory"));
            self.poison_on(result)?;
        }
        Ok(())
    }

    /// Number of segment files, for tests and metrics.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    fn check(&self) -> Result<(), WalError> {
        if self.poisoned {
            Err(WalError::Poisoned)
        } else {
            Ok(())
        }
    }

    fn poison_on<T>(&mut self, result: Result<T, WalError>) -> Result<T, WalError> {
        if result.is_err() {
            self.poisoned = true;
        }
        result
    }

    fn write(&mut self, buf: &[u8]) -> Result<(), WalError> {
        self.check()?;
        if self.offset > 0 && self.offset + buf.len() as u64 > self.opts.segment_bytes {
            let rotated = self.rotate();
            self.poison_on(rotated)?;
        }
        let name = self.segments.last().map(|s| s.name.clone()).unwrap_or_default();
        let result = self.active.write_at(self.offset, buf).map_err(io_err("write", &name));
        self.poison_on(result)?;
        self.offset += buf.len() as u64;
        Ok(())
    }

    /// Seals the active segment (durably) and starts the next, headed by the current snapshot
    /// marker and hard state.
    fn rotate(&mut self) -> Result<(), WalError> {
        let old = self.segments.last().map(|s| s.name.clone()).unwrap_or_default();
        self.active.sync_data().map_err(io_err("sync", &old))?;
        let seq = self.segments.last().map_or(1, |s| s.seq + 1);
        let name = segment_name(seq, self.last_index.next());
        let mut file = self.dir.open(&name).map_err(io_err("create", &name))?;
        file.set_len(self.opts.segment_bytes).map_err(io_err("preallocate", &name))?;
        file.sync_data().map_err(io_err("sync", &name))?;
        self.dir.sync().map_err(io_err("sync", "wal directory"))?;
        let mut header = Vec::new();
        if let Some(meta) = &self.snapshot {
            put_record(&mut header, KIND_SNAPSHOT, |out| codec::encode_snapshot_meta(meta, out));
        }
        put_record(&mut header, KIND_HARD_STATE, |out| {
            codec::encode_hard_state(&self.hard_state, out)
        });
        file.write_at(0, &header).map_err(io_err("write", &name))?;
        self.active = file;
        self.offset = header.len() as u64;
        self.segments.push(Segment { seq, name, max_index: LogIndex::ZERO });
        Ok(())
    }
}
