//! etcd's `--auth-token`: `simple` (random tokens kept by the member that issued them, the
//! engine's), `jwt,...` (signed tokens any member with the same key checks, without asking the
//! others), or the empty string (no token is ever issued or accepted).
//!
//! The option string is parsed as etcd's `NewTokenProvider` parses it (`server/auth/store.go`,
//! `jwt.go`, `options.go`): `jwt,pub-key=PATH,priv-key=PATH,sign-method=RS256,ttl=5m`, every
//! option `key=value`, none twice. A token's claims are etcd's (`username`, `revision`, `exp`),
//! so tokens pass between cairn and etcd members that share the keys. Signing and checking are
//! `jsonwebtoken`'s, over ring (no OpenSSL), except ES512's (P-521, which neither has):
//! `jwt_es512.rs`, with RustCrypto's `p521`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use ring::signature::KeyPair;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivateKeyDer;

#[path = "jwt_es512.rs"]
mod es512;
use es512::Es512;

/// etcd's default lifetime of a JWT token.
const DEFAULT_TTL: Duration = Duration::from_secs(5 * 60);

/// How this member issues and checks auth tokens (`--auth-token`).
#[derive(Clone, Debug, Default)]
pub enum AuthToken {
    /// etcd's default: random tokens held by the member that issued them.
    #[default]
    Simple,
    /// Signed tokens.
    Jwt(Arc<Jwt>),
    /// `--auth-token ""`: etcd's no-op provider; Authenticate fails, every token is refused.
    Nop,
}

/// Why an `--auth-token` value was refused, in etcd's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthTokenError {
    /// etcd's `ErrInvalidAuthOpts`, with what was wrong (etcd logs it beside).
    InvalidAuthOpts(String),
    /// etcd's `ErrMissingKey`: no key for the sign method.
    MissingKey,
    /// etcd's `ErrKeyMismatch`: the public key does not check the private key's signatures.
    KeyMismatch,
    /// A sign method etcd or cairn cannot use with a key.
    UnsupportedMethod(String),
    /// A key file that does not hold a key of the sign method's kind.
    BadKey {
        /// The option that named it (`pub-key` or `priv-key`).
        option: &'static str,
        /// Why.
        why: String,
    },
}

impl fmt::Display for AuthTokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthTokenError::InvalidAuthOpts(why) => write!(f, "auth: invalid auth options ({why})"),
            AuthTokenError::MissingKey => f.write_str("auth: missing key data"),
            AuthTokenError::KeyMismatch => f.write_str("auth: public and private keys don't match"),
            AuthTokenError::UnsupportedMethod(m) => write!(f, "unsupported signing method: {m}"),
            AuthTokenError::BadKey { option, why } => write!(f, "{option}: {why}"),
        }
    }
}

impl std::error::Error for AuthTokenError {}

fn invalid(why: impl Into<String>) -> AuthTokenError {
    AuthTokenError::InvalidAuthOpts(why.into())
}

impl AuthToken {
    /// Parses an `--auth-token` value as etcd does, reading the key files it names.
    pub fn parse(opts: &str) -> Result<AuthToken, AuthTokenError> {
        let mut parts = opts.split(',');
        let kind = parts.next().unwrap_or_default();
        let mut options = BTreeMap::new();
        for part in parts {
            let pair: Vec<&str> = part.split('=').collect();
            let [key, value] = pair[..] else {
                return Err(invalid(format!("{part:?} is not key=value")));
            };
            if options.insert(key, value).is_some() {
                return Err(invalid(format!("{key} is given twice")));
            }
        }
        match kind {
            "simple" => Ok(AuthToken::Simple),
            "jwt" => Jwt::new(&options).map(|j| AuthToken::Jwt(Arc::new(j))),
            "" => Ok(AuthToken::Nop),
            other => Err(invalid(format!("unknown token type {other:?}"))),
        }
    }
}

/// etcd's JWT token provider: signs with the private key (none: this member only checks
/// tokens, as etcd's verify-only members), checks with the public key.
pub struct Jwt {
    keys: Keys,
    ttl: Duration,
}

/// A sign method cairn can use: one of jsonwebtoken's, or ES512 (`jwt_es512.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Jws(Algorithm),
    Es512,
}

/// The keys that sign and check a member's tokens, by sign method.
enum Keys {
    /// Every method but ES512: jsonwebtoken's.
    Jws {
        alg: Algorithm,
        /// None on a verify-only member.
        encoding: Option<EncodingKey>,
        decoding: DecodingKey,
        validation: Validation,
    },
    Es512(Es512),
}

impl fmt::Debug for Jwt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verify_only = match &self.keys {
            Keys::Jws { encoding, .. } => encoding.is_none(),
            Keys::Es512(keys) => keys.verify_only(),
        };
        f.debug_struct("Jwt")
            .field("method", &self.method())
            .field("verify_only", &verify_only)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// Why a token could not be issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AssignError {
    /// etcd's `ErrVerifyOnly`: no private key.
    VerifyOnly,
    /// The signature failed (a key ring refuses).
    Sign(String),
}

