//! Where snapshots are kept: [`StateStore`] and the atomic [`FileStateStore`].

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use super::SNAPSHOT_FILE_NAME;

/// Where a node keeps its snapshot. Called from a blocking thread (never on the async
/// runtime's workers), one call at a time per node.
pub trait StateStore: Send + Sync + std::fmt::Debug + 'static {
    /// The bytes last saved, `None` when nothing was ever saved. Refuses (an error of kind
    /// [`std::io::ErrorKind::FileTooLarge`]) to return more than `bytes_max` bytes.
    fn load(&self, bytes_max: usize) -> std::io::Result<Option<Vec<u8>>>;

    /// Replaces the saved bytes atomically: whatever happens during the call (a crash, a full
    /// disk), a later [`StateStore::load`] returns either the previous bytes or these.
    fn save(&self, bytes: &[u8]) -> std::io::Result<()>;
}

/// A snapshot file, [`SNAPSHOT_FILE_NAME`], in a data directory (created if missing). Saving
/// writes a temporary file beside it, syncs it, renames it over the snapshot and syncs the
/// directory, so that the file is always a complete snapshot, old or new.
#[derive(Clone, Debug)]
pub struct FileStateStore {
    dir: PathBuf,
}

impl FileStateStore {
    /// The store in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> FileStateStore {
        FileStateStore { dir: dir.into() }
    }

    /// The snapshot file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(SNAPSHOT_FILE_NAME)
    }

    pub(super) fn temp_path(&self) -> PathBuf {
        self.dir.join(format!("{SNAPSHOT_FILE_NAME}.tmp"))
    }
}

impl StateStore for FileStateStore {
    fn load(&self, bytes_max: usize) -> std::io::Result<Option<Vec<u8>>> {
        let file = match std::fs::File::open(self.path()) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error),
        };
        let mut bytes = Vec::new();
        // One byte more than the bound, to tell "at the bound" from "over it".
        file.take(bytes_max as u64 + 1).read_to_end(&mut bytes)?;
        if bytes.len() > bytes_max {
            return Err(too_large(bytes_max));
        }
        Ok(Some(bytes))
    }

    fn save(&self, bytes: &[u8]) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let temp = self.temp_path();
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temp, self.path())?;
        sync_dir(&self.dir)
    }
}

/// Makes a rename in `dir` durable (on Unix, by syncing the directory).
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    std::fs::File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

pub(super) fn too_large(bytes_max: usize) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::FileTooLarge, format!("larger than {bytes_max} bytes"))
}
