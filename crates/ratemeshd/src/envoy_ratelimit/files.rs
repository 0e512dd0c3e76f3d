//! The configuration directory (`$RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY`):
//! every file under it, as upstream's runtime loader reads them, within bounds.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use super::{ConfigFile, EnvoyConfigError, Problem};

/// The largest configuration file, in bytes: refused unread beyond it.
pub const FILE_BYTES_MAX: usize = 4 << 20;

/// The most files in the configuration directory.
pub const FILES_MAX: usize = 1000;

/// The most bytes in all the configuration files together.
pub const FILES_BYTES_MAX: usize = 32 << 20;

/// How deep subdirectories are followed.
const DIRECTORY_DEPTH_MAX: usize = 8;

/// Every regular file under `dir` (symlinks followed, subdirectories too; names starting with
/// `.` skipped when `ignore_dot_files`), sorted by path, named by their path relative to `dir`.
pub fn read_dir(dir: &Path, ignore_dot_files: bool) -> Result<Vec<ConfigFile>, EnvoyConfigError> {
    let mut paths = Vec::new();
    walk(dir, ignore_dot_files, 0, &mut paths)?;
    paths.sort();
    let mut total = 0usize;
    let mut files = Vec::with_capacity(paths.len());
    for path in paths {
        let name = path.strip_prefix(dir).unwrap_or(&path).display().to_string();
        let text = read_bounded(&path).map_err(|problem| EnvoyConfigError { file: name.clone(), problem })?;
        total = total.saturating_add(text.len());
        if total > FILES_BYTES_MAX {
            return Err(too_many(dir));
        }
        files.push(ConfigFile { name, text });
    }
    Ok(files)
}

/// The files [`read_dir`] would read, with their metadata: what the file watcher compares.
pub fn list(dir: &Path, ignore_dot_files: bool) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    // An unreadable directory lists as what could be listed: the reload says what is wrong.
    let _ = walk(dir, ignore_dot_files, 0, &mut paths);
    paths.sort();
    paths
}

fn too_many(dir: &Path) -> EnvoyConfigError {
    EnvoyConfigError {
        file: dir.display().to_string(),
        problem: Problem::TooMany { files: FILES_MAX, bytes: FILES_BYTES_MAX },
    }
}

fn walk(
    dir: &Path,
    ignore_dot_files: bool,
    depth: usize,
    out: &mut Vec<PathBuf>,
) -> Result<(), EnvoyConfigError> {
    let unreadable = |error: std::io::Error| EnvoyConfigError {
        file: dir.display().to_string(),
        problem: Problem::Read(error.to_string()),
    };
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let path = entry.map_err(unreadable)?.path();
        let hidden = path.file_name().is_some_and(|name| name.to_string_lossy().starts_with('.'));
        if hidden && ignore_dot_files {
            continue;
        }
        // Follows symlinks: a Kubernetes ConfigMap's files are symlinks.
        let Ok(metadata) = std::fs::metadata(&path) else { continue };
        if metadata.is_dir() && depth < DIRECTORY_DEPTH_MAX {
            walk(&path, ignore_dot_files, depth + 1, out)?;
        } else if metadata.is_file() {
            if out.len() >= FILES_MAX {
                return Err(too_many(dir));
            }
            out.push(path);
        }
    }
    Ok(())
}

fn read_bounded(path: &Path) -> Result<String, Problem> {
    let read_error = |error: std::io::Error| Problem::Read(error.to_string());
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    // One byte more than the bound, to tell "at the bound" from "over it".
    file.take(FILE_BYTES_MAX as u64 + 1).read_to_end(&mut bytes).map_err(read_error)?;
    if bytes.len() > FILE_BYTES_MAX {
        return Err(Problem::TooLarge { max: FILE_BYTES_MAX });
    }
    String::from_utf8(bytes).map_err(|error| Problem::Read(format!("not UTF-8: {}", error.utf8_error())))
}
