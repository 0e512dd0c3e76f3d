//! Cluster security: which certificates a node presents, which it trusts, and how a peer's
//! certificate names the member it speaks for.
//!
//! Every peer connection is mutual TLS 1.3 (rustls, the *ring* provider chosen explicitly, never
//! the process default): the server requires a client certificate issued by the cluster CA, the
//! client checks that the server's certificate was issued by the cluster CA for the node it meant
//! to reach. ALPN is [`ALPN_STREAMED`], or [`ALPN`] with a node of an older build.
//!
//! # Node names
//!
//! A node certificate names its node by one DNS subject alternative name,
//! `n<node id in decimal>.ratemesh.invalid` ([`node_dns_name`]). A DNS name, because it is what
//! rustls' client verifier checks against the expected server name, so the handshake itself
//! refuses a certificate that names another node; `.invalid` (RFC 6761), because that top-level
//! domain never resolves, so these names can never collide with, or be mistaken for, real hosts.
//!
//! # Admission rule
//!
//! **A member enters the ring only after a successful mutual-TLS handshake whose peer certificate
//! names that member.** Gossip proposes members; the transport's `verify` confirms them with
//! [`admit`]. On every incoming connection the sender's [`NodeId`] is read from its verified
//! certificate ([`peer_node_id`]), never from the message.
//!
//! # Two ways to set it up
//!
//! - [`ClusterSecurity::Secret`]: every node derives the *same* CA from a shared [`ClusterSecret`]
//!   ([`ClusterCa::derive`]: HKDF-SHA256 → Ed25519 seed, fixed subject, serial and validity) and
//!   issues its own node certificate with a fresh key. Anyone who holds the secret can mint a
//!   certificate for any node id: guard it like a private key. It also keys gossip
//!   ([`crate::gossip`]). Rotate it in three rolling restarts ([`ClusterSecret::also_accepting`]).
//! - [`ClusterSecurity::Provided`]: a CA certificate, node certificate and node key in PEM, for
//!   example made once by [`write_cert_files`], and a gossip secret.
//!
//! Secrets and private keys never appear in `Debug` output, errors or logs.

use std::fmt;
use std::io;
use std::path::PathBuf;

use ratemesh_core::NodeId;
use rustls_pki_types::{CertificateDer, ServerName};
use zeroize::Zeroizing;

mod ca;
mod files;
mod identity;

pub use ca::ClusterCa;
use ca::pem_encode;
pub use files::{CertFiles, NodeCertFiles, PemSource, write_cert_files};
pub use identity::NodeIdentity;

/// The ALPN protocol of a ratemesh peer connection whose frames each go on their own
/// unidirectional stream. Still accepted and offered, after [`ALPN_STREAMED`], so that nodes of
/// older builds (which know only this one) and newer ones keep talking during a rolling upgrade.
pub const ALPN: &[u8] = b"ratemesh/1";

/// The ALPN protocol of a ratemesh peer connection whose frames go length-prefixed (4 bytes, big
/// endian) on one long-lived unidirectional stream per connection, several per write. Preferred
/// by both sides; [`ALPN`] is the fallback.
pub const ALPN_STREAMED: &[u8] = b"ratemesh/2";

/// Suffix of every node's DNS name: `n<id>` followed by this.
pub const NODE_NAME_SUFFIX: &str = ".ratemesh.invalid";

/// The shortest accepted cluster secret, in bytes.
pub const CLUSTER_SECRET_LEN_MIN: usize = 16;

/// The largest PEM file read from disk, in bytes.
pub const PEM_FILE_LEN_MAX: u64 = 1 << 20;

/// The most node certificates [`write_cert_files`] writes in one call.
pub const CERT_FILES_NODES_MAX: usize = 4096;

/// The longest decimal rendering of a `u64` (`18446744073709551615`).
const NODE_ID_DIGITS_MAX: usize = 20;

/// HKDF salt and info of the cluster-CA derivation. Changing either changes every derived CA:
/// they are part of the protocol (version 1).
const CA_HKDF_SALT: &[u8] = b"ratemesh cluster-ca salt v1";
const CA_HKDF_INFO: &[u8] = b"ratemesh cluster-ca ed25519 seed v1";

/// HKDF salt of a node's QUIC stateless-reset key (see [`NodeIdentity::stateless_reset_key`]).
const RESET_HKDF_SALT: &[u8] = b"ratemesh stateless-reset salt v1";
/// HKDF salt of a node's QUIC connection-id key (see [`NodeIdentity::connection_id_key`]).
const CID_HKDF_SALT: &[u8] = b"ratemesh connection-id salt v1";

