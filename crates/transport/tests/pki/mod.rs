//! Test certificate authorities and certificates, made with rcgen and written as PEM files to a
//! directory of the test's own.

// Each test file uses a part of this.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use cairn_transport::TlsFiles;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

/// A fresh directory under the system's temporary one, emptied first.
pub fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cairn-tls-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("a temporary directory");
    d
}

/// A certificate authority whose certificate is `<dir>/<name>-ca.pem`.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
    name: String,
}

impl Ca {
    pub fn new(dir: &Path, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, format!("{name} test CA"));
        let key = KeyPair::generate().expect("a CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("a self-signed CA");
        std::fs::write(dir.join(format!("{name}-ca.pem")), issuer.pem()).expect("write the CA");
        Ca { issuer, dir: dir.to_path_buf(), name: name.to_string() }
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// A certificate for `localhost` and 127.0.0.1, good for servers and clients, with `cn` as
    /// its Common Name, written to `<file>.pem` and `<file>-key.pem`; returns both paths.
    pub fn issue(&self, file: &str, cn: &str) -> (PathBuf, PathBuf) {
        self.issue_for(file, cn, &["localhost", "127.0.0.1"])
    }

    /// [`Ca::issue`] for these subject alternative names (DNS names or IP addresses).
    pub fn issue_for(&self, file: &str, cn: &str, sans: &[&str]) -> (PathBuf, PathBuf) {
        self.leaf(file, cn, sans, None)
    }

    /// [`Ca::issue`] with this serial number, to revoke it by ([`Ca::crl`]).
    pub fn issue_serial(&self, file: &str, cn: &str, serial: u64) -> (PathBuf, PathBuf) {
        self.leaf(file, cn, &["localhost", "127.0.0.1"], Some(serial))
    }

    /// A revocation list of this CA revoking `serials`, written to `<file>.pem`.
    pub fn crl(&self, file: &str, serials: &[u64]) -> PathBuf {
        let revoked = |serial: &u64| rcgen::RevokedCertParams {
            serial_number: rcgen::SerialNumber::from(*serial),
            revocation_time: rcgen::date_time_ymd(2025, 1, 1),
            reason_code: Some(rcgen::RevocationReason::KeyCompromise),
            invalidity_date: None,
        };
        let params = rcgen::CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2025, 1, 1),
            next_update: rcgen::date_time_ymd(2099, 1, 1),
            crl_number: rcgen::SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: serials.iter().map(revoked).collect(),
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        };
        let crl = params.signed_by(&self.issuer).expect("a signed CRL");
        let path = self.dir.join(format!("{file}.pem"));
        std::fs::write(&path, crl.pem().expect("PEM")).expect("write the CRL");
        path
    }

    fn leaf(&self, file: &str, cn: &str, sans: &[&str], serial: Option<u64>) -> (PathBuf, PathBuf) {
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).expect("leaf params");
        params.serial_number = serial.map(rcgen::SerialNumber::from);
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().expect("a leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("a signed leaf");
        let (cert_file, key_file) =
            (self.dir.join(format!("{file}.pem")), self.dir.join(format!("{file}-key.pem")));
        std::fs::write(&cert_file, cert.pem()).expect("write the certificate");
        std::fs::write(&key_file, key.serialize_pem()).expect("write the key");
        (cert_file, key_file)
    }

    /// A certificate of this CA (see [`Ca::issue`]) that trusts this CA and, with
    /// `verify_clients`, requires certificates of it.
    pub fn files(&self, file: &str, cn: &str, verify_clients: bool) -> TlsFiles {
        let (cert_file, key_file) = self.issue(file, cn);
        TlsFiles {
            cert_file,
            key_file,
            trusted_ca_file: Some(self.ca_file()),
            client_cert_auth: verify_clients,
            ..TlsFiles::default()
        }
    }
}
