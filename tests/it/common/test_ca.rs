// A CA made at test time (its PEM file in a temp dir) and the TLS config of a server whose
// certificate it signed for `localhost` and 127.0.0.1. The upstream client's unit tests and
// the proxy's TLS tests each `include!` it into a module `test_ca` of their own.

use std::path::PathBuf;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::PrivateKeyDer;

pub struct TestCa {
    /// Where `ca_file` is, for the tests' other files.
    pub dir: tempfile::TempDir,
    pub ca_file: PathBuf,
    pub server: Arc<rustls::ServerConfig>,
}

/// A CA named `name` and a server certificate it signed.
pub fn test_ca(name: &str) -> TestCa {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name.push(DnType::CommonName, name);
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let leaf =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("fleet-ca.pem");
    std::fs::write(&ca_file, ca_cert.pem()).unwrap();
    let key = PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap();
    let server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![leaf_cert.der().clone()], key)
    .unwrap();
    TestCa {
        dir,
        ca_file,
        server: Arc::new(server),
    }
}