impl fmt::Display for AssignError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AssignError::VerifyOnly => {
                f.write_str("auth: token signing attempted with verify-only key")
            }
            AssignError::Sign(why) => write!(f, "auth: failed to sign a JWT token: {why}"),
        }
    }
}

/// The sign method an etcd `sign-method` names, if cairn can use it.
fn sign_method(name: &str) -> Result<Method, AuthTokenError> {
    Ok(Method::Jws(match name {
        "HS256" => Algorithm::HS256,
        "HS384" => Algorithm::HS384,
        "HS512" => Algorithm::HS512,
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "PS256" => Algorithm::PS256,
        "PS384" => Algorithm::PS384,
        "PS512" => Algorithm::PS512,
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        "ES512" => return Ok(Method::Es512),
        // etcd knows these names but has no key for them (its `Key()`).
        "EdDSA" | "none" => return Err(AuthTokenError::UnsupportedMethod(name.into())),
        _ => return Err(invalid(format!("invalid auth signature method {name:?}"))),
    }))
}

fn read_key(options: &BTreeMap<&str, &str>, option: &str) -> Result<Vec<u8>, AuthTokenError> {
    match options.get(option).filter(|p| !p.is_empty()) {
        None => Ok(Vec::new()),
        Some(path) => {
            std::fs::read(Path::new(path)).map_err(|e| invalid(format!("{option} {path}: {e}")))
        }
    }
}

fn bad_key(option: &'static str, why: impl fmt::Display) -> AuthTokenError {
    AuthTokenError::BadKey { option, why: why.to_string() }
}

/// The public key that checks `priv_pem`'s signatures, derived from it (etcd checks with the
/// private key's own public half), and the key to sign with.
fn private_key(
    alg: Algorithm,
    priv_pem: &[u8],
) -> Result<(EncodingKey, DecodingKey), AuthTokenError> {
    let der = PrivateKeyDer::from_pem_slice(priv_pem).map_err(|e| bad_key("priv-key", e))?;
    let rejected = |e: ring::error::KeyRejected| bad_key("priv-key", e);
    match (alg, der) {
        (Algorithm::ES256 | Algorithm::ES384, PrivateKeyDer::Pkcs8(der)) => {
            let signing = match alg {
                Algorithm::ES256 => &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                _ => &ring::signature::ECDSA_P384_SHA384_FIXED_SIGNING,
            };
            let rng = ring::rand::SystemRandom::new();
            let pair = ring::signature::EcdsaKeyPair::from_pkcs8(signing, der.secret_pkcs8_der(), &rng)
                .map_err(rejected)?;
            let decoding = DecodingKey::from_ec_der(pair.public_key().as_ref());
            Ok((EncodingKey::from_ec_der(der.secret_pkcs8_der()), decoding))
        }
        (Algorithm::ES256 | Algorithm::ES384, _) => Err(bad_key(
            "priv-key",
            "an EC key must be PKCS#8 (\"BEGIN PRIVATE KEY\"; openssl pkcs8 -topk8 -nocrypt converts one)",
        )),
        (_, PrivateKeyDer::Pkcs1(der)) => {
            let pair = ring::signature::RsaKeyPair::from_der(der.secret_pkcs1_der()).map_err(rejected)?;
            let decoding = DecodingKey::from_rsa_der(pair.public_key().as_ref());
            Ok((EncodingKey::from_rsa_der(der.secret_pkcs1_der()), decoding))
        }
        (_, PrivateKeyDer::Pkcs8(der)) => {
            let pair = ring::signature::RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).map_err(rejected)?;
            let decoding = DecodingKey::from_rsa_der(pair.public_key().as_ref());
            // jsonwebtoken signs RSA with the PKCS#8 form's inner key through its PEM reader.
            let encoding = EncodingKey::from_rsa_pem(priv_pem).map_err(|e| bad_key("priv-key", e))?;
            Ok((encoding, decoding))
        }
        (_, _) => Err(bad_key("priv-key", "not an RSA key")),
    }
}

fn public_key(alg: Algorithm, pem: &[u8]) -> Result<DecodingKey, AuthTokenError> {
    let key = match alg {
        Algorithm::ES256 | Algorithm::ES384 => DecodingKey::from_ec_pem(pem),
        _ => DecodingKey::from_rsa_pem(pem),
    };
    key.map_err(|e| bad_key("pub-key", e))
}

/// jsonwebtoken's keys for `alg` from the key files' contents.
fn jws_keys(alg: Algorithm, pub_pem: &[u8], priv_pem: &[u8]) -> Result<Keys, AuthTokenError> {
    let (encoding, decoding) = match alg {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => {
            // etcd's HMAC secret is the private key file's bytes, as they are.
            if priv_pem.is_empty() {
                return Err(AuthTokenError::MissingKey);
            }
            (Some(EncodingKey::from_secret(priv_pem)), DecodingKey::from_secret(priv_pem))
        }
        _ if !priv_pem.is_empty() => {
            let (encoding, decoding) = private_key(alg, priv_pem)?;
            (Some(encoding), decoding)
        }
        _ if !pub_pem.is_empty() => (None, public_key(alg, pub_pem)?),
        _ => return Err(AuthTokenError::MissingKey),
    };
    let mut validation = Validation::new(alg);
    // etcd's checks: the signature and the method here; `exp` in `Jwt::info`, for every method
    // alike (jsonwebtoken's own check lets a negative `exp` through); nothing else required.
    validation.validate_exp = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    Ok(Keys::Jws { alg, encoding, decoding, validation })
}

