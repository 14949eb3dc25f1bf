//! TLS as etcd's certificate flags describe it (`--cert-file`, `--key-file`,
//! `--trusted-ca-file`, `--client-cert-auth`, and their `--peer-` twins), with rustls.
//!
//! The files are read again when they change, as etcd reads them on every handshake: a
//! certificate replaced on disk is served to the next connection without a restart. Looking at
//! the files' metadata on every handshake would cost a few syscalls per connection, so it is done
//! at most once a [`RELOAD_CHECK`]. A new pair that does not load (a key written before its
//! certificate, a truncated file) is logged and the previous pair kept, so a half-finished
//! rotation never takes the listener down.

use std::fmt;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};

pub use crate::tls_policy::{TlsPolicy, TlsVersion};

/// Files are looked at for changes at most this often.
pub const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// One side's certificate files, as etcd's flags name them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// `--cert-file` (PEM: the certificate, then any intermediates).
    pub cert_file: PathBuf,
    /// `--key-file` (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// `--trusted-ca-file`: the CAs that sign the other side's certificates. As in etcd 3.5, a
    /// listener given one requires a certificate of every client.
    pub trusted_ca_file: Option<PathBuf>,
    /// `--client-cert-auth`: require and verify a client certificate (against the trusted CA
    /// file, or the system's roots without one).
    pub client_cert_auth: bool,
    /// `--client-crl-file` / `--peer-crl-file`: a certificate revocation list (PEM or DER); a
    /// listener refuses client certificates it revokes. Read again when it changes, as the
    /// certificates are.
    pub crl_file: Option<PathBuf>,
    /// `--cipher-suites`, `--tls-min-version` and `--tls-max-version`.
    pub policy: TlsPolicy,
    /// `--peer-cert-allowed-cn`: the other side's certificate must have one of these Common
    /// Names (checked both ways, as etcd's shared TLS configuration does).
    pub allowed_cns: Vec<String>,
    /// `--peer-cert-allowed-hostname` / `--client-cert-allowed-hostname`: the other side's
    /// certificate must be valid for one of these names or addresses.
    pub allowed_hostnames: Vec<String>,
}

/// Why a set of certificate files cannot be used. The messages follow Go's and etcd's, which
/// operators moving from etcd will search for.
#[derive(Clone, Debug)]
pub enum TlsError {
    /// A file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: Arc<io::Error>,
    },
    /// A file holds no PEM block of the kind needed.
    NoPem {
        /// The file.
        path: PathBuf,
        /// "certificate" or "private key".
        what: &'static str,
    },
    /// The private key is not the certificate's.
    KeyMismatch {
        /// `--cert-file`.
        cert: PathBuf,
        /// `--key-file`.
        key: PathBuf,
    },
    /// rustls refused what the files hold (an unsupported key type, a malformed CA).
    Invalid {
        /// The file or files concerned.
        what: String,
        /// rustls's reason.
        source: rustls::Error,
    },
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsError::Read { path, source } => write!(f, "open {}: {source}", path.display()),
            TlsError::NoPem { path, what } => {
                write!(f, "tls: failed to find any PEM data in {what} input ({})", path.display())
            }
            TlsError::KeyMismatch { cert, key } => write!(
                f,
                "tls: private key does not match public key (--cert-file {}, --key-file {})",
                cert.display(),
                key.display()
            ),
            TlsError::Invalid { what, source } => write!(f, "tls: {what}: {source}"),
        }
    }
}

impl std::error::Error for TlsError {}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Read { path: path.into(), source: Arc::new(e) })
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem).filter_map(Result::ok).collect();
    if certs.is_empty() {
        return Err(TlsError::NoPem { path: path.into(), what: "certificate" });
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|_| TlsError::NoPem { path: path.into(), what: "private key" })
}

/// The revocation lists in `path`: PEM blocks, or one DER list (as Go's parser takes both).
fn crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let data = read(path)?;
    let pem: Vec<_> =
        CertificateRevocationListDer::pem_slice_iter(&data).filter_map(Result::ok).collect();
    if !pem.is_empty() {
        return Ok(pem);
    }
    if data.first() == Some(&0x30) {
        return Ok(vec![CertificateRevocationListDer::from(data)]);
    }
    Err(TlsError::NoPem { path: path.into(), what: "certificate revocation list" })
}

