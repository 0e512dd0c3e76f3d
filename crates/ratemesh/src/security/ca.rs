//! [`ClusterCa`]: the cluster's certificate authority, derived from a secret or loaded, and
//! the certificates it issues.

use std::fmt;

use ratemesh_core::NodeId;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, PKCS_ED25519, SerialNumber,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use zeroize::Zeroizing;

use super::{
    CA_COMMON_NAME, CA_ORGANIZATION, CA_SERIAL, ClusterSecret, ED25519_PKCS8_V1_PREFIX, NodeIdentity,
    SecurityError, VALIDITY_FROM_YMD, VALIDITY_UNTIL_YMD, ca_seed, node_dns_name, reset_key_material,
};

/// A cluster certificate authority: its certificate and signing key.
pub struct ClusterCa {
    params: CertificateParams,
    key: KeyPair,
    pub(super) cert_der: CertificateDer<'static>,
}

impl ClusterCa {
    /// The CA every holder of `secret` derives: identical bytes on every node and every run.
    pub fn derive(secret: &ClusterSecret) -> Result<Self, SecurityError> {
        Self::derive_from(secret.bytes())
    }

    pub(super) fn derive_from(secret: &[u8]) -> Result<Self, SecurityError> {
        let seed = ca_seed(secret)?;
        let mut pkcs8 = Zeroizing::new(Vec::with_capacity(ED25519_PKCS8_V1_PREFIX.len() + seed.len()));
        pkcs8.extend_from_slice(&ED25519_PKCS8_V1_PREFIX);
        pkcs8.extend_from_slice(&seed[..]);
        let der = PrivatePkcs8KeyDer::from(pkcs8.as_slice());
        let key = KeyPair::from_pkcs8_der_and_sign_algo(&der, &PKCS_ED25519)?;
        Self::self_signed(key, Some(SerialNumber::from_slice(CA_SERIAL)))
    }

    /// A new CA with a random key (OS randomness), for certificates made once and distributed.
    pub fn generate() -> Result<Self, SecurityError> {
        Self::self_signed(KeyPair::generate_for(&PKCS_ED25519)?, None)
    }

    fn self_signed(key: KeyPair, serial: Option<SerialNumber>) -> Result<Self, SecurityError> {
        let mut params = CertificateParams::default();
        let mut subject = DistinguishedName::new();
        subject.push(DnType::CommonName, CA_COMMON_NAME);
        subject.push(DnType::OrganizationName, CA_ORGANIZATION);
        params.distinguished_name = subject;
        params.serial_number = serial;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        set_validity(&mut params);
        let cert_der = params.self_signed(&key)?.der().clone();
        Ok(Self { params, key, cert_der })
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        pem_encode("CERTIFICATE", &self.cert_der)
    }

    /// The CA's private key, PEM (PKCS#8). Secret: write it only to a protected file.
    pub fn key_pem(&self) -> Zeroizing<String> {
        Zeroizing::new(self.key.serialize_pem())
    }

    /// Issues a certificate naming `node` for a fresh key (OS randomness), valid for both server
    /// and client authentication.
    pub fn issue(&self, node: NodeId) -> Result<NodeIdentity, SecurityError> {
        let name = node_dns_name(node);
        let mut params = CertificateParams::new(vec![name.clone()])?;
        let mut subject = DistinguishedName::new();
        subject.push(DnType::CommonName, name);
        params.distinguished_name = subject;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params);
        let key = KeyPair::generate_for(&PKCS_ED25519)?;
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer)?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok(NodeIdentity {
            node,
            ca_certs: vec![self.cert_der.clone()],
            chain: vec![cert.der().clone()],
            reset_key: reset_key_material(key_der.secret_der(), node)?,
            key: key_der,
        })
    }
}

impl fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterCa").field("cert_len_bytes", &self.cert_der.len()).finish_non_exhaustive()
    }
}

fn set_validity(params: &mut CertificateParams) {
    let (year, month, day) = VALIDITY_FROM_YMD;
    params.not_before = rcgen::date_time_ymd(year, month, day);
    let (year, month, day) = VALIDITY_UNTIL_YMD;
    params.not_after = rcgen::date_time_ymd(year, month, day);
}

/// PEM with `\n` line endings and 64-column lines (RFC 7468).
pub(super) fn pem_encode(label: &str, der: &[u8]) -> String {
    let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    pem::encode_config(&pem::Pem::new(label, der), config)
}