/// Subject and serial of a derived cluster CA (fixed, so every node builds identical bytes).
const CA_COMMON_NAME: &str = "ratemesh cluster CA";
const CA_ORGANIZATION: &str = "ratemesh";
const CA_SERIAL: &[u8] = &[0x01];

/// The validity window of derived CAs and of every certificate issued here: fixed (not "now"),
/// so that derived CAs are byte-identical and clock skew between nodes never rejects a fresh
/// certificate.
const VALIDITY_FROM_YMD: (i32, u8, u8) = (2025, 1, 1);
const VALIDITY_UNTIL_YMD: (i32, u8, u8) = (2125, 1, 1);

/// RFC 8410 PKCS#8 v1 prefix of an Ed25519 private key; the 32-byte seed follows.
const ED25519_PKCS8_V1_PREFIX: [u8; 16] =
    [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];

/// Why cluster security could not be set up, or why a peer certificate was refused.
///
/// Setup errors (secret, PEM, files, generation, TLS configuration) are the operator's: nothing
/// was created. Peer errors (`NoPeerCertificate`, `NoNodeName`, `AmbiguousNodeName`,
/// `NodeMismatch`) are the peer's: the connection is refused and the member is not admitted.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// The cluster secret is shorter than [`CLUSTER_SECRET_LEN_MIN`] bytes.
    #[error("cluster secret is {len_bytes} bytes, at least {min_bytes} are required")]
    SecretTooShort {
        /// Length of the secret given.
        len_bytes: usize,
        /// The minimum.
        min_bytes: usize,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// A PEM file is larger than [`PEM_FILE_LEN_MAX`].
    #[error("{path}: larger than {max_bytes} bytes")]
    PemTooLarge {
        /// The file.
        path: PathBuf,
        /// The bound.
        max_bytes: u64,
    },
    /// PEM input holds no usable item of the expected kind (`what`), or is malformed.
    #[error("no valid {what} in PEM input")]
    Pem {
        /// What was expected: "CA certificate", "node certificate" or "private key".
        what: &'static str,
    },
    /// A certificate or key could not be generated (a local bug, or an unsupported key).
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the configuration (for example a key that does not match its certificate).
    #[error("TLS configuration refused: {0}")]
    Tls(#[from] rustls::Error),
    /// The client-certificate verifier could not be built (for example an empty CA set).
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// The key derivation failed (a local bug: the output length is fixed).
    #[error("cluster CA key derivation failed")]
    Derive,
    /// The peer presented no certificate.
    #[error("peer presented no certificate")]
    NoPeerCertificate,
    /// The certificate could not be parsed.
    #[error("certificate could not be parsed: {0}")]
    Certificate(webpki::Error),
    /// The certificate names no node (no `n<id>.ratemesh.invalid` DNS name).
    #[error("certificate names no ratemesh node")]
    NoNodeName,
    /// The certificate names more than one node.
    #[error("certificate names more than one ratemesh node")]
    AmbiguousNodeName,
    /// The certificate names another node than the one expected.
    #[error("certificate names node {found:?}, expected {expected:?}")]
    NodeMismatch {
        /// The node that was expected.
        expected: NodeId,
        /// The node the certificate names.
        found: NodeId,
    },
    /// A certificate or key file named in the configuration is not usable; `source` says why.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why it is not usable.
        reason: Box<SecurityError>,
    },
    /// The private key is not the key of the node certificate.
    #[error("the private key does not match the node certificate")]
    KeyMismatch,
    /// The node certificate would be refused by the peers' handshakes (it does not chain to the
    /// cluster CA, has expired, or does not name the node); rustls' reason.
    #[error("the node certificate is not accepted by the cluster CA: {0}")]
    Untrusted(rustls::Error),
    /// A file to be written exists already (nothing is overwritten).
    #[error("{path} exists already; not overwriting")]
    FileExists {
        /// The file.
        path: PathBuf,
    },
    /// Too many node certificates requested in one call.
    #[error("{len} node certificates requested, at most {max} per call")]
    TooManyNodes {
        /// Requested.
        len: usize,
        /// The bound, [`CERT_FILES_NODES_MAX`].
        max: usize,
    },
}

/// The DNS name a node's certificate carries: `n<id>.ratemesh.invalid`.
pub fn node_dns_name(node: NodeId) -> String {
    format!("n{}{NODE_NAME_SUFFIX}", node.0)
}

