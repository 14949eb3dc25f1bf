//! The state machine's backend in LMDB (through heed): the kv history, its meta and the members'
//! published attributes in one environment, each batch committed in one write transaction, so
//! the applied index never disagrees with the attributes it covers.
//!
//! Durability: the environment uses `NO_META_SYNC`, so LMDB stays consistent after a crash but
//! may lose its last commit; that is safe because the WAL is the durability point and a restart
//! replays it from the applied index this backend reports.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

mod defrag;
mod install;

pub use defrag::DefragStep;

use cairn_kv::backend::{
    decode_alarms, decode_lease, parse_revision_key, revision_key, Backend, BackendError,
    BackendView, Meta, Record, Replacement, WriteBatch,
};
use std::collections::{BTreeMap, BTreeSet};

use cairn_kv::{AlarmMember, Lease, LeaseId, MemberAttributes, Revision, RevisionId};
use heed::types::Bytes as Raw;
use heed::{Database, Env, EnvFlags, EnvOpenOptions, RoTxn, RwTxn, WithoutTls};

const META_KEY: &[u8] = b"meta";
/// The raised alarms ([`cairn_kv::backend::encode_alarms`]), in the meta database beside the
/// meta record.
const ALARMS_KEY: &[u8] = b"alarms";
/// The encoded auth store, beside the meta record: small, and always replaced whole.
const AUTH_KEY: &[u8] = b"auth";
/// [`WriteBatch::installed_from`]: written only by an install, in its copy, so it exists only
/// in a database that came from one.
const INSTALLED_FROM_KEY: &[u8] = b"installed-from";

/// An LMDB failure: what was being done, and where (the directory for a failure to open, the
/// database file for a failed write).
#[derive(Debug)]
pub struct LmdbError {
    op: &'static str,
    path: Option<PathBuf>,
    heed: heed::Error,
}

impl LmdbError {
    /// The operation that failed, such as "commit".
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// The environment's directory for a failure to open it, the database file for a write.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// heed's error (which `Display` includes).
    pub fn heed(&self) -> &heed::Error {
        &self.heed
    }
}

impl fmt::Display for LmdbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(p) => write!(f, "lmdb: {} {}: {}", self.op, p.display(), self.heed),
            None => write!(f, "lmdb: {}: {}", self.op, self.heed),
        }
    }
}

impl std::error::Error for LmdbError {}

/// Wraps a heed error with the operation that failed.
fn err(op: &'static str) -> impl FnOnce(heed::Error) -> BackendError {
    move |heed| BackendError::engine(LmdbError { op, path: None, heed })
}

/// Wraps a failure to open the environment at `path`.
fn open_err(op: &'static str, path: &Path) -> impl FnOnce(heed::Error) -> BackendError {
    let path = Some(path.to_path_buf());
    move |heed| BackendError::engine(LmdbError { op, path, heed })
}

/// Below this much free space, a failed write is taken for a full disk.
const NEARLY_FULL_BYTES: u64 = 16 << 20;

/// `heed` as "no space left on device" when the disk is full: ENOSPC itself, or EIO, which
/// LMDB reports for a short write, on a file system with less than 16 MiB free
/// (`free`, if known). Any other error is returned as it is.
pub fn disk_full(heed: heed::Error, free: Option<u64>) -> heed::Error {
    let heed::Error::Io(e) = &heed else { return heed };
    let short_write = e.raw_os_error() == Some(rustix::io::Errno::IO.raw_os_error())
        && free.is_some_and(|f| f < NEARLY_FULL_BYTES);
    if e.kind() == std::io::ErrorKind::StorageFull || short_write {
        let full = std::io::Error::new(std::io::ErrorKind::StorageFull, "no space left on device");
        return heed::Error::Io(full);
    }
    heed
}

/// The kv history in an LMDB environment.
#[derive(Debug)]
pub struct LmdbBackend {
    /// The open environment and its databases; a defragmentation swaps in another.
    cur: RwLock<Arc<Handles>>,
    /// Held by every commit from start to end. While a defragmentation runs it holds the
    /// batches committed since its copy began, which it then writes to the copy.
    journal: Mutex<Option<Vec<WriteBatch>>>,
    /// One defragmentation at a time.
    defragmenting: Mutex<()>,
    map_size: usize,
    path: PathBuf,
    /// The database file's size as of the last commit, replace or defragmentation: the file
    /// changes size only then, and every write's quota check reads it (a `statx` per request
    /// showed up in the put path's profile).
    size: AtomicU64,
}

/// An environment and its databases.
#[derive(Debug)]
struct Handles {
    env: Env<WithoutTls>,
    history: Database<Raw, Raw>,
    meta: Database<Raw, Raw>,
    /// Member id (big-endian u64) to its encoded attributes.
    members: Database<Raw, Raw>,
    /// Lease id (big-endian i64) to its encoded TTLs.
    leases: Database<Raw, Raw>,
}

