//! TLS on the gRPC listener, as envoyproxy/ratelimit offers it (`GRPC_SERVER_USE_TLS`): the
//! server's certificate chain and key, and, with a client CA, mutual TLS (every client must
//! present a certificate that CA signed). Envoy Gateway turns it on for its rate limit service,
//! from the certificates it mounts at `/certs`.
//!
//! rustls with the ring provider (the one the peer transport uses), TLS 1.2 and 1.3, ALPN `h2`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

/// Why the listener's TLS cannot be set up: every error names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file holds no usable PEM of what it should hold.
    #[error("{path}: no {what} in PEM")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What was looked for.
        what: &'static str,
    },
    /// rustls refused the certificates or the key (a key that does not match its certificate,
    /// an unsupported key type, a CA it cannot use).
    #[error("{path}: {reason}")]
    Refused {
        /// The file the certificate, key or CA came from.
        path: PathBuf,
        /// rustls' reason.
        reason: String,
    },
}

/// The files of the listener's TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain (PEM, leaf first).
    pub cert: PathBuf,
    /// The server's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// With it, mutual TLS: clients must present a certificate this CA (PEM) signed.
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// The rustls configuration of these files, read and checked now (a bad file stops the start,
    /// with its path).
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|error| refused(&self.cert, &error))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in certificates(path)? {
                    roots.add(cert).map_err(|error| refused(path, &error))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|error| refused(path, &error))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let key = PrivateKeyDer::from_pem_slice(&read(&self.key)?)
            .map_err(|_| TlsError::Pem { path: self.key.clone(), what: "private key" })?;
        let mut config = builder
            .with_single_cert(certificates(&self.cert)?, key)
            .map_err(|error| refused(&self.key, &error))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_owned(), source })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem).filter_map(Result::ok).collect();
    if certs.is_empty() {
        return Err(TlsError::Pem { path: path.to_owned(), what: "certificate" });
    }
    Ok(certs)
}

fn refused(path: &Path, error: &impl std::fmt::Display) -> TlsError {
    TlsError::Refused { path: path.to_owned(), reason: error.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_or_foreign_files_are_refused_naming_the_file() {
        let dir = std::env::temp_dir().join(format!("ratemesh-rls-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let missing = TlsFiles { cert: dir.join("none.crt"), key: dir.join("none.key"), client_ca: None };
        let error = missing.server_config().expect_err("no such file").to_string();
        assert!(error.contains("none.key") || error.contains("none.crt"), "{error}");
        std::fs::write(dir.join("not.pem"), "not PEM at all").expect("written");
        let garbage = TlsFiles { cert: dir.join("not.pem"), key: dir.join("not.pem"), client_ca: None };
        let error = garbage.server_config().expect_err("no PEM").to_string();
        assert!(error.contains("not.pem") && error.contains("in PEM"), "{error}");
        let ca = TlsFiles { client_ca: Some(dir.join("not.pem")), ..garbage };
        let error = ca.server_config().expect_err("no CA").to_string();
        assert!(error.contains("no certificate in PEM"), "{error}");
        std::fs::remove_dir_all(&dir).expect("removed");
    }
}