/// The node a DNS name designates, if it is a node name in canonical form (`n`, decimal digits
/// without leading zeros, [`NODE_NAME_SUFFIX`]; ASCII case is ignored, as in DNS).
pub fn parse_node_dns_name(name: &str) -> Option<NodeId> {
    let name = name.to_ascii_lowercase();
    let digits = name.strip_suffix(NODE_NAME_SUFFIX)?.strip_prefix('n')?;
    let canonical = digits == "0" || !digits.starts_with('0');
    let all_digits = !digits.is_empty() && digits.len() <= NODE_ID_DIGITS_MAX;
    if !(canonical && all_digits && digits.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    digits.parse().ok().map(NodeId)
}

/// The node named by a peer's certificate chain (leaf first).
///
/// Call it only with a chain that rustls has verified against the cluster CA (the peer
/// certificates of a completed handshake): it checks names, not signatures.
pub fn peer_node_id(chain: &[CertificateDer<'_>]) -> Result<NodeId, SecurityError> {
    let leaf = chain.first().ok_or(SecurityError::NoPeerCertificate)?;
    let cert = webpki::EndEntityCert::try_from(leaf).map_err(SecurityError::Certificate)?;
    let mut found: Option<NodeId> = None;
    for node in cert.valid_dns_names().filter_map(parse_node_dns_name) {
        if found.is_some_and(|seen| seen != node) {
            return Err(SecurityError::AmbiguousNodeName);
        }
        found = Some(node);
    }
    let node = found.ok_or(SecurityError::NoNodeName)?;
    // Confirm with webpki's own name matching, as its docs require for a name decision.
    let name = server_name(node);
    cert.verify_is_valid_for_subject_name(&name).map_err(SecurityError::Certificate)?;
    Ok(node)
}

/// The admission rule: `Ok` only if the verified peer chain names exactly `expected`.
pub fn admit(expected: NodeId, chain: &[CertificateDer<'_>]) -> Result<(), SecurityError> {
    let found = peer_node_id(chain)?;
    if found != expected {
        return Err(SecurityError::NodeMismatch { expected, found });
    }
    Ok(())
}

/// The TLS server name under which a client reaches `node`.
pub fn server_name(node: NodeId) -> ServerName<'static> {
    // Invariant: `n<digits>.ratemesh.invalid` is a syntactically valid DNS name.
    ServerName::try_from(node_dns_name(node)).expect("node DNS names are valid server names")
}

/// A shared cluster secret (at least [`CLUSTER_SECRET_LEN_MIN`] bytes), and during a rotation
/// a second one that is accepted too ([`ClusterSecret::also_accepting`]). Zeroed on drop; its
/// `Debug` output never shows it.
#[derive(Clone)]
pub struct ClusterSecret {
    secret: Zeroizing<Vec<u8>>,
    accepted: Option<Zeroizing<Vec<u8>>>,
}

impl ClusterSecret {
    /// Accepts `secret` if it is long enough.
    pub fn new(secret: impl Into<String>) -> Result<Self, SecurityError> {
        let bytes = Zeroizing::new(secret.into().into_bytes());
        if bytes.len() < CLUSTER_SECRET_LEN_MIN {
            return Err(SecurityError::SecretTooShort {
                len_bytes: bytes.len(),
                min_bytes: CLUSTER_SECRET_LEN_MIN,
            });
        }
        Ok(Self { secret: bytes, accepted: None })
    }

    /// This secret, accepting `other` as well: gossip sealed under either opens, and (as a
    /// cluster secret) certificates from the CA of either are trusted. What this node sends and
    /// presents stays this secret's. A rotation from secret A to B is three rolling restarts:
    /// every node on A accepting B, then on B accepting A, then on B alone.
    #[must_use]
    pub fn also_accepting(mut self, other: ClusterSecret) -> Self {
        self.accepted = Some(other.secret);
        self
    }

    /// The secret's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.secret
    }

    /// The accepted secret's bytes, during a rotation.
    pub(crate) fn accepted_bytes(&self) -> Option<&[u8]> {
        self.accepted.as_deref().map(Vec::as_slice)
    }
}

/// The 32-byte Ed25519 seed of the cluster CA of `secret`: HKDF-SHA256(salt, secret, info).
fn ca_seed(secret: &[u8]) -> Result<Zeroizing<[u8; 32]>, SecurityError> {
    hkdf_sha256_32(CA_HKDF_SALT, secret, &[CA_HKDF_INFO])
}

/// 32 bytes of HKDF-SHA256 output.
pub(crate) fn hkdf_sha256_32(
    salt: &[u8],
    ikm: &[u8],
    info: &[&[u8]],
) -> Result<Zeroizing<[u8; 32]>, SecurityError> {
    use ring::hkdf;
    struct Len32;
    impl hkdf::KeyType for Len32 {
        fn len(&self) -> usize {
            32
        }
    }
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(ikm);
    let okm = prk.expand(info, Len32).map_err(|_| SecurityError::Derive)?;
    let mut out = Zeroizing::new([0_u8; 32]);
    okm.fill(&mut out[..]).map_err(|_| SecurityError::Derive)?;
    Ok(out)
}

/// A node's stateless-reset key material: stable across restarts of the same node when `ikm`
/// is (the cluster secret, or the node's provided private key), secret to everyone else.
fn reset_key_material(ikm: &[u8], node: NodeId) -> Result<Zeroizing<[u8; 32]>, SecurityError> {
    hkdf_sha256_32(RESET_HKDF_SALT, ikm, &[&node.0.to_be_bytes()])
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(<redacted>)")
    }
}

