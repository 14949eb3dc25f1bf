//! etcd's `ES512` JWT sign method: ECDSA over P-521 with SHA-512, which neither ring nor
//! jsonwebtoken 9 has, so it is signed and checked here with RustCrypto's `p521`.
//!
//! A token is a JWS in compact form, as golang-jwt (etcd's) writes and reads it: base64url without
//! padding of the header `{"alg":"ES512","typ":"JWT"}`, of the claims, and of the signature,
//! joined by dots; the signature is r||s, 66 bytes each (RFC 7518 §3.4). The checks are the ones
//! jsonwebtoken makes for the other methods (jwt.rs): the signature and the method here, `exp` in
//! `Jwt::info`, which both share.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use p521::ecdsa::signature::{Signer, Verifier};
use p521::ecdsa::{Signature, SigningKey, VerifyingKey};
use p521::pkcs8::{DecodePrivateKey, DecodePublicKey};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{PrivateKeyDer, SubjectPublicKeyInfoDer};

use super::{bad_key, AssignError, AuthTokenError};

/// Every ES512 token's header (golang-jwt writes the same).
const HEADER: &str = r#"{"alg":"ES512","typ":"JWT"}"#;

/// The keys of a member whose sign method is ES512.
pub(super) struct Es512 {
    /// None on a verify-only member (pub-key alone).
    signing: Option<SigningKey>,
    verifying: VerifyingKey,
}

impl Es512 {
    /// The keys from the key files' contents: the private key when given (it checks with its
    /// own public half, as etcd does), else the public key alone.
    pub(super) fn new(pub_pem: &[u8], priv_pem: &[u8]) -> Result<Es512, AuthTokenError> {
        if !priv_pem.is_empty() {
            let signing = private_key(priv_pem)?;
            let verifying = *signing.verifying_key();
            Ok(Es512 { signing: Some(signing), verifying })
        } else if !pub_pem.is_empty() {
            Ok(Es512 { signing: None, verifying: public_key(pub_pem)? })
        } else {
            Err(AuthTokenError::MissingKey)
        }
    }

    /// Whether this member has no private key.
    pub(super) fn verify_only(&self) -> bool {
        self.signing.is_none()
    }

    /// A token carrying `claims`, signed with the private key.
    pub(super) fn sign(&self, claims: &serde_json::Value) -> Result<String, AssignError> {
        self.sign_with_header(HEADER, claims)
    }

    /// A token with this header and these claims, signed with the private key.
    pub(super) fn sign_with_header(
        &self,
        header: &str,
        claims: &serde_json::Value,
    ) -> Result<String, AssignError> {
        let key = self.signing.as_ref().ok_or(AssignError::VerifyOnly)?;
        let (header, claims) = (URL_SAFE_NO_PAD.encode(header), claims.to_string());
        let message = format!("{header}.{}", URL_SAFE_NO_PAD.encode(claims));
        let signature: Signature =
            key.try_sign(message.as_bytes()).map_err(|e| AssignError::Sign(e.to_string()))?;
        Ok(format!("{message}.{}", URL_SAFE_NO_PAD.encode(signature.to_bytes())))
    }

    /// The claims of `token` if this member's public key checks it (see [`verify`]).
    pub(super) fn verify(&self, token: &str) -> Option<serde_json::Value> {
        verify(&self.verifying, token)
    }
}

/// The claims of `token` if it is an ES512 JWS that `key` checks: three base64url parts, a
/// header whose `alg` is `ES512`, a 132-byte signature of the first two parts. The claims are
/// any JSON; their `exp` is the caller's to check. Anything else is None, never a panic.
pub(super) fn verify(key: &VerifyingKey, token: &str) -> Option<serde_json::Value> {
    let (signed, signature) = token.rsplit_once('.')?;
    let (header, claims) = signed.split_once('.')?;
    if claims.contains('.') {
        return None;
    }
    let header: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).ok()?).ok()?;
    // Only the method's own name: not "none", not another method with this key.
    if header.get("alg")?.as_str()? != "ES512" {
        return None;
    }
    let signature = Signature::from_slice(&URL_SAFE_NO_PAD.decode(signature).ok()?).ok()?;
    key.verify(signed.as_bytes(), &signature).ok()?;
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(claims).ok()?).ok()
}

/// The key to sign with, from a PKCS#8 (`BEGIN PRIVATE KEY`) or SEC1 (`BEGIN EC PRIVATE KEY`)
/// P-521 key, the two forms etcd's parser reads.
fn private_key(pem: &[u8]) -> Result<SigningKey, AuthTokenError> {
    let not_p521 =
        |e: &dyn std::fmt::Display| bad_key("priv-key", format!("not an EC P-521 key: {e}"));
    match PrivateKeyDer::from_pem_slice(pem).map_err(|e| bad_key("priv-key", e))? {
        PrivateKeyDer::Pkcs8(der) => {
            SigningKey::from_pkcs8_der(der.secret_pkcs8_der()).map_err(|e| not_p521(&e))
        }
        PrivateKeyDer::Sec1(der) => p521::SecretKey::from_sec1_der(der.secret_sec1_der())
            .map(SigningKey::from)
            .map_err(|e| not_p521(&e)),
        _ => Err(bad_key("priv-key", "not an EC P-521 key")),
    }
}

/// The key that checks tokens, from a P-521 public key (`BEGIN PUBLIC KEY`).
pub(super) fn public_key(pem: &[u8]) -> Result<VerifyingKey, AuthTokenError> {
    let der = SubjectPublicKeyInfoDer::from_pem_slice(pem).map_err(|e| bad_key("pub-key", e))?;
    VerifyingKey::from_public_key_der(&der)
        .map_err(|e| bad_key("pub-key", format!("not an EC P-521 public key: {e}")))
}
