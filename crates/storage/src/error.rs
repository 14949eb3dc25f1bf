//! The log's typed errors. Any of them poisons the log: the node must stop (fail-stop).

use std::fmt;

/// A failure of the log. Any error poisons the log: the node must stop (fail-stop).
#[derive(Debug)]
#[non_exhaustive]
pub enum WalError {
    Io {
        op: &'static str,
        file: String,
        source: std::io::Error,
    },
    /// Bytes on disk are damaged where no crash could have left them.
    Corrupt {
        file: String,
        offset: u64,
        reason: &'static str,
    },
    /// An earlier error stopped the log.
    Poisoned,
}

impl fmt::Display for WalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WalError::Io { op, file, source } => write!(f, "wal: {op} {file}: {source}"),
            WalError::Corrupt { file, offset, reason } => {
                write!(f, "wal: corrupt record in {file} at offset {offset}: {reason}")
            }
            WalError::Poisoned => write!(f, "wal: stopped after an earlier error"),
        }
    }
}

impl std::error::Error for WalError {}

impl WalError {
    /// The same error with its file named by its path under `dir`, for messages to operators.
    pub fn in_dir(self, dir: &std::path::Path) -> WalError {
        // "wal directory" and "wal" (a gap between segments) mean the directory itself.
        let path = |file: String| match file.as_str() {
            "wal directory" | "wal" => dir.display().to_string(),
            _ => dir.join(file).display().to_string(),
        };
        match self {
            WalError::Io { op, file, source } => WalError::Io { op, file: path(file), source },
            WalError::Corrupt { file, offset, reason } => {
                WalError::Corrupt { file: path(file), offset, reason }
            }
            WalError::Poisoned => WalError::Poisoned,
        }
    }
}

/// Wraps an IO error with what was being done to which file.
pub(crate) fn io_err(op: &'static str, file: &str) -> impl FnOnce(std::io::Error) -> WalError {
    let file = file.to_string();
    move |source| WalError::Io { op, file, source }
}