/// User-supplied certificates: the CA certificate(s) to trust, this node's certificate (chain,
/// leaf first) and its private key (PKCS#8, PKCS#1 or SEC1), all PEM; and the secret gossip is
/// sealed with (certificates give each member a key of its own, but gossip needs one that every
/// member shares: see [`crate::gossip`]).
#[derive(Clone, Debug)]
pub struct ProvidedCerts {
    /// The cluster CA certificate(s). During a CA rotation, both CAs.
    pub ca_cert: PemSource,
    /// This node's certificate, optionally followed by intermediates.
    pub node_cert: PemSource,
    /// This node's private key.
    pub node_key: PemSource,
    /// The secret that seals gossip (it keys nothing else in this mode).
    pub gossip_secret: ClusterSecret,
}

/// How a cluster is secured. Build a node's [`NodeIdentity`] with [`ClusterSecurity::identity`].
#[derive(Clone, Debug)]
pub enum ClusterSecurity {
    /// Every node derives the same CA from the secret and issues its own certificate.
    Secret(ClusterSecret),
    /// Certificates made beforehand (see [`write_cert_files`]).
    Provided(ProvidedCerts),
}

impl ClusterSecurity {
    /// Shared-secret mode from a secret string (a typed error if it is too short).
    pub fn from_secret(secret: impl Into<String>) -> Result<Self, SecurityError> {
        ClusterSecret::new(secret).map(Self::Secret)
    }

    /// The identity `node` presents and the CA it trusts. In `Provided` mode the certificate
    /// must name `node` ([`SecurityError::NodeMismatch`] otherwise).
    pub fn identity(&self, node: NodeId) -> Result<NodeIdentity, SecurityError> {
        match self {
            Self::Secret(secret) => {
                let mut identity = ClusterCa::derive(secret)?.issue(node)?;
                identity.reset_key = reset_key_material(secret.bytes(), node)?;
                if let Some(accepted) = secret.accepted_bytes() {
                    identity.ca_certs.push(ClusterCa::derive_from(accepted)?.cert_der);
                }
                Ok(identity)
            }
            Self::Provided(certs) => certs.identity(node),
        }
    }

    /// [`ClusterSecurity::identity`], and in `Provided` mode the chain checked as the peers'
    /// handshakes will check it ([`NodeIdentity::check_chain`]): what `ratemeshd validate` and a
    /// daemon's start check, so that certificates the peers would refuse stop the start instead
    /// of every handshake. (A node built with the library is not held to it: its handshakes
    /// refuse what does not chain.)
    pub fn checked_identity(&self, node: NodeId) -> Result<NodeIdentity, SecurityError> {
        let identity = self.identity(node)?;
        if let Self::Provided(certs) = self {
            in_file(&certs.node_cert, identity.check_chain())?;
        }
        Ok(identity)
    }
}

impl ProvidedCerts {
    /// `node`'s identity from these certificates: each file read (at most [`PEM_FILE_LEN_MAX`]
    /// bytes) and parsed, the leaf naming `node`, the key matching the leaf. An error about a
    /// file's content is [`SecurityError::File`], naming it (one reading it names it already).
    /// [`ClusterSecurity::checked_identity`] checks the chain too.
    pub fn identity(&self, node: NodeId) -> Result<NodeIdentity, SecurityError> {
        let ca_pem = in_file(&self.ca_cert, self.ca_cert.load())?;
        let cert_pem = in_file(&self.node_cert, self.node_cert.load())?;
        let key_pem = in_file(&self.node_key, self.node_key.load())?;
        let ca_certs = in_file(&self.ca_cert, identity::parse_certs(&ca_pem, "CA certificate"))?;
        let chain = in_file(&self.node_cert, identity::parse_certs(&cert_pem, "node certificate"))?;
        let key = in_file(&self.node_key, identity::parse_key(&key_pem))?;
        let identity = in_file(&self.node_cert, NodeIdentity::from_parts(node, ca_certs, chain, key))?;
        in_file(&self.node_key, identity.check_key())?;
        Ok(identity)
    }
}

