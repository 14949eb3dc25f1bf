//! An in-memory [`Dir`] for crash and fault tests.
//!
//! Writes are kept in order as pending operations until `sync_data`. [`FaultyDir::crash`] keeps a
//! seeded-random prefix of each file's pending operations and may tear the last one halfway, which
//! models a disk that persists writes in order but loses whatever was not synced. A file created
//! since the last directory sync may vanish. [`FaultyDir::fail_after`] makes a later mutating
//! operation fail, to test fail-stop behaviour.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::fs::{Dir, File};

#[derive(Clone, Debug)]
enum Op {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default)]
struct SimFile {
    /// What survives a crash.
    durable: Vec<u8>,
    /// What reads see.
    current: Vec<u8>,
    /// Operations since the last sync, oldest first.
    pending: Vec<Op>,
    /// Whether the file's existence is durable (the directory was synced after its creation).
    linked: bool,
}

#[derive(Debug, Default)]
struct Disk {
    files: BTreeMap<String, SimFile>,
    /// Mutating operations left before one fails.
    fail_in: Option<u64>,
    /// Counts mutating operations, so tests can aim a failure at each one.
    ops: u64,
}

/// A shared in-memory directory; clones see the same files.
#[derive(Clone, Debug, Default)]
pub struct FaultyDir {
    disk: Arc<Mutex<Disk>>,
}

/// A handle to one file of a [`FaultyDir`].
#[derive(Debug)]
pub struct FaultyFile {
    disk: Arc<Mutex<Disk>>,
    name: String,
}

fn apply(buf: &mut Vec<u8>, op: &Op) {
    match op {
        Op::Write { offset, data } => {
            let end = *offset as usize + data.len();
            if buf.len() < end {
                buf.resize(end, 0);
            }
            buf[*offset as usize..end].copy_from_slice(data);
        }
        Op::SetLen(len) => buf.resize(*len as usize, 0),
    }
}

impl FaultyDir {
    fn lock(&self) -> MutexGuard<'_, Disk> {
        self.disk.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next `n` mutating operations succeed; the one after fails, and so do all later ones
    /// until [`FaultyDir::crash`].
    pub fn fail_after(&self, n: u64) {
        self.lock().fail_in = Some(n);
    }

    /// Mutating operations performed so far.
    pub fn op_count(&self) -> u64 {
        self.lock().ops
    }

    /// Operations written but not yet made durable by a sync, over every file.
    pub fn unsynced_ops(&self) -> usize {
        self.lock().files.values().map(|f| f.pending.len()).sum()
    }

    /// Simulates power loss: unsynced operations are lost, except a random prefix (the last one
    /// possibly torn) chosen from `seed`. Injected failures are cleared.
    pub fn crash(&self, seed: u64) {
        let mut disk = self.lock();
        disk.fail_in = None;
        let mut rng = seed;
        let mut next = move || {
            rng = rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = rng;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z ^ (z >> 27)
        };
        disk.files.retain(|_, f| f.linked || next() % 2 == 0);
        for f in disk.files.values_mut() {
            let keep = (next() % (f.pending.len() as u64 + 1)) as usize;
            let mut image = f.durable.clone();
            for op in &f.pending[..keep] {
                apply(&mut image, op);
            }
            if let Some(Op::Write { offset, data }) = f.pending.get(keep) {
                if next() % 2 == 0 && !data.is_empty() {
                    let torn = (next() % data.len() as u64) as usize;
                    apply(&mut image, &Op::Write { offset: *offset, data: data[..torn].to_vec() });
                }
            }
            f.durable = image.clone();
            f.current = image;
            f.pending.clear();
            f.linked = true;
        }
    }

    /// Flips one byte of a file's durable and current contents, to test corruption detection.
    pub fn corrupt(&self, name: &str, offset: u64) {
        let mut disk = self.lock();
        if let Some(f) = disk.files.get_mut(name) {
            for buf in [&mut f.durable, &mut f.current] {
                if let Some(b) = buf.get_mut(offset as usize) {
                    *b ^= 0x5A;
                }
            }
        }
    }
}

/// Counts a mutating operation and fails it if a failure is due.
fn mutate(disk: &mut Disk) -> io::Result<()> {
    disk.ops += 1;
    match disk.fail_in {
        Some(0) => Err(io::Error::other("injected failure")),
        Some(n) => {
            disk.fail_in = Some(n - 1);
            Ok(())
        }
        None => Ok(()),
    }
}

impl Dir for FaultyDir {
    type File = FaultyFile;

    fn open(&self, name: &str) -> io::Result<FaultyFile> {
        let mut disk = self.lock();
        if !disk.files.contains_key(name) {
            mutate(&mut disk)?;
            disk.files.insert(name.to_string(), SimFile::default());
        }
        Ok(FaultyFile { disk: self.disk.clone(), name: name.to_string() })
    }

    fn list(&self) -> io::Result<Vec<String>> {
        Ok(self.lock().files.keys().cloned().collect())
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        let mut disk = self.lock();
        mutate(&mut disk)?;
        disk.files.remove(name).map(|_| ()).ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn sync(&self) -> io::Result<()> {
        let mut disk = self.lock();
        mutate(&mut disk)?;
        for f in disk.files.values_mut() {
            f.linked = true;
        }
        Ok(())
    }
}

impl FaultyFile {
    fn with<T>(&self, f: impl FnOnce(&mut Disk, &str) -> io::Result<T>) -> io::Result<T> {
        let mut disk = self.disk.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut disk, &self.name)
    }
}

fn file<'a>(disk: &'a mut Disk, name: &str) -> io::Result<&'a mut SimFile> {
    disk.files.get_mut(name).ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
}

impl File for FaultyFile {
    fn size(&self) -> io::Result<u64> {
        self.with(|d, n| Ok(file(d, n)?.current.len() as u64))
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.with(|d, n| {
            let f = file(d, n)?;
            let end = offset as usize + buf.len();
            if end > f.current.len() {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            }
            buf.copy_from_slice(&f.current[offset as usize..end]);
            Ok(())
        })
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.with(|d, n| {
            mutate(d)?;
            let f = file(d, n)?;
            let op = Op::Write { offset, data: data.to_vec() };
            apply(&mut f.current, &op);
            f.pending.push(op);
            Ok(())
        })
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.with(|d, n| {
            mutate(d)?;
            let f = file(d, n)?;
            // Replaying the pending operations costs what was written since the last sync, where
            // copying the file would cost its whole (preallocated) size on every sync.
            for op in std::mem::take(&mut f.pending) {
                apply(&mut f.durable, &op);
            }
            debug_assert!(f.durable == f.current);
            Ok(())
        })
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.with(|d, n| {
            mutate(d)?;
            let f = file(d, n)?;
            let op = Op::SetLen(len);
            apply(&mut f.current, &op);
            f.pending.push(op);
            Ok(())
        })
    }
}