impl Handles {
    /// The database file's size on disk (0 if it cannot be read: a size is advisory).
    fn disk_size(&self) -> u64 {
        self.env.real_disk_size().unwrap_or(0)
    }

    fn open(path: &Path, map_size: usize) -> Result<Handles, BackendError> {
        let mut opts = EnvOpenOptions::new().read_txn_without_tls();
        opts.map_size(map_size).max_dbs(4).max_readers(1024);
        // SAFETY: NO_META_SYNC keeps the database consistent (a crash may undo the last commit,
        // which the WAL replays); NO_READ_AHEAD only affects performance.
        #[allow(unsafe_code)]
        unsafe {
            opts.flags(EnvFlags::NO_META_SYNC | EnvFlags::NO_READ_AHEAD);
        }
        // LMDB follows page numbers and offsets from the file unchecked: check them first, so a
        // damaged file is an error naming it rather than a crash.
        crate::lmdb_check::check(&path.join("data.mdb")).map_err(BackendError::engine)?;
        // SAFETY: heed requires that an environment is not opened twice in one process and that
        // its files are not modified behind its back; the engine holds an exclusive lock on the
        // data directory for as long as the environment is open, and a defragmentation opens
        // its copy in a directory of its own.
        #[allow(unsafe_code)]
        let env = unsafe { opts.open(path) }.map_err(open_err("open", path))?;
        let mut wtxn = env.write_txn().map_err(open_err("begin write", path))?;
        let mut db = |name| env.create_database(&mut wtxn, Some(name));
        let history = db("history").map_err(open_err("create db", path))?;
        let meta = db("meta").map_err(open_err("create db", path))?;
        let members = db("members").map_err(open_err("create db", path))?;
        let leases = db("leases").map_err(open_err("create db", path))?;
        wtxn.commit().map_err(open_err("commit", path))?;
        Ok(Handles { env, history, meta, members, leases })
    }

    fn write_leases(&self, wtxn: &mut RwTxn<'_>, batch: &WriteBatch) -> Result<(), BackendError> {
        for (id, change) in &batch.leases {
            let key = id.0.to_be_bytes();
            match change {
                Some(raw) => self.leases.put(wtxn, &key, raw).map_err(err("put lease"))?,
                None => {
                    self.leases.delete(wtxn, &key).map_err(err("delete lease"))?;
                }
            }
        }
        Ok(())
    }

    fn write_commit(&self, wtxn: &mut RwTxn<'_>, batch: &WriteBatch) -> Result<(), BackendError> {
        for (rev, rec) in &batch.puts {
            self.history.put(wtxn, &revision_key(*rev), rec).map_err(err("put"))?;
        }
        for rev in &batch.deletes {
            self.history.delete(wtxn, &revision_key(*rev)).map_err(err("delete"))?;
        }
        self.write_rest(wtxn, batch)
    }

    /// Members, leases, alarms, the auth store and meta: written the same way by a commit and a replace.
    fn write_rest(&self, wtxn: &mut RwTxn<'_>, batch: &WriteBatch) -> Result<(), BackendError> {
        for (id, attributes) in &batch.members {
            self.members.put(wtxn, &id.to_be_bytes(), attributes).map_err(err("put member"))?;
        }
        self.write_leases(wtxn, batch)?;
        if let Some(a) = &batch.alarms {
            self.meta.put(wtxn, ALARMS_KEY, a).map_err(err("put alarms"))?;
        }
        if let Some(auth) = &batch.auth {
            self.meta.put(wtxn, AUTH_KEY, auth).map_err(err("put auth"))?;
        }
        if let Some(m) = &batch.meta {
            self.meta.put(wtxn, META_KEY, &encode_meta(m)).map_err(err("put meta"))?;
        }
        if let Some(origin) = &batch.installed_from {
            self.meta.put(wtxn, INSTALLED_FROM_KEY, origin).map_err(err("put install origin"))?;
        }
        Ok(())
    }
}

impl LmdbBackend {
    /// Opens (creating if needed) the environment in directory `path`. `map_size` bounds the
    /// database's size; it is address space, not memory. What an interrupted defragmentation
    /// left beside it is removed.
    pub fn open(path: &Path, map_size: usize) -> Result<LmdbBackend, BackendError> {
        // LMDB creates its files 0600 itself.
        crate::fs::create_private_dir(path)
            .map_err(|e| open_err("create directory", path)(heed::Error::Io(e)))?;
        defrag::remove_leftovers(path)?;
        let handles = Handles::open(path, map_size)?;
        let size = AtomicU64::new(handles.disk_size());
        Ok(LmdbBackend {
            cur: RwLock::new(Arc::new(handles)),
            journal: Mutex::new(None),
            defragmenting: Mutex::new(()),
            map_size,
            path: path.to_path_buf(),
            size,
        })
    }

