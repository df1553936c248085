//! Reading a file a config names (a tokenizer, a CA): a regular file only, up to its limit.
//!
//! A config loaded by `check`, start-up or reload must not hang or fill memory on the file it
//! names: a FIFO would block the open (so it is opened with `O_NONBLOCK`, which a regular file
//! ignores) and then the read; a device such as `/dev/zero` never ends. The opened file is
//! `fstat`ed and refused unless it is a regular file; then at most `limit` bytes are read (a
//! file reporting a small size that grows, or a `/proc` file reporting 0, is still cut off).

use std::fs::{File, Metadata};
use std::io::Read;
use std::path::Path;

/// `tokenizer.file` (`tokenizer.json`), also once inflated when it is gzip-compressed.
pub(crate) const TOKENIZER_BYTES: u64 = 64 << 20;
/// `tokenizer.config` (`tokenizer_config.json` with its chat template), also once inflated.
pub(crate) const TOKENIZER_CONFIG_BYTES: u64 = 16 << 20;
/// A backend's `ca_file` (a PEM bundle; Mozilla's whole set is about 0.2 MiB).
pub(crate) const CA_BYTES: u64 = 1 << 20;

/// Why a config-named file was not read; shown after the key and the path.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FileError {
    #[error("cannot be read: {0}")]
    Io(#[from] std::io::Error),
    #[error("is not a regular file ({0})")]
    NotRegular(&'static str),
    #[error("is larger than its limit of {} ({size} bytes)", mib(*limit))]
    TooLarge { size: u64, limit: u64 },
    /// A stream (a gzip decoder's output, a file growing as it is read) went past the limit:
    /// its full size is not known.
    #[error("holds more than its limit of {}", mib(*limit))]
    Over { limit: u64 },
}

/// The limit as people write it: `64 MiB`, or bytes when not a whole number of MiB.
pub(crate) fn mib(limit: u64) -> String {
    if limit >= 1 << 20 && limit % (1 << 20) == 0 {
        format!("{} MiB", limit >> 20)
    } else {
        format!("{limit} bytes")
    }
}

/// The bytes of the regular file at `path`, refused when it holds more than `limit`.
pub(crate) fn read(path: &Path, limit: u64) -> Result<Vec<u8>, FileError> {
    let file = open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(FileError::NotRegular(kind(&meta)));
    }
    if meta.len() > limit {
        return Err(FileError::TooLarge {
            size: meta.len(),
            limit,
        });
    }
    // A file that grows as it is read is cut off at its limit all the same.
    read_bounded(file, limit)
}

/// A backend's `ca_file` (the upstream client's TLS settings are made from its bytes).
pub(crate) fn read_ca(path: &Path) -> Result<Vec<u8>, FileError> {
    read(path, CA_BYTES)
}

/// Everything of `reader` (a gzip decoder, say) up to `limit` bytes; more is `Over`.
pub(crate) fn read_bounded(reader: impl Read, limit: u64) -> Result<Vec<u8>, FileError> {
    let mut out = Vec::new();
    reader.take(limit.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > limit {
        return Err(FileError::Over { limit });
    }
    Ok(out)
}

#[cfg(unix)]
fn open(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

#[cfg(not(unix))]
fn open(path: &Path) -> std::io::Result<File> {
    File::open(path)
}

/// What a file that is not regular is, in words.
fn kind(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "not a plain file"
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_within_its_limit_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        assert_eq!(read(&p, 10).unwrap(), b"0123456789");
        let e = read(&p, 9).unwrap_err().to_string();
        assert_eq!(e, "is larger than its limit of 9 bytes (10 bytes)");
    }

    #[test]
    fn a_directory_and_a_device_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let e = read(dir.path(), 10).unwrap_err().to_string();
        assert_eq!(e, "is not a regular file (a directory)");
        #[cfg(unix)]
        {
            let e = read(Path::new("/dev/zero"), 10).unwrap_err().to_string();
            assert_eq!(e, "is not a regular file (a character device)");
        }
    }

    #[test]
    fn a_reader_is_cut_at_its_limit() {
        assert_eq!(read_bounded(&b"abc"[..], 3).unwrap(), b"abc");
        let e = read_bounded(std::io::repeat(0), 2 << 20).unwrap_err();
        assert_eq!(e.to_string(), "holds more than its limit of 2 MiB");
    }
}
