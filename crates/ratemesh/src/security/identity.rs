//! [`NodeIdentity`]: what one node presents and trusts, as rustls configurations.

use std::fmt;
use std::sync::Arc;

use ratemesh_core::NodeId;
use rustls::RootCertStore;
use rustls::client::Resumption;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier as _;
use rustls::crypto::CryptoProvider;
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use zeroize::Zeroizing;

use super::{
    ALPN, ALPN_STREAMED, CID_HKDF_SALT, SecurityError, admit, hkdf_sha256_32, pem_encode, reset_key_material,
    server_name,
};

/// What one node presents (its certificate chain and key) and trusts (the cluster CA).
pub struct NodeIdentity {
    pub(super) node: NodeId,
    pub(super) ca_certs: Vec<CertificateDer<'static>>,
    pub(super) chain: Vec<CertificateDer<'static>>,
    pub(super) key: PrivateKeyDer<'static>,
    pub(super) reset_key: Zeroizing<[u8; 32]>,
}

impl NodeIdentity {
    /// An identity from PEM: CA certificate(s), node certificate chain (leaf first), node key.
    /// The leaf must name `node`. Whether it chains to the CA is checked by the handshakes, not
    /// here.
    pub fn from_pem(
        node: NodeId,
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
    ) -> Result<Self, SecurityError> {
        let ca_certs = parse_certs(ca_pem, "CA certificate")?;
        let chain = parse_certs(cert_pem, "node certificate")?;
        Self::from_parts(node, ca_certs, chain, parse_key(key_pem)?)
    }

    /// An identity from parsed parts; the leaf must name `node`.
    pub(super) fn from_parts(
        node: NodeId,
        ca_certs: Vec<CertificateDer<'static>>,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Self, SecurityError> {
        admit(node, &chain)?;
        let reset_key = reset_key_material(key.secret_der(), node)?;
        Ok(Self { node, ca_certs, chain, key, reset_key })
    }

    /// The node this identity names.
    pub fn node_id(&self) -> NodeId {
        self.node
    }

    /// The trusted CA certificate(s), DER.
    pub fn ca_certs(&self) -> &[CertificateDer<'static>] {
        &self.ca_certs
    }

    /// The node certificate chain, PEM (leaf first).
    pub fn cert_pem(&self) -> String {
        self.chain.iter().map(|cert| pem_encode("CERTIFICATE", cert)).collect()
    }

    /// The node's private key, PEM. Secret: write it only to a protected file.
    pub fn key_pem(&self) -> Zeroizing<String> {
        let label = match &self.key {
            PrivateKeyDer::Pkcs1(_) => "RSA PRIVATE KEY",
            PrivateKeyDer::Sec1(_) => "EC PRIVATE KEY",
            _ => "PRIVATE KEY",
        };
        Zeroizing::new(pem_encode(label, self.key.secret_der()))
    }

    /// The rustls server configuration: TLS 1.3 only, *ring* provider, ALPN [`ALPN_STREAMED`] (preferred) or [`ALPN`], client
    /// certificates required and verified against the cluster CA, no session resumption (every
    /// connection is a full mutual authentication).
    pub fn server_config(&self) -> Result<rustls::ServerConfig, SecurityError> {
        let provider = ring_provider();
        let verifier =
            WebPkiClientVerifier::builder_with_provider(self.roots()?, provider.clone()).build()?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())?;
        config.alpn_protocols = vec![ALPN_STREAMED.to_vec(), ALPN.to_vec()];
        config.session_storage = Arc::new(NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
        Ok(config)
    }

    /// The rustls client configuration: TLS 1.3 only, *ring* provider, ALPN [`ALPN_STREAMED`] or [`ALPN`], server
    /// certificates verified against the cluster CA and the expected node name (the server name
    /// of each connection, see `server_name`), this node's certificate presented, no resumption.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, SecurityError> {
        let mut config = rustls::ClientConfig::builder_with_provider(ring_provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(self.roots()?)
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())?;
        config.alpn_protocols = vec![ALPN_STREAMED.to_vec(), ALPN.to_vec()];
        config.resumption = Resumption::disabled();
        Ok(config)
    }

    /// The HMAC key of this node's QUIC stateless resets. It is the same after a restart of the
    /// node (derived from the cluster secret, or from the provided node key, and the node id), so
    /// a node that comes back on the same address promptly resets the connections its peers
    /// still hold to its previous run, instead of leaving them to black-hole frames until their
    /// idle timeout. (Identities from [`ClusterCa::issue`] derive it from their fresh key.)
    pub(crate) fn stateless_reset_key(&self) -> ring::hmac::Key {
        ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &self.reset_key[..])
    }

    /// The key with which this node signs its QUIC connection ids, stable across restarts like
    /// [`NodeIdentity::stateless_reset_key`]: a restarted node recognizes the ids of its previous
    /// run as its own (and answers them with a stateless reset), while it still drops packets
    /// with forged ids without answering.
    pub(crate) fn connection_id_key(&self) -> Result<u64, SecurityError> {
        let okm = hkdf_sha256_32(CID_HKDF_SALT, &self.reset_key[..], &[])?;
        let mut key = [0_u8; 8];
        key.copy_from_slice(&okm[..8]);
        Ok(u64::from_le_bytes(key))
    }

    /// Checks that the private key matches the leaf certificate
    /// ([`SecurityError::KeyMismatch`]; a key rustls cannot load is [`SecurityError::Tls`]).
    pub fn check_key(&self) -> Result<(), SecurityError> {
        CertifiedKey::from_der(self.chain.clone(), self.key.clone_key(), &ring_provider()).map(drop).map_err(
            |error| match error {
                rustls::Error::InconsistentKeys(_) => SecurityError::KeyMismatch,
                other => SecurityError::Tls(other),
            },
        )
    }

    /// Checks the certificate chain now as the peers' handshakes will: it chains to one of the
    /// trusted CAs, is valid at this time, may serve as client and as server, and names this
    /// node ([`SecurityError::Untrusted`] with rustls' reason otherwise).
    pub fn check_chain(&self) -> Result<(), SecurityError> {
        let (leaf, intermediates) = self.chain.split_first().ok_or(SecurityError::NoPeerCertificate)?;
        let now = UnixTime::now();
        let provider = ring_provider();
        let as_client =
            WebPkiClientVerifier::builder_with_provider(self.roots()?, provider.clone()).build()?;
        as_client.verify_client_cert(leaf, intermediates, now).map_err(SecurityError::Untrusted)?;
        let as_server = WebPkiServerVerifier::builder_with_provider(self.roots()?, provider).build()?;
        as_server
            .verify_server_cert(leaf, intermediates, &server_name(self.node), &[], now)
            .map_err(SecurityError::Untrusted)?;
        Ok(())
    }

    fn roots(&self) -> Result<Arc<RootCertStore>, SecurityError> {
        let mut roots = RootCertStore::empty();
        for cert in &self.ca_certs {
            roots.add(cert.clone())?;
        }
        Ok(Arc::new(roots))
    }
}

impl fmt::Debug for NodeIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeIdentity").field("node", &self.node).finish_non_exhaustive()
    }
}

pub(super) fn ring_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub(super) fn parse_certs(
    pem: &[u8],
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, SecurityError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| SecurityError::Pem { what })?;
    if certs.is_empty() {
        return Err(SecurityError::Pem { what });
    }
    Ok(certs)
}

pub(super) fn parse_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, SecurityError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|_| SecurityError::Pem { what: "private key" })
}