    /// Records the file's size after a write that may have changed it.
    fn note_size(&self, h: &Handles) {
        self.size.store(h.disk_size(), Ordering::Relaxed);
    }

    fn handles(&self) -> Arc<Handles> {
        self.cur.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn journal(&self) -> MutexGuard<'_, Option<Vec<WriteBatch>>> {
        self.journal.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Wraps a failed write, naming the database file, and saying so when the disk is full.
    /// A failure inside a write transaction, said as a commit's failure is: LMDB writes dirty
    /// pages to the file before the commit when a transaction outgrows its memory (a spill), so
    /// a full disk can first show in a put; it must say "no space left on device" and name the
    /// file there too, not come out as a bare IO error.
    fn write_failed(&self, e: BackendError) -> BackendError {
        let BackendError::Engine(inner) = &e else { return e };
        let Some(failed) = inner.downcast_ref::<LmdbError>() else { return e };
        let heed::Error::Io(io) = &failed.heed else { return e };
        let Some(code) = io.raw_os_error() else { return e };
        self.write_err(failed.op)(heed::Error::Io(std::io::Error::from_raw_os_error(code)))
    }

    fn write_err(&self, op: &'static str) -> impl FnOnce(heed::Error) -> BackendError {
        let file = self.path.join("data.mdb");
        move |heed| {
            let free =
                rustix::fs::statvfs(&file).ok().map(|s| s.f_bavail.saturating_mul(s.f_frsize));
            let heed = disk_full(heed, free);
            BackendError::engine(LmdbError { op, path: Some(file), heed })
        }
    }
}

fn encode_meta(m: &Meta) -> [u8; 32] {
    let mut out = [0u8; 32];
    out[..8].copy_from_slice(&m.applied_index.to_be_bytes());
    out[8..16].copy_from_slice(&m.current.0.to_be_bytes());
    out[16..24].copy_from_slice(&m.compacted.0.to_be_bytes());
    out[24..].copy_from_slice(&m.compacted_physically.0.to_be_bytes());
    out
}

fn decode_meta(raw: &[u8]) -> Result<Meta, BackendError> {
    let raw: &[u8; 32] = raw.try_into().map_err(|_| BackendError::Corrupt("bad meta record"))?;
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&raw[i * 8..i * 8 + 8]);
        w
    };
    Ok(Meta {
        applied_index: u64::from_be_bytes(word(0)),
        current: Revision(i64::from_be_bytes(word(1))),
        compacted: Revision(i64::from_be_bytes(word(2))),
        compacted_physically: Revision(i64::from_be_bytes(word(3))),
    })
}

/// A read transaction: a consistent snapshot for as long as it lives. It keeps its
/// environment open, so a defragmentation may swap in another meanwhile.
pub struct LmdbView {
    txn: RoTxn<'static, WithoutTls>,
    h: Arc<Handles>,
}

impl std::fmt::Debug for LmdbView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LmdbView")
    }
}

impl Backend for LmdbBackend {
    type View<'a> = LmdbView;

    fn view(&self) -> Result<LmdbView, BackendError> {
        let h = self.handles();
        let txn = h.env.clone().static_read_txn().map_err(err("begin read"))?;
        Ok(LmdbView { txn, h })
    }

    fn commit(&self, batch: WriteBatch) -> Result<(), BackendError> {
        let mut journal = self.journal();
        let h = self.handles();
        let mut wtxn = h.env.write_txn().map_err(err("begin write"))?;
        h.write_commit(&mut wtxn, &batch).map_err(|e| self.write_failed(e))?;
        wtxn.commit().map_err(self.write_err("commit"))?;
        self.note_size(&h);
        if let Some(j) = journal.as_mut() {
            j.push(batch);
        }
        Ok(())
    }

    /// Through [`Backend::begin_replace`]: written aside, then exchanged (see `install`), so a
    /// reader or a crash sees the old contents or the new; on an error the copy is dropped and
    /// the old contents stay. The batch's records go in with the rest, in `prepare`.
    fn replace(&self, batch: WriteBatch) -> Result<(), BackendError> {
        let mut replacement = self.begin_replace()?;
        replacement.prepare(batch)?;
        replacement.swap()
    }

