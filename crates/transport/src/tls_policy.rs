//! etcd's `--cipher-suites`, `--tls-min-version` and `--tls-max-version`, as rustls settings.
//!
//! The flags are read as etcd reads them (`tlsutil.GetCipherSuites`, `GetTLSVersion` and the
//! checks of `embed.Config.Validate`), with etcd's error messages. They apply to the client and
//! the peer listeners and to the peers this member dials, as in etcd.
//!
//! Cipher suites name Go's suites, in order of preference. As in Go, they choose among the
//! TLS 1.2 suites only: TLS 1.3's are not configurable, and naming one is accepted and changes
//! nothing. rustls offers only the forward-secret AEAD suites (ECDHE with AES-GCM or
//! ChaCha20-Poly1305); Go also knows CBC, RC4, 3DES and static-RSA suites, and naming one of
//! those is refused with a message that says so, rather than silently left out.

use std::sync::Arc;

use rustls::crypto::ring::cipher_suite as suite;
use rustls::crypto::CryptoProvider;
use rustls::{SupportedCipherSuite, SupportedProtocolVersion};

/// A TLS protocol version etcd's flags name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    /// "TLS1.2", etcd's default minimum.
    #[default]
    Tls12,
    /// "TLS1.3".
    Tls13,
}

/// Which TLS versions and cipher suites the listeners and dialers use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsPolicy {
    /// The TLS 1.2 suites' codes, most preferred first; empty: rustls's defaults.
    tls12_suites: Vec<rustls::CipherSuite>,
    min: TlsVersion,
    /// None: the highest rustls has.
    max: Option<TlsVersion>,
}

/// Go's TLS 1.2 suites that rustls has, by Go's names (and the short ChaCha20 names etcd also
/// accepts).
const TLS12: &[(&str, SupportedCipherSuite)] = &[
    ("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256),
    ("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384),
    ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256),
    ("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", suite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        suite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305", suite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256),
];

/// Go's TLS 1.3 suites: accepted, and always on.
const TLS13: &[&str] =
    &["TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"];

/// Suites Go knows and rustls does not implement (CBC, RC4, 3DES, static RSA key exchange).
const UNSUPPORTED: &[&str] = &[
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
];

fn version(flag: &str) -> Result<Option<TlsVersion>, String> {
    match flag {
        "" => Ok(None),
        "TLS1.2" => Ok(Some(TlsVersion::Tls12)),
        "TLS1.3" => Ok(Some(TlsVersion::Tls13)),
        other => Err(format!("unexpected TLS version {other:?} (must be one of: TLS1.2, TLS1.3)")),
    }
}

impl TlsPolicy {
    /// The policy etcd's flags describe: `--cipher-suites` (Go's names), `--tls-min-version`
    /// and `--tls-max-version` ("" for the defaults: TLS 1.2 up to the highest). The errors
    /// are etcd's words.
    pub fn parse(suites: &[String], min: &str, max: &str) -> Result<TlsPolicy, String> {
        let min = version(min)?.unwrap_or_default();
        let max = version(max)?;
        if let Some(max) = max.filter(|m| *m < min) {
            let name = |v: TlsVersion| if v == TlsVersion::Tls12 { "TLS1.2" } else { "TLS1.3" };
            return Err(format!(
                "min version ({}) is greater than max version ({})",
                name(min),
                name(max)
            ));
        }
        if min == TlsVersion::Tls13 && !suites.is_empty() {
            return Err("cipher suites cannot be configured when only TLS1.3 is enabled".into());
        }
        let mut tls12_suites = Vec::new();
        for name in suites.iter().map(|s| s.trim()) {
            if let Some((_, s)) = TLS12.iter().find(|(n, _)| *n == name) {
                if !tls12_suites.contains(&s.suite()) {
                    tls12_suites.push(s.suite());
                }
            } else if UNSUPPORTED.contains(&name) {
                return Err(format!(
                    "TLS cipher suite {name:?} is not supported by cairn (rustls offers only ECDHE \
                     with AES-GCM or ChaCha20-Poly1305)"
                ));
            } else if !TLS13.contains(&name) {
                return Err(format!("unexpected TLS cipher suite {name:?}"));
            }
        }
        Ok(TlsPolicy { tls12_suites, min, max })
    }

    /// The crypto provider: ring's, limited to the chosen TLS 1.2 suites (TLS 1.3's all kept).
    pub(crate) fn provider(&self) -> Arc<CryptoProvider> {
        let mut p = rustls::crypto::ring::default_provider();
        if !self.tls12_suites.is_empty() {
            let tls13 = p.cipher_suites.iter().filter(|s| s.tls13().is_some()).copied();
            let chosen = self
                .tls12_suites
                .iter()
                .filter_map(|code| TLS12.iter().map(|(_, s)| *s).find(|s| s.suite() == *code));
            p.cipher_suites = tls13.chain(chosen).collect();
        }
        Arc::new(p)
    }

    /// The protocol versions to offer and accept.
    pub(crate) fn versions(&self) -> Vec<&'static SupportedProtocolVersion> {
        let max = self.max.unwrap_or(TlsVersion::Tls13);
        let mut v = Vec::new();
        if self.min <= TlsVersion::Tls12 && max >= TlsVersion::Tls12 {
            v.push(&rustls::version::TLS12);
        }
        if max >= TlsVersion::Tls13 {
            v.push(&rustls::version::TLS13);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(suites: &[&str], min: &str, max: &str) -> Result<TlsPolicy, String> {
        let suites: Vec<String> = suites.iter().map(|s| s.to_string()).collect();
        TlsPolicy::parse(&suites, min, max)
    }

    #[test]
    fn etcds_flags_and_words() {
        let p = parse(&[], "", "").expect("defaults");
        assert_eq!(p.versions().len(), 2);
        assert_eq!(parse(&[], "TLS1.3", "").expect("1.3 only").versions().len(), 1);
        assert_eq!(parse(&[], "TLS1.2", "TLS1.2").expect("1.2 only").versions().len(), 1);
        assert_eq!(
            parse(&[], "TLS1.1", ""),
            Err(r#"unexpected TLS version "TLS1.1" (must be one of: TLS1.2, TLS1.3)"#.into())
        );
        assert_eq!(
            parse(&[], "TLS1.3", "TLS1.2"),
            Err("min version (TLS1.3) is greater than max version (TLS1.2)".into())
        );
        let gcm = "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384";
        assert_eq!(
            parse(&[gcm], "TLS1.3", ""),
            Err("cipher suites cannot be configured when only TLS1.3 is enabled".into())
        );
        assert_eq!(
            parse(&["TLS_BOGUS"], "", ""),
            Err(r#"unexpected TLS cipher suite "TLS_BOGUS""#.into())
        );
        let cbc = parse(&["TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"], "", "").expect_err("CBC");
        assert!(cbc.contains("not supported by cairn"), "{cbc}");
        // Chosen TLS 1.2 suites in order, TLS 1.3's kept, a 1.3 name accepted and ignored.
        let p =
            parse(&["TLS_AES_128_GCM_SHA256", gcm, "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305"], "", "")
                .expect("suites");
        let provider = p.provider();
        let tls12: Vec<_> = provider.cipher_suites.iter().filter(|s| s.tls13().is_none()).collect();
        assert_eq!(tls12.len(), 2);
        assert_eq!(*tls12[0], suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384);
        assert_eq!(provider.cipher_suites.iter().filter(|s| s.tls13().is_some()).count(), 3);
    }
}