/// The CAs in `ca_file`, or the system's roots without one (as Go uses them).
fn roots(ca_file: Option<&Path>) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for cert in certs(path)? {
                store.add(cert).map_err(|source| TlsError::Invalid {
                    what: format!("a CA in {}", path.display()),
                    source,
                })?;
            }
        }
        None => {
            store.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    Ok(store)
}

fn mismatch(files: &TlsFiles, source: rustls::Error) -> TlsError {
    match source {
        rustls::Error::InconsistentKeys(_) => {
            TlsError::KeyMismatch { cert: files.cert_file.clone(), key: files.key_file.clone() }
        }
        source => TlsError::Invalid {
            what: format!("{} and {}", files.cert_file.display(), files.key_file.display()),
            source,
        },
    }
}

impl TlsFiles {
    /// A listener's configuration, offering `alpn` (most preferred first).
    pub fn server_config(&self, alpn: &[&[u8]]) -> Result<ServerConfig, TlsError> {
        let chain = certs(&self.cert_file)?;
        let key = key(&self.key_file)?;
        let provider = self.policy.provider();
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&self.policy.versions())
            .map_err(|source| TlsError::Invalid { what: "protocol versions".into(), source })?;
        let builder = if self.client_cert_auth || self.trusted_ca_file.is_some() {
            let roots = Arc::new(roots(self.trusted_ca_file.as_deref())?);
            let mut verifier = WebPkiClientVerifier::builder_with_provider(roots, provider);
            if let Some(path) = &self.crl_file {
                // As etcd's check, which looks only for the certificate's serial in the list:
                // a certificate whose issuer has no list here is not refused for that.
                verifier = verifier.with_crls(crls(path)?).allow_unknown_revocation_status();
            }
            let verifier = verifier.build().map_err(|e| TlsError::Invalid {
                what: "the trusted CA file".into(),
                source: rustls::Error::General(e.to_string()),
            })?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let mut cfg = builder.with_single_cert(chain, key).map_err(|e| mismatch(self, e))?;
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(cfg)
    }

    /// A dialing side's configuration: it verifies servers against the trusted CA file (or the
    /// system's roots) and presents this certificate to those that ask for one, as etcd's peers
    /// present `--peer-cert-file`.
    pub fn client_config(&self) -> Result<ClientConfig, TlsError> {
        let chain = certs(&self.cert_file)?;
        let key = key(&self.key_file)?;
        let roots = roots(self.trusted_ca_file.as_deref())?;
        ClientConfig::builder_with_provider(self.policy.provider())
            .with_protocol_versions(&self.policy.versions())
            .map_err(|source| TlsError::Invalid { what: "protocol versions".into(), source })?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| mismatch(self, e))
    }

    /// etcd's check of the other side's certificate against the allowed Common Names or host
    /// names (none given: any certificate the CA signed). With names given, a side that shows
    /// no certificate fails too, as in etcd. The error is etcd's words and what was wrong.
    pub fn check_allowed(&self, cert: Option<&CertificateDer<'_>>) -> Result<(), String> {
        if self.allowed_cns.is_empty() && self.allowed_hostnames.is_empty() {
            return Ok(());
        }
        let fail = |why: String| Err(format!("client certificate authentication failed: {why}"));
        let Some(cert) = cert else { return fail("no certificate".into()) };
        if !self.allowed_cns.is_empty() {
            let cn = common_name(cert).unwrap_or_default();
            if !self.allowed_cns.contains(&cn) {
                return fail(format!("CommonName {cn:?} is not one of {:?}", self.allowed_cns));
            }
        }
        if !self.allowed_hostnames.is_empty()
            && !self.allowed_hostnames.iter().any(|h| crate::san::valid_for(cert, h))
        {
            return fail(format!("not valid for any of {:?}", self.allowed_hostnames));
        }
        Ok(())
    }

    /// What identifies the files' current contents without reading them.
    fn stamps(&self) -> Vec<Option<(i64, i64, u64, u64)>> {
        let files = [
            Some(&self.cert_file),
            Some(&self.key_file),
            self.trusted_ca_file.as_ref(),
            self.crl_file.as_ref(),
        ];
        files
            .into_iter()
            .flatten()
            .map(|p| {
                let m = std::fs::metadata(p).ok()?;
                Some((m.mtime(), m.mtime_nsec(), m.ino(), m.len()))
            })
            .collect()
    }
}

