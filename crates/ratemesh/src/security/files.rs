//! PEM input ([`PemSource`], bounded reads) and certificate files ([`write_cert_files`]).

use std::fmt;
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use ratemesh_core::NodeId;
use zeroize::Zeroizing;

use super::{CERT_FILES_NODES_MAX, ClusterCa, PEM_FILE_LEN_MAX, SecurityError};

/// Where PEM input comes from.
#[derive(Clone)]
pub enum PemSource {
    /// A file, read when the identity is built (at most [`PEM_FILE_LEN_MAX`] bytes).
    Path(PathBuf),
    /// PEM text in memory.
    Bytes(Vec<u8>),
}

impl PemSource {
    pub(super) fn load(&self) -> Result<Zeroizing<Vec<u8>>, SecurityError> {
        match self {
            Self::Bytes(bytes) => Ok(Zeroizing::new(bytes.clone())),
            Self::Path(path) => read_bounded(path),
        }
    }
}

impl fmt::Debug for PemSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Path(path) => f.debug_tuple("Path").field(path).finish(),
            Self::Bytes(bytes) => write!(f, "Bytes(<{} bytes>)", bytes.len()),
        }
    }
}

pub(super) fn read_bounded(path: &Path) -> Result<Zeroizing<Vec<u8>>, SecurityError> {
    let io_error = |source| SecurityError::Io { path: path.to_owned(), source };
    let file = fs::File::open(path).map_err(io_error)?;
    let mut bytes = Zeroizing::new(Vec::new());
    file.take(PEM_FILE_LEN_MAX + 1).read_to_end(&mut bytes).map_err(io_error)?;
    if bytes.len() as u64 > PEM_FILE_LEN_MAX {
        return Err(SecurityError::PemTooLarge { path: path.to_owned(), max_bytes: PEM_FILE_LEN_MAX });
    }
    Ok(bytes)
}

/// The files [`write_cert_files`] wrote.
#[derive(Clone, Debug)]
pub struct CertFiles {
    /// The CA certificate (`ca.pem`).
    pub ca_cert: PathBuf,
    /// The CA private key (`ca.key`, mode 0600 on Unix).
    pub ca_key: PathBuf,
    /// Per node: its certificate (`node-<id>.pem`) and key (`node-<id>.key`, mode 0600).
    pub nodes: Vec<NodeCertFiles>,
}

/// One node's certificate and key files.
#[derive(Clone, Debug)]
pub struct NodeCertFiles {
    /// The node.
    pub node: NodeId,
    /// Its certificate, PEM.
    pub cert: PathBuf,
    /// Its private key, PEM.
    pub key: PathBuf,
}

/// Writes `ca`'s certificate and key and a certificate and key for every node in `nodes` into
/// `dir` (which must exist). Refuses to overwrite any file; at most [`CERT_FILES_NODES_MAX`]
/// nodes. The files are what [`ProvidedCerts`](crate::ProvidedCerts) reads.
pub fn write_cert_files(dir: &Path, ca: &ClusterCa, nodes: &[NodeId]) -> Result<CertFiles, SecurityError> {
    if nodes.len() > CERT_FILES_NODES_MAX {
        return Err(SecurityError::TooManyNodes { len: nodes.len(), max: CERT_FILES_NODES_MAX });
    }
    let ca_cert = dir.join("ca.pem");
    let ca_key = dir.join("ca.key");
    write_new(&ca_cert, ca.cert_pem().as_bytes(), false)?;
    write_new(&ca_key, ca.key_pem().as_bytes(), true)?;
    let mut files = CertFiles { ca_cert, ca_key, nodes: Vec::with_capacity(nodes.len()) };
    for &node in nodes {
        let identity = ca.issue(node)?;
        let cert = dir.join(format!("node-{}.pem", node.0));
        let key = dir.join(format!("node-{}.key", node.0));
        write_new(&cert, identity.cert_pem().as_bytes(), false)?;
        write_new(&key, identity.key_pem().as_bytes(), true)?;
        files.nodes.push(NodeCertFiles { node, cert, key });
    }
    Ok(files)
}

fn write_new(path: &Path, contents: &[u8], secret: bool) -> Result<(), SecurityError> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options.open(path).map_err(|source| match source.kind() {
        io::ErrorKind::AlreadyExists => SecurityError::FileExists { path: path.to_owned() },
        _ => SecurityError::Io { path: path.to_owned(), source },
    })?;
    file.write_all(contents).map_err(|source| SecurityError::Io { path: path.to_owned(), source })
}
