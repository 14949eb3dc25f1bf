//! The LMDB backend on a full disk and on damaged files: clear errors naming the file.

use cairn_storage::lmdb::disk_full;

fn io(e: std::io::Error) -> heed::Error {
    heed::Error::Io(e)
}

#[test]
fn a_short_write_on_a_full_disk_says_no_space_left() {
    // LMDB reports a short write as EIO; with the disk (nearly) full, that is what it is.
    let eio = || io(std::io::Error::from_raw_os_error(5));
    let msg = disk_full(eio(), Some(4096)).to_string();
    assert_eq!(msg, "no space left on device");
    let enospc = io(std::io::Error::from_raw_os_error(28));
    assert_eq!(disk_full(enospc, None).to_string(), "no space left on device");
    // With room on the disk, or no way to know, EIO stays an IO error.
    assert!(disk_full(eio(), Some(10 << 30)).to_string().contains("os error 5"));
    assert!(disk_full(eio(), None).to_string().contains("os error 5"));
}