/// Whether a token's `exp` claim has passed (no leeway), read as jsonwebtoken reads it for the
/// methods it checks: whole seconds, a fraction rounded. One that is not a number would escape
/// the check, and a negative one escapes jsonwebtoken's: etcd refuses both, and so does cairn.
fn expired(exp: &serde_json::Value, now: u64) -> bool {
    match (exp.as_u64(), exp.as_f64()) {
        (Some(exp), _) => exp < now,
        (None, Some(exp)) => exp.round() < now as f64,
        (None, None) => true,
    }
}

fn unix_now() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
}

impl Jwt {
    fn new(options: &BTreeMap<&str, &str>) -> Result<Jwt, AuthTokenError> {
        let ttl = match options.get("ttl").filter(|t| !t.is_empty()) {
            None => DEFAULT_TTL,
            Some(t) => crate::watch::parse_duration(t).map_err(|e| invalid(format!("ttl {e}")))?,
        };
        let (pub_pem, priv_pem) = (read_key(options, "pub-key")?, read_key(options, "priv-key")?);
        let method = sign_method(options.get("sign-method").copied().unwrap_or_default())?;
        let unknown: Vec<&&str> = options
            .keys()
            .filter(|k| !["sign-method", "pub-key", "priv-key", "ttl"].contains(k))
            .collect();
        if !unknown.is_empty() {
            tracing::warn!(keys = ?unknown, "unknown JWT options");
        }
        let keys = match method {
            Method::Jws(alg) => jws_keys(alg, &pub_pem, &priv_pem)?,
            Method::Es512 => Keys::Es512(Es512::new(&pub_pem, &priv_pem)?),
        };
        let jwt = Jwt { keys, ttl };
        jwt.check_pair(&pub_pem, &priv_pem)?;
        Ok(jwt)
    }

    /// The sign method of this member's tokens.
    fn method(&self) -> Method {
        match &self.keys {
            Keys::Jws { alg, .. } => Method::Jws(*alg),
            Keys::Es512(_) => Method::Es512,
        }
    }

    /// With both keys given: a token this member signs must pass the public key given.
    fn check_pair(&self, pub_pem: &[u8], priv_pem: &[u8]) -> Result<(), AuthTokenError> {
        let hmac = matches!(
            self.method(),
            Method::Jws(Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512)
        );
        if hmac || pub_pem.is_empty() || priv_pem.is_empty() {
            return Ok(());
        }
        let probe = self.assign("probe", 1).map_err(|e| bad_key("priv-key", e))?;
        let passes = match &self.keys {
            Keys::Jws { alg, validation, .. } => {
                let given = public_key(*alg, pub_pem)?;
                jsonwebtoken::decode::<serde_json::Value>(&probe, &given, validation).is_ok()
            }
            Keys::Es512(_) => es512::verify(&es512::public_key(pub_pem)?, &probe).is_some(),
        };
        if passes {
            Ok(())
        } else {
            Err(AuthTokenError::KeyMismatch)
        }
    }

    /// A token for `username` at auth revision `revision`, valid for the configured TTL.
    pub(crate) fn assign(&self, username: &str, revision: u64) -> Result<String, AssignError> {
        let claims = serde_json::json!({
            "username": username,
            "revision": revision,
            "exp": (unix_now() + self.ttl).as_secs(),
        });
        match &self.keys {
            Keys::Jws { alg, encoding, .. } => {
                let key = encoding.as_ref().ok_or(AssignError::VerifyOnly)?;
                jsonwebtoken::encode(&Header::new(*alg), &claims, key)
                    .map_err(|e| AssignError::Sign(e.to_string()))
            }
            Keys::Es512(keys) => keys.sign(&claims),
        }
    }

    /// The user and auth revision a token names, if it is signed with this member's key and
    /// method and has not expired (etcd's `info`).
    pub(crate) fn info(&self, token: &str) -> Option<(String, u64)> {
        let claims = match &self.keys {
            Keys::Jws { decoding, validation, .. } => {
                jsonwebtoken::decode::<serde_json::Value>(token, decoding, validation).ok()?.claims
            }
            Keys::Es512(keys) => keys.verify(token)?,
        };
        let claims = claims.as_object()?;
        if claims.get("exp").is_some_and(|exp| expired(exp, unix_now().as_secs())) {
            return None;
        }
        let username = claims.get("username")?.as_str()?.to_string();
        // etcd reads the revision as a JSON number (a float64) and truncates it.
        let revision = claims.get("revision")?.as_f64()?;
        Some((username, revision as u64))
    }
}

#[cfg(test)]
#[path = "jwt_tests.rs"]
mod tests;
