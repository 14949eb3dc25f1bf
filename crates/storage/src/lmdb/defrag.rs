//! Defragmentation: LMDB never shrinks its file, so the space of freed pages returns to the
//! file system only through a compacting copy that replaces the file.
//!
//! etcd's defragmentation holds every write for its whole length (seconds on a large database:
//! etcd issue 9222). Here commits go on meanwhile:
//! 1. journaling starts: each commit from now on is also kept in memory;
//! 2. LMDB's compacting copy (`mdb_env_copyfd2` with `MDB_CP_COMPACT`) writes a read snapshot
//!    taken after that into `<db>.defrag-<n>/`, while commits go on;
//! 3. the journal is written to the copy, in rounds while commits go on, then a last round
//!    under the commit lock; re-applying a commit the snapshot already held changes nothing
//!    (every write sets or removes a key, later ones win), so the copy ends exactly equal;
//! 4. still under the lock, the copy is synced, the two directories are exchanged atomically
//!    (`renameat2` with `RENAME_EXCHANGE`) and their parent synced, and readers and commits
//!    move to the copy; views already open keep the old environment until they end.
//!
//! A crash before the exchange leaves the old directory in place; after it, the new one,
//! complete and synced. Either way the other is left as `<db>.defrag-<n>` and
//! [`remove_leftovers`] deletes it at the next open. The commit lock is held only for the last
//! round, a sync and the exchange; the store's executions (and so client writes) do not wait
//! for commits at all unless the committer's queue fills.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cairn_kv::backend::{BackendError, WriteBatch};
use heed::CompactionOption;

use super::{err, open_err, Handles, LmdbBackend};

/// Where a defragmentation stops early, to test what a crash there leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefragStep {
    /// The compacting copy is written, not caught up.
    Copied,
    /// The copy is caught up and synced, not yet exchanged.
    CaughtUp,
    /// The directories are exchanged; the backend still uses the old environment.
    Exchanged,
}

/// Catch-up rounds while commits go on, before the last round under the commit lock.
const ROUNDS: usize = 8;
/// A round this small is left to the last one, under the lock.
const SMALL_ROUND: usize = 64;

/// Copies in this process, so each opens a directory no other environment was opened at
/// (heed refuses to open a path twice while an environment opened there lives).
static GENERATION: AtomicU64 = AtomicU64::new(0);

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BackendError {
    let path = path.to_path_buf();
    move |e| open_err(op, &path)(heed::Error::Io(e))
}

/// What writes a copy of the database beside it: a defragmentation and a snapshot install.
const KINDS: [&str; 2] = ["defrag", "install"];

/// The prefix of a copy's directory name beside `db`.
fn prefix(db: &Path, kind: &str) -> String {
    let name = db.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    format!("{name}.{kind}-")
}

/// A new, empty, private directory beside `db` for a copy of the kind given (one of [`KINDS`]),
/// named so that no environment in this process was opened there.
pub(super) fn fresh_dir(db: &Path, kind: &str) -> Result<PathBuf, BackendError> {
    debug_assert!(KINDS.contains(&kind));
    let n = GENERATION.fetch_add(1, Ordering::Relaxed);
    let name = format!("{}{}-{n}", prefix(db, kind), std::process::id());
    let copy = db.with_file_name(name);
    crate::fs::create_private_dir(&copy).map_err(io("create directory", &copy))?;
    Ok(copy)
}

/// Removes what an interrupted defragmentation or install left beside `db`: an unfinished
/// copy, or the old directory after the exchange.
pub(super) fn remove_leftovers(db: &Path) -> Result<(), BackendError> {
    let Some(parent) = db.parent() else { return Ok(()) };
    let prefixes = KINDS.map(|kind| prefix(db, kind));
    for entry in std::fs::read_dir(parent).map_err(io("read directory", parent))? {
        let entry = entry.map_err(io("read directory", parent))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if prefixes.iter().any(|p| name.starts_with(p)) {
            let p = entry.path();
            std::fs::remove_dir_all(&p).map_err(io("remove", &p))?;
        }
    }
    Ok(())
}

pub(super) fn sync_dir(dir: &Path) -> Result<(), BackendError> {
    std::fs::File::open(dir).and_then(|f| f.sync_all()).map_err(io("sync directory", dir))
}

/// Writes journaled commits to the copy in one transaction.
fn replay(to: &Handles, batches: &[WriteBatch]) -> Result<(), BackendError> {
    let mut wtxn = to.env.write_txn().map_err(err("begin write"))?;
    for batch in batches {
        to.write_commit(&mut wtxn, batch)?;
    }
    wtxn.commit().map_err(err("commit defragmented copy"))
}

impl LmdbBackend {
    /// [`cairn_kv::backend::Backend::defragment`], stopping after `stop` (for tests of what a
    /// crash there leaves: drop the backend and open it again).
    #[doc(hidden)]
    pub fn defragment_until(&self, stop: Option<DefragStep>) -> Result<(), BackendError> {
        let _one = self.defragmenting.lock().unwrap_or_else(|e| e.into_inner());
        let copy = fresh_dir(&self.path, "defrag")?;
        *self.journal() = Some(Vec::new());
        let result = self.defragment_into(&copy, stop);
        *self.journal() = None;
        if result.is_err() || stop.is_none() {
            // After an exchange this is the old database; otherwise an unfinished copy.
            let _ = std::fs::remove_dir_all(&copy);
        }
        result
    }

    fn defragment_into(&self, copy: &Path, stop: Option<DefragStep>) -> Result<(), BackendError> {
        let file = copy.join("data.mdb");
        // The copy's read snapshot begins after journaling did: every commit it misses is
        // in the journal.
        self.handles()
            .env
            .copy_to_path(&file, CompactionOption::Enabled)
            .map_err(open_err("compacting copy", &file))?;
        let to = Handles::open(copy, self.map_size)?;
        if stop == Some(DefragStep::Copied) {
            return Ok(());
        }
        for _ in 0..ROUNDS {
            let batches = std::mem::take(self.journal().get_or_insert_with(Vec::new));
            replay(&to, &batches)?;
            if batches.len() <= SMALL_ROUND {
                break;
            }
        }
        // Durable before the lock, so the last sync has little to write.
        to.env.force_sync().map_err(err("sync defragmented copy"))?;
        let mut journal = self.journal();
        let rest = journal.take().unwrap_or_default();
        replay(&to, &rest)?;
        to.env.force_sync().map_err(err("sync defragmented copy"))?;
        sync_dir(copy)?;
        if stop == Some(DefragStep::CaughtUp) {
            return Ok(());
        }
        exchange(copy, &self.path)?;
        if stop == Some(DefragStep::Exchanged) {
            return Ok(());
        }
        self.note_size(&to);
        *self.cur.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(to);
        drop(journal);
        Ok(())
    }
}

/// Swaps the directories `a` and `b` in one step, then makes that durable.
pub(super) fn exchange(a: &Path, b: &Path) -> Result<(), BackendError> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE)
        .map_err(|e| io("exchange directories", b)(e.into()))?;
    let parent: PathBuf = b.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    sync_dir(&parent)
}
