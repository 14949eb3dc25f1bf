//! The data directory's safety: it is private to its owner (directories 0700, files 0600, as
//! etcd makes them: the WAL and database hold every key and value), and one engine serves it at
//! a time.
//!
//! The lock is an OS lock (`flock`) on the member directory itself, held for the life of the
//! engine. Locking only a `LOCK` file let anyone who removed that file start a second server on
//! the same WAL and database, which corrupts both; the directory cannot be removed while it
//! holds the data. The `LOCK` file is still locked too (older cairn versions lock only it) and
//! names the holder's pid, so a refused second server can say who holds the directory.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use cairn_storage::fs::PRIVATE_FILE_MODE as FILE_MODE;
use cairn_storage::fs::{create_private_dir, PRIVATE_DIR_MODE as DIR_MODE};

use crate::error::{EngineError, OpenError};
use crate::identity::io_err;

/// Creates `dir` and any missing parents private to the owner; an existing directory that others
/// may read or enter is tightened to [`DIR_MODE`], with a warning saying so.
pub(crate) fn create_private(dir: &Path) -> Result<(), EngineError> {
    create_private_dir(dir).map_err(io_err("create", dir))?;
    let mode = fs::metadata(dir).map_err(io_err("inspect", dir))?.permissions().mode() & 0o777;
    if mode & !DIR_MODE != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(DIR_MODE))
            .map_err(io_err("restrict the permissions (to 0700) of", dir))?;
        tracing::warn!(
            "data directory {} was open to other users (mode {mode:o}); restricted it to {DIR_MODE:o}",
            dir.display()
        );
    }
    Ok(())
}

/// Opens (creating it with [`FILE_MODE`] if missing) a file of the data directory for writing,
/// without truncating it.
pub(crate) fn open_private(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .open(path)
}

/// The data directory's locks, released when dropped (or when the process ends, however it
/// ends: the OS drops `flock` locks with the last descriptor).
#[derive(Debug)]
pub(crate) struct DirLock {
    _member: File,
    _file: File,
}

/// Takes the data directory's locks, or says which process holds them. `data_dir` is the
/// directory as the operator named it (for the message); `member` is where the data lives.
pub(crate) fn lock(data_dir: &Path, member: &Path) -> Result<DirLock, EngineError> {
    let lock_path = member.join("LOCK");
    let locked = |pid| EngineError::Open(OpenError::Locked { dir: data_dir.to_path_buf(), pid });
    let dir = File::open(member).map_err(io_err("open", member))?;
    match dir.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Err(locked(holder(&lock_path))),
        Err(TryLockError::Error(e)) => return Err(io_err("lock", member)(e)),
    }
    let mut file = open_private(&lock_path).map_err(io_err("create", &lock_path))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Err(locked(holder(&lock_path))),
        Err(TryLockError::Error(e)) => return Err(io_err("lock", &lock_path)(e)),
    }
    file.set_len(0).map_err(io_err("truncate", &lock_path))?;
    writeln!(file, "{}", std::process::id()).map_err(io_err("write", &lock_path))?;
    Ok(DirLock { _member: dir, _file: file })
}

/// The pid the lock file names, if it names one.
fn holder(lock_path: &Path) -> Option<u32> {
    let mut s = String::new();
    File::open(lock_path).ok()?.read_to_string(&mut s).ok()?;
    s.trim().parse().ok()
}
