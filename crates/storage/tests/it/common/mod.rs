//! What the WAL damage tests share: reading a directory's files whole, and walking a segment's
//! record framing (a 4-byte big-endian payload length, a 4-byte checksum, then the payload).

// Each test file uses a part of this.
#![allow(dead_code)]

use cairn_storage::faulty::FaultyDir;
use cairn_storage::fs::{Dir, File};

/// A file's bytes.
pub fn read<D: Dir>(dir: &D, name: &str) -> Vec<u8> {
    let f = dir.open(name).expect("the file opens");
    let mut b = vec![0u8; f.size().expect("a size") as usize];
    f.read_at(0, &mut b).expect("the file reads");
    b
}

/// Every file of the directory with its bytes, by name, to prove a refused open changed nothing.
pub fn image(dir: &FaultyDir) -> Vec<(String, Vec<u8>)> {
    let mut names = dir.list().expect("lists");
    names.sort();
    names.into_iter().map(|n| (n.clone(), read(dir, &n))).collect()
}

/// Each record of a well-formed segment as (start, end), up to the first zero length (the
/// preallocated tail).
pub fn records(data: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 9 <= data.len() {
        let len = u32::from_be_bytes(data[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        if len == 0 {
            break;
        }
        out.push((pos, pos + 8 + len));
        pos += 8 + len;
    }
    out
}