    fn begin_replace(&self) -> Result<Box<dyn Replacement + '_>, BackendError> {
        Ok(Box::new(install::Install::begin(self)?))
    }

    fn defragment(&self) -> Result<(), BackendError> {
        self.defragment_until(None)
    }

    /// Makes every commit durable (LMDB otherwise defers its meta page flush).
    fn sync(&self) -> Result<(), BackendError> {
        self.handles().env.force_sync().map_err(self.write_err("sync"))
    }

    fn size_bytes(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    /// The pages the databases' trees hold (branch, leaf and overflow pages), without those
    /// on LMDB's free list.
    fn size_in_use_bytes(&self) -> u64 {
        let h = self.handles();
        h.env.non_free_pages_size().unwrap_or_else(|_| h.disk_size())
    }
}

impl BackendView for LmdbView {
    fn get(&self, rev: RevisionId) -> Result<Option<Record>, BackendError> {
        match self.h.history.get(&self.txn, &revision_key(rev)).map_err(err("get"))? {
            Some(raw) => Record::decode(raw).map(Some),
            None => Ok(None),
        }
    }

    fn encoded_len(&self, rev: RevisionId) -> Result<Option<usize>, BackendError> {
        let raw = self.h.history.get(&self.txn, &revision_key(rev)).map_err(err("get"))?;
        Ok(raw.map(<[u8]>::len))
    }

    fn scan(
        &self,
        from: RevisionId,
        visit: &mut dyn FnMut(RevisionId, Record) -> bool,
    ) -> Result<(), BackendError> {
        let start = revision_key(from);
        let range = (std::ops::Bound::Included(&start[..]), std::ops::Bound::Unbounded);
        for item in self.h.history.range(&self.txn, &range).map_err(err("scan"))? {
            let (k, v) = item.map_err(err("scan"))?;
            if !visit(parse_revision_key(k)?, Record::decode(v)?) {
                break;
            }
        }
        Ok(())
    }

    fn meta(&self) -> Result<Meta, BackendError> {
        match self.h.meta.get(&self.txn, META_KEY).map_err(err("get meta"))? {
            Some(raw) => decode_meta(raw),
            None => Ok(Meta::default()),
        }
    }

    fn members(&self) -> Result<BTreeMap<u64, MemberAttributes>, BackendError> {
        let mut out = BTreeMap::new();
        for item in self.h.members.iter(&self.txn).map_err(err("scan members"))? {
            let (k, v) = item.map_err(err("scan members"))?;
            let id: [u8; 8] =
                k.try_into().map_err(|_| BackendError::Corrupt("bad member id key"))?;
            out.insert(u64::from_be_bytes(id), MemberAttributes::decode(v)?);
        }
        Ok(out)
    }

    fn alarms(&self) -> Result<BTreeSet<AlarmMember>, BackendError> {
        match self.h.meta.get(&self.txn, ALARMS_KEY).map_err(err("get alarms"))? {
            Some(raw) => decode_alarms(raw),
            None => Ok(BTreeSet::new()),
        }
    }
    fn auth(&self) -> Result<Option<Vec<u8>>, BackendError> {
        let raw = self.h.meta.get(&self.txn, AUTH_KEY).map_err(err("get auth"))?;
        Ok(raw.map(<[u8]>::to_vec))
    }

    fn installed_from(&self) -> Result<Option<Vec<u8>>, BackendError> {
        let raw =
            self.h.meta.get(&self.txn, INSTALLED_FROM_KEY).map_err(err("get install origin"))?;
        Ok(raw.map(<[u8]>::to_vec))
    }

    fn leases(&self) -> Result<BTreeMap<LeaseId, Lease>, BackendError> {
        let mut out = BTreeMap::new();
        for item in self.h.leases.iter(&self.txn).map_err(err("scan leases"))? {
            let (k, v) = item.map_err(err("scan leases"))?;
            let id: [u8; 8] =
                k.try_into().map_err(|_| BackendError::Corrupt("bad lease id key"))?;
            let id = LeaseId(i64::from_be_bytes(id));
            out.insert(id, decode_lease(id, v)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_inside_a_write_names_the_file_and_says_so() {
        let dir = std::env::temp_dir().join(format!("cairn-lmdb-spill-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let backend = LmdbBackend::open(&dir, 1 << 20).expect("open");
        // What a put's spill on a full disk returns before this mapping: ENOSPC, no file.
        let enospc = heed::Error::Io(std::io::Error::from_raw_os_error(28));
        let raw = err("put")(enospc);
        assert!(!raw.to_string().contains("data.mdb"), "{raw}");
        let said = backend.write_failed(raw).to_string();
        assert!(said.contains("no space left on device"), "{said}");
        assert!(said.contains(&dir.join("data.mdb").display().to_string()), "{said}");
        // Other failures pass through as they are.
        let other = BackendError::Corrupt("bad meta record");
        assert_eq!(backend.write_failed(other.clone()), other);
        drop(backend);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
