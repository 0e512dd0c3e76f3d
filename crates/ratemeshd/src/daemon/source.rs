//! Where the configuration came from ([`ConfigSource`]: the file and the environment overrides
//! read at start) and how the file watcher notices a change without reading the file
//! ([`FileStamp`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::config::{Config, ConfigError};

/// A file's identity (device and inode), modification time and length: what the file watcher
/// compares to notice a change without reading the file. Symlinks are followed, and the
/// identity is the target's: a Kubernetes ConfigMap volume is updated by swapping a symlink to a
/// new directory (the kubelet's atomic writer), which gives the path another file, whatever
/// that file's time and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    device: u64,
    inode: u64,
    modified: SystemTime,
    len: u64,
}

impl FileStamp {
    /// The stamp of the file at `path` now, `None` if its metadata cannot be read.
    pub fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt as _;
        let metadata = std::fs::metadata(path).ok()?;
        Some(FileStamp {
            device: metadata.dev(),
            inode: metadata.ino(),
            modified: metadata.modified().ok()?,
            len: metadata.len(),
        })
    }
}

/// Where the configuration came from, for reloads.
#[derive(Clone, Debug)]
pub struct ConfigSource {
    /// The file.
    pub path: PathBuf,
    /// The `RATEMESH_` environment overrides read at start, applied again at every reload (the
    /// process's environment does not change; keeping them makes reloads reproducible).
    pub env: Vec<(OsString, OsString)>,
    /// The file's stamp as it was when it was last read (see [`ConfigSource::load`]).
    read_stamp: Option<FileStamp>,
}

impl ConfigSource {
    /// The file at `path`, with the `RATEMESH_` variables among `vars`. Not read yet: load the
    /// configuration with [`ConfigSource::load`], so that the file watcher's starting point is
    /// the file that configuration came from.
    pub fn new(path: PathBuf, vars: impl IntoIterator<Item = (OsString, OsString)>) -> ConfigSource {
        let prefix = crate::config::ENV_PREFIX;
        let env = vars.into_iter().filter(|(name, _)| name.to_string_lossy().starts_with(prefix)).collect();
        ConfigSource { path, env, read_stamp: None }
    }

    /// Reads and validates the file, and remembers the file's stamp, whatever the outcome: the
    /// file watcher reloads when the file differs from what was last read (an invalid file is not
    /// read again every poll, only once it changes).
    pub fn load(&mut self) -> Result<Config, ConfigError> {
        // Taken before reading: a write that races the read changes the file after the stamp,
        // so the watcher sees a difference and reads again. Taken after, that write could be
        // stamped as read while its content was not.
        self.read_stamp = FileStamp::of(&self.path);
        Config::load_with_env(&self.path, self.env.iter().map(|(k, v)| (k, v)))
    }

    /// The file's stamp when it was last read by [`ConfigSource::load`] (`None`: never read, or
    /// its metadata could not be read).
    pub fn read_stamp(&self) -> Option<FileStamp> {
        self.read_stamp
    }
}