type Build<C> = Box<dyn Fn(&TlsFiles) -> Result<C, TlsError> + Send + Sync>;

/// A configuration built from files, built again when they change.
struct Reloading<C> {
    files: TlsFiles,
    build: Build<C>,
    state: Mutex<State<C>>,
}

struct State<C> {
    current: Arc<C>,
    stamps: Vec<Option<(i64, i64, u64, u64)>>,
    checked: Instant,
}

impl<C> Reloading<C> {
    fn new(files: TlsFiles, build: Build<C>) -> Result<Reloading<C>, TlsError> {
        let stamps = files.stamps();
        let current = Arc::new(build(&files)?);
        let state = Mutex::new(State { current, stamps, checked: Instant::now() });
        Ok(Reloading { files, build, state })
    }

    fn current(&self) -> Arc<C> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.checked.elapsed() >= RELOAD_CHECK {
            state.checked = Instant::now();
            let stamps = self.files.stamps();
            if stamps != state.stamps {
                // Recorded even when the build fails: the same broken files are not tried again
                // every second, and the next write to any of them is.
                state.stamps = stamps;
                match (self.build)(&self.files) {
                    Ok(c) => {
                        tracing::info!(cert = %self.files.cert_file.display(), "reloaded TLS certificate files");
                        state.current = Arc::new(c);
                    }
                    Err(e) => tracing::warn!("keeping the previous TLS certificate: {e}"),
                }
            }
        }
        state.current.clone()
    }
}

/// A listener's TLS: a fresh acceptor for each connection, from the files as they are now.
pub struct ServerTls(Reloading<ServerConfig>);

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls").field("files", &self.0.files).finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads `files` (the errors are the start's), offering `alpn` to clients.
    pub fn new(files: TlsFiles, alpn: &[&[u8]]) -> Result<ServerTls, TlsError> {
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let build: Build<ServerConfig> = Box::new(move |files: &TlsFiles| {
            let protocols: Vec<&[u8]> = alpn.iter().map(Vec::as_slice).collect();
            files.server_config(&protocols)
        });
        Ok(ServerTls(Reloading::new(files, build)?))
    }

    /// The acceptor for the next connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.0.current())
    }

    /// [`TlsFiles::check_allowed`] for a caller that showed `cert`.
    pub fn check_allowed(&self, cert: Option<&CertificateDer<'_>>) -> Result<(), String> {
        self.0.files.check_allowed(cert)
    }

    /// Whether clients must present a certificate.
    pub fn verifies_clients(&self) -> bool {
        self.0.files.client_cert_auth || self.0.files.trusted_ca_file.is_some()
    }
}

/// A dialing side's TLS, reloaded as [`ServerTls`] is.
pub struct ClientTls(Reloading<ClientConfig>);

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls").field("files", &self.0.files).finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Loads `files` (the errors are the start's).
    pub fn new(files: TlsFiles) -> Result<ClientTls, TlsError> {
        Ok(ClientTls(Reloading::new(files, Box::new(TlsFiles::client_config))?))
    }

    /// [`TlsFiles::check_allowed`] for a server that showed `cert`.
    pub fn check_allowed(&self, cert: Option<&CertificateDer<'_>>) -> Result<(), String> {
        self.0.files.check_allowed(cert)
    }

    /// The connector for the next connection.
    pub fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(self.0.current())
    }
}

/// The Common Name of a certificate's subject (the first, if it has several): etcd's identity
/// for a client that presents a verified certificate.
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed.subject().iter_common_name().next()?.as_str().ok()?;
    Some(cn.to_string())
}
