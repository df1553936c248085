//! A file's content as its upload brings it, piece by piece: written to a `.part` file in the
//! files' folder (a SQLite ledger's), which is removed unless the file is kept — whatever ends
//! the upload, its client gone included —, or gathered in memory for a PostgreSQL ledger, which
//! keeps it in the database.

use std::path::Path;

use tempfile::TempPath;
use tokio::io::AsyncWriteExt;

use super::BatchError;

/// An upload's content so far, and the id its file will have.
#[derive(Debug)]
pub struct Upload {
    pub(super) id: String,
    into: Into,
    bytes: u64,
}

#[derive(Debug)]
enum Into {
    /// Its `.part` file, open for writing (removed when dropped, unless renamed).
    Part {
        file: tokio::fs::File,
        path: TempPath,
    },
    Memory(Vec<u8>),
}

/// An upload's content, whole: kept (or dropped, and its `.part` file with it) with its row.
#[derive(Debug)]
pub(super) enum Received {
    /// Its `.part` file, closed, to be renamed to the file's id beside it.
    Part(TempPath),
    Memory(Vec<u8>),
}

impl Upload {
    /// The content of file `id`, into a `.part` file in `dir`, or in memory without one.
    pub(super) async fn start(dir: Option<&Path>, id: String) -> Result<Upload, BatchError> {
        let into = match dir {
            Some(dir) => {
                let unwritten = BatchError::Upload;
                let path =
                    TempPath::try_from_path(dir.join(format!("{id}.part"))).map_err(unwritten)?;
                let file = tokio::fs::File::create(&path).await.map_err(unwritten)?;
                Into::Part { file, path }
            }
            None => Into::Memory(Vec::new()),
        };
        Ok(Upload { id, into, bytes: 0 })
    }

    /// The next piece of the content.
    pub async fn write(&mut self, piece: &[u8]) -> Result<(), BatchError> {
        match &mut self.into {
            Into::Part { file, .. } => file.write_all(piece).await.map_err(BatchError::Upload)?,
            Into::Memory(held) => held.extend_from_slice(piece),
        }
        self.bytes += piece.len() as u64;
        Ok(())
    }

    /// Its size so far, in bytes.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The whole content, every piece written.
    pub(super) async fn finish(self) -> Result<Received, BatchError> {
        match self.into {
            Into::Part { mut file, path } => {
                file.flush().await.map_err(BatchError::Upload)?;
                drop(file);
                Ok(Received::Part(path))
            }
            Into::Memory(held) => Ok(Received::Memory(held)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_upload_dropped_before_it_is_kept_leaves_no_part_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut u = Upload::start(Some(dir.path()), "file-1".into())
            .await
            .unwrap();
        u.write(b"abc").await.unwrap();
        assert!(dir.path().join("file-1.part").exists());
        drop(u);
        assert!(!dir.path().join("file-1.part").exists());

        let mut u = Upload::start(Some(dir.path()), "file-2".into())
            .await
            .unwrap();
        u.write(b"abc").await.unwrap();
        u.write(b"de").await.unwrap();
        assert_eq!(u.bytes(), 5);
        let Received::Part(path) = u.finish().await.unwrap() else {
            panic!("a folder's upload is a .part file");
        };
        assert_eq!(std::fs::read(&path).unwrap(), b"abcde");
        drop(path);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
