//! The narrow file-system seam: everything the storage crate does to disk goes through [`Dir`]
//! and [`File`], so tests can swap in [`crate::faulty::FaultyDir`], which loses unsynced writes on
//! a simulated crash and fails operations on demand.

use std::fs::{self, DirBuilder, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A directory of files.
pub trait Dir {
    type File: File;
    /// Opens `name`, creating it empty if missing.
    fn open(&self, name: &str) -> io::Result<Self::File>;
    /// Names of the files in the directory.
    fn list(&self) -> io::Result<Vec<String>>;
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Makes creations and removals durable.
    fn sync(&self) -> io::Result<()>;
}

/// One file, read and written at offsets.
pub trait File {
    fn size(&self) -> io::Result<u64>;
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Makes every write so far durable (fdatasync).
    fn sync_data(&mut self) -> io::Result<()>;
    /// Grows (with zeros) or shrinks the file.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
}

/// Permissions of the directories storage creates: the log holds every key and value, so it is
/// the owner's alone (as etcd makes it).
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// Permissions of the files storage creates.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// Creates `path` and its missing parents with [`PRIVATE_DIR_MODE`].
pub fn create_private_dir(path: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(PRIVATE_DIR_MODE).create(path)
}

/// A real directory.
#[derive(Clone, Debug)]
pub struct OsDir {
    path: PathBuf,
}

impl OsDir {
    /// Opens `path`, creating it (and its parents) private to the owner if missing.
    pub fn create(path: impl AsRef<Path>) -> io::Result<OsDir> {
        create_private_dir(path.as_ref())?;
        Ok(OsDir { path: path.as_ref().to_path_buf() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A real file.
#[derive(Debug)]
pub struct OsFile {
    file: fs::File,
}

impl Dir for OsDir {
    type File = OsFile;

    fn open(&self, name: &str) -> io::Result<OsFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(PRIVATE_FILE_MODE)
            .open(self.path.join(name))?;
        Ok(OsFile { file })
    }

    fn list(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for e in fs::read_dir(&self.path)? {
            let e = e?;
            if e.file_type()?.is_file() {
                names.push(e.file_name().to_string_lossy().into_owned());
            }
        }
        Ok(names)
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        fs::remove_file(self.path.join(name))
    }

    fn sync(&self) -> io::Result<()> {
        fs::File::open(&self.path)?.sync_all()
    }
}

impl File for OsFile {
    fn size(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file.write_all_at(data, offset)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
}