/// `result`, its error naming `source`'s file when it is one.
fn in_file<T>(source: &PemSource, result: Result<T, SecurityError>) -> Result<T, SecurityError> {
    result.map_err(|error| match source {
        PemSource::Path(path)
            if !matches!(error, SecurityError::Io { .. } | SecurityError::PemTooLarge { .. }) =>
        {
            SecurityError::File { path: path.clone(), reason: Box::new(error) }
        }
        _ => error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "correct horse battery staple";

    #[test]
    fn deriving_the_ca_twice_gives_identical_bytes() {
        let secret = ClusterSecret::new(SECRET).expect("long enough");
        let first = ClusterCa::derive(&secret).expect("derive");
        let second = ClusterCa::derive(&secret).expect("derive");
        assert_eq!(first.cert_der(), second.cert_der());
        assert_eq!(*first.key_pem(), *second.key_pem());
    }

    #[test]
    fn node_names_round_trip_and_reject_non_canonical_forms() {
        for id in [0, 1, 7, 42, u64::MAX] {
            assert_eq!(parse_node_dns_name(&node_dns_name(NodeId(id))), Some(NodeId(id)));
        }
        assert_eq!(parse_node_dns_name("N7.RateMesh.Invalid"), Some(NodeId(7)));
        for bad in [
            "n07.ratemesh.invalid",
            "n.ratemesh.invalid",
            "n+7.ratemesh.invalid",
            "7.ratemesh.invalid",
            "n7.ratemesh.example",
            "n18446744073709551616.ratemesh.invalid",
            "xn7.ratemesh.invalid",
        ] {
            assert_eq!(parse_node_dns_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn issued_certificate_names_its_node_and_round_trips_through_pem() {
        let ca = ClusterCa::derive(&ClusterSecret::new(SECRET).expect("long enough")).expect("derive");
        let identity = ca.issue(NodeId(7)).expect("issue");
        assert_eq!(peer_node_id(&identity.chain).expect("named"), NodeId(7));
        let again = NodeIdentity::from_pem(
            NodeId(7),
            ca.cert_pem().as_bytes(),
            identity.cert_pem().as_bytes(),
            identity.key_pem().as_bytes(),
        )
        .expect("PEM round trip");
        assert_eq!(again.chain, identity.chain);
        let wrong = NodeIdentity::from_pem(
            NodeId(8),
            ca.cert_pem().as_bytes(),
            identity.cert_pem().as_bytes(),
            identity.key_pem().as_bytes(),
        );
        assert!(matches!(wrong, Err(SecurityError::NodeMismatch { expected: NodeId(8), found: NodeId(7) })));
    }

    #[test]
    fn during_a_rotation_both_secrets_cas_are_trusted_and_the_current_one_issues() {
        let old = ClusterSecret::new("the old secret, sixteen bytes+").expect("long enough");
        let new = ClusterSecret::new("the new secret, sixteen bytes+").expect("long enough");
        let (old_ca, new_ca) =
            (ClusterCa::derive(&old).expect("derive"), ClusterCa::derive(&new).expect("derive"));
        let rotating =
            ClusterSecurity::Secret(new.also_accepting(old)).identity(NodeId(3)).expect("identity");
        assert_eq!(rotating.ca_certs(), [new_ca.cert_der().clone(), old_ca.cert_der().clone()]);
        // Its own certificate is the current secret's: it chains to the new CA, not to the old.
        let leaf = webpki::EndEntityCert::try_from(&rotating.chain[0]).expect("parses");
        let chains_to = |ca: &ClusterCa| {
            let anchor = webpki::anchor_from_trusted_cert(ca.cert_der()).expect("anchor");
            leaf.verify_for_usage(
                rustls::crypto::ring::default_provider().signature_verification_algorithms.all,
                &[anchor],
                &[],
                rustls_pki_types::UnixTime::now(),
                webpki::KeyUsage::server_auth(),
                None,
                None,
            )
            .is_ok()
        };
        assert!(chains_to(&new_ca));
        assert!(!chains_to(&old_ca));
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let secret = ClusterSecurity::from_secret(SECRET).expect("long enough");
        assert!(!format!("{secret:?}").contains("horse"));
    }
}
