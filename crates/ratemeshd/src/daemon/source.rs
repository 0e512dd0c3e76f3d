//! Where the configuration came from ([`ConfigSource`]: the file and the environment overrides
//! read at start, or `ratemeshd envoy-ratelimit`'s directory of YAML files or what its xDS
//! server sent) and how the file
//! watcher notices a change without reading the files ([`FileStamp`], [`SourceStamp`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use crate::config::{Config, ConfigError, EMBEDDED_CONFIG, EMBEDDED_CONFIG_ORIGIN};
use crate::envoy_ratelimit::{ConfigFile, EnvoyConfigError, Settings};

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

/// The stamps of every file a configuration was read from: what the file watcher compares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceStamp(Vec<(PathBuf, Option<FileStamp>)>);

/// Why a configuration source could not be read. Nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The TOML file (or the `RATEMESH_` variables) is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A YAML file of `ratemeshd envoy-ratelimit` is invalid.
    #[error(transparent)]
    EnvoyRatelimit(#[from] EnvoyConfigError),
}

/// Where the configuration came from, for reloads.
#[derive(Clone, Debug)]
pub struct ConfigSource {
    /// The file; for `ratemeshd envoy-ratelimit`, the directory of YAML files.
    pub path: PathBuf,
    /// The `RATEMESH_` environment overrides read at start, applied again at every reload (the
    /// process's environment does not change; keeping them makes reloads reproducible).
    pub env: Vec<(OsString, OsString)>,
    /// The stamps of the files as they were when last read (see [`ConfigSource::load`]).
    read_stamp: Option<SourceStamp>,
    /// `ratemeshd envoy-ratelimit`'s settings and its TOML file, if any.
    envoy: Option<EnvoySource>,
}

#[derive(Clone, Debug)]
struct EnvoySource {
    settings: Arc<Settings>,
    /// The TOML file of the daemon's own settings (cluster, data directory, bounds), if any.
    base: Option<PathBuf>,
    /// With `CONFIG_TYPE=GRPC_XDS_SOTW`: the configuration the xDS server sent last (none
    /// before the first), read instead of the directory's files.
    xds: Option<XdsDocuments>,
}

/// The configuration documents an xDS server sent last, shared between the xDS client (which
/// replaces them, then reloads) and the source (which reads them at each load).
pub type XdsDocuments = Arc<ratemesh::Mutex<Vec<ConfigFile>>>;

impl ConfigSource {
    /// The file at `path`, with the `RATEMESH_` variables among `vars`. Not read yet: load the
    /// configuration with [`ConfigSource::load`], so that the file watcher's starting point is
    /// the file that configuration came from.
    pub fn new(path: PathBuf, vars: impl IntoIterator<Item = (OsString, OsString)>) -> ConfigSource {
        let prefix = crate::config::ENV_PREFIX;
        let env = vars.into_iter().filter(|(name, _)| name.to_string_lossy().starts_with(prefix)).collect();
        ConfigSource { path, env, read_stamp: None, envoy: None }
    }

    /// `ratemeshd envoy-ratelimit`'s source: the YAML files of `settings.config_dir` over the
    /// daemon's own settings, from `base` (a TOML file; else the embedded default) and the
    /// `RATEMESH_` variables among `vars`.
    pub fn envoy_ratelimit(
        settings: Settings,
        base: Option<PathBuf>,
        vars: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> ConfigSource {
        let source = ConfigSource::new(settings.config_dir.clone(), vars);
        let xds = settings.xds.is_some().then(XdsDocuments::default);
        ConfigSource { envoy: Some(EnvoySource { settings: Arc::new(settings), base, xds }), ..source }
    }

    /// With `CONFIG_TYPE=GRPC_XDS_SOTW`: where the xDS client puts what the server sends.
    pub fn xds_documents(&self) -> Option<XdsDocuments> {
        self.envoy.as_ref().and_then(|envoy| envoy.xds.clone())
    }

    /// Reads and validates the configuration, and remembers the files' stamps, whatever the
    /// outcome: the file watcher reloads when the files differ from what was last read (an
    /// invalid file is not read again every poll, only once it changes).
    pub fn load(&mut self) -> Result<Config, SourceError> {
        // Taken before reading: a write that races the read changes the file after the stamp,
        // so the watcher sees a difference and reads again. Taken after, that write could be
        // stamped as read while its content was not.
        self.read_stamp = Some(self.stamp_now());
        let env = || self.env.iter().map(|(k, v)| (k, v));
        let Some(envoy) = &self.envoy else {
            return Ok(Config::load_with_env(&self.path, env())?);
        };
        let mut config = match &envoy.base {
            Some(base) => Config::load_with_env(base, env())?,
            None => Config::parse_with_env(EMBEDDED_CONFIG, EMBEDDED_CONFIG_ORIGIN, env())?,
        };
        let files = match &envoy.xds {
            // A poisoned lock still holds a whole list: the client replaces it in one assignment.
            Some(documents) => documents.lock().clone(),
            None => crate::envoy_ratelimit::read_dir(&self.path, envoy.settings.ignore_dot_files)?,
        };
        let loaded = crate::envoy_ratelimit::load(&files, envoy.settings.merge_domains)?;
        envoy.settings.apply(&mut config, loaded);
        Ok(config)
    }

    /// The stamps of the files now: the TOML file, or the envoy-ratelimit mode's TOML file (if
    /// any) and every file of its directory.
    pub fn stamp_now(&self) -> SourceStamp {
        let stamp = |path: PathBuf| {
            let stamp = FileStamp::of(&path);
            (path, stamp)
        };
        let Some(envoy) = &self.envoy else { return SourceStamp(vec![stamp(self.path.clone())]) };
        // With xDS, no file but the TOML one: the client reloads when the server sends.
        let files = match envoy.xds {
            Some(_) => Vec::new(),
            None => crate::envoy_ratelimit::list(&self.path, envoy.settings.ignore_dot_files),
        };
        SourceStamp(envoy.base.iter().cloned().chain(files).map(stamp).collect())
    }

    /// The files' stamps when they were last read by [`ConfigSource::load`] (`None`: never read).
    pub fn read_stamp(&self) -> Option<SourceStamp> {
        self.read_stamp.clone()
    }
}
