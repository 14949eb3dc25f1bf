use base64::Engine as _;

use super::*;

/// A test key's path (crates/server/tests/jwt-keys, made with openssl for these tests).
fn key(name: &str) -> String {
    format!("{}/tests/jwt-keys/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn jwt(opts: &str) -> Arc<Jwt> {
    match AuthToken::parse(opts) {
        Ok(AuthToken::Jwt(j)) => j,
        other => panic!("{opts}: {other:?}"),
    }
}

fn err(opts: &str) -> AuthTokenError {
    AuthToken::parse(opts).expect_err(opts)
}

/// base64url without padding, as JWT parts are written.
fn b64(data: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ABC[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

/// A token with these claims, signed by `j`'s key with `alg`.
fn signed(j: &Jwt, alg: Algorithm, claims: serde_json::Value) -> String {
    let Keys::Jws { encoding: Some(key), .. } = &j.keys else { panic!("{j:?} signs no JWS") };
    jsonwebtoken::encode(&Header::new(alg), &claims, key).expect("signs")
}

/// A token's header and claims, unchecked.
fn parts(token: &str) -> (serde_json::Value, serde_json::Value) {
    let part = |p: &str| {
        let json = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(p).expect("base64url");
        serde_json::from_slice::<serde_json::Value>(&json).expect("JSON")
    };
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "{token}");
    (part(parts[0]), part(parts[1]))
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs()
}

#[test]
fn the_flag_parses_as_etcds() {
    assert!(matches!(AuthToken::parse("simple"), Ok(AuthToken::Simple)));
    // etcd ignores a simple token's options, but not malformed ones.
    assert!(matches!(AuthToken::parse("simple,ttl=1m"), Ok(AuthToken::Simple)));
    assert!(matches!(AuthToken::parse(""), Ok(AuthToken::Nop)));
    for bad in ["simple,", "simple,ttl", "jwt,a=b=c", "jwt,ttl=1m,ttl=2m", "bogus", "JWT"] {
        assert!(matches!(err(bad), AuthTokenError::InvalidAuthOpts(_)), "{bad}: {}", err(bad));
    }
    let rs = |extra: &str| format!("jwt,priv-key={},sign-method=RS256{extra}", key("rsa.pem"));
    assert!(err(&rs(",ttl=soon")).to_string().starts_with("auth: invalid auth options"));
    assert_eq!(jwt(&rs("")).ttl, DEFAULT_TTL);
    assert_eq!(jwt(&rs(",ttl=90s")).ttl, Duration::from_secs(90));
    // Unknown options are only warned about, as etcd does.
    assert_eq!(jwt(&rs(",colour=blue")).method(), Method::Jws(Algorithm::RS256));
    for method in ["", "sign-method=", "sign-method=RS1024", "sign-method=rs256"] {
        let opts = format!("jwt,priv-key={},{method}", key("rsa.pem"));
        let opts = opts.trim_end_matches(',');
        assert!(matches!(err(opts), AuthTokenError::InvalidAuthOpts(_)), "{opts}");
    }
    for method in ["EdDSA", "none"] {
        let opts = format!("jwt,priv-key={},sign-method={method}", key("ec.pem"));
        assert!(matches!(err(&opts), AuthTokenError::UnsupportedMethod(_)), "{opts}");
    }
    let missing = format!("jwt,priv-key={},sign-method=RS256", key("no-such-file"));
    assert!(err(&missing).to_string().contains("no-such-file"), "{}", err(&missing));
}

#[test]
fn keys_are_checked_at_start() {
    for method in ["RS256", "ES256", "HS256", "ES512"] {
        assert_eq!(err(&format!("jwt,sign-method={method}")), AuthTokenError::MissingKey);
    }
    // HMAC takes its secret from priv-key alone.
    let hs = format!("jwt,pub-key={},sign-method=HS256", key("rsa.pub.pem"));
    assert_eq!(err(&hs), AuthTokenError::MissingKey);
    let mismatch = format!(
        "jwt,pub-key={},priv-key={},sign-method=RS256",
        key("other-rsa.pub.pem"),
        key("rsa.pem")
    );
    assert_eq!(err(&mismatch), AuthTokenError::KeyMismatch);
    for private in ["ec521.pem", "ec521-sec1.pem"] {
        let mismatch = format!(
            "jwt,pub-key={},priv-key={},sign-method=ES512",
            key("other-ec521.pub.pem"),
            key(private)
        );
        assert_eq!(err(&mismatch), AuthTokenError::KeyMismatch, "{private}");
    }
    let cases = [
        ("priv-key", "ec.pem", "RS256"),
        ("priv-key", "rsa.pem", "ES256"),
        ("priv-key", "ec-sec1.pem", "ES256"),
        ("priv-key", "ec384.pem", "ES256"),
        ("priv-key", "README", "RS256"),
        ("pub-key", "README", "RS256"),
        ("pub-key", "ec.pub.pem", "RS256"),
        // ES512 takes P-521 keys only, and P-521 keys are for ES512 only.
        ("priv-key", "ec.pem", "ES512"),
        ("priv-key", "ec-sec1.pem", "ES512"),
        ("priv-key", "ec384.pem", "ES512"),
        ("priv-key", "rsa.pem", "ES512"),
        ("priv-key", "rsa-pkcs8.pem", "ES512"),
        ("priv-key", "README", "ES512"),
        ("pub-key", "ec.pub.pem", "ES512"),
        ("pub-key", "rsa.pub.pem", "ES512"),
        ("pub-key", "ec521.pem", "ES512"),
        ("priv-key", "ec521.pem", "ES256"),
        ("priv-key", "ec521.pem", "ES384"),
        ("priv-key", "ec521.pem", "RS256"),
    ];
    for (option, file, method) in cases {
        let opts = format!("jwt,{option}={},sign-method={method}", key(file));
        assert!(matches!(err(&opts), AuthTokenError::BadKey { .. }), "{opts}: {:?}", err(&opts));
    }
}

#[test]
fn a_token_passes_every_member_with_the_key_and_carries_etcds_claims() {
    let both = format!("pub-key={},priv-key={}", key("rsa.pub.pem"), key("rsa.pem"));
    let pkcs8 = format!("priv-key={}", key("rsa-pkcs8.pem"));
    let ec = format!("pub-key={},priv-key={}", key("ec.pub.pem"), key("ec.pem"));
    let ec521 = format!("pub-key={},priv-key={}", key("ec521.pub.pem"), key("ec521.pem"));
    let sec1 = format!("pub-key={},priv-key={}", key("ec521.pub.pem"), key("ec521-sec1.pem"));
    let hs = format!("priv-key={}", key("README"));
    let cases = [
        (both.as_str(), "RS256"),
        (&both, "RS512"),
        (&both, "PS256"),
        (&pkcs8, "RS384"),
        (&ec, "ES256"),
        (&format!("priv-key={}", key("ec384.pem")), "ES384"),
        (&hs, "HS256"),
        (&hs, "HS512"),
        (&ec521, "ES512"),
        (&sec1, "ES512"),
        (&format!("priv-key={}", key("ec521.pem")), "ES512"),
    ];
    for (keys, method) in cases {
        let a = jwt(&format!("jwt,{keys},sign-method={method},ttl=1m"));
        let b = jwt(&format!("jwt,{keys},sign-method={method}"));
        let token = a.assign("alice", 7).expect("signs");
        assert_eq!(b.info(&token), Some(("alice".to_string(), 7)), "{method}");
        let (header, claims) = parts(&token);
        assert_eq!(header, serde_json::json!({"alg": method, "typ": "JWT"}));
        let exp = claims["exp"].as_u64().expect("exp");
        assert!(exp.abs_diff(now() + 60) <= 2, "{claims}");
        assert_eq!((&claims["username"], &claims["revision"]), (&"alice".into(), &7.into()));
    }
    // A member with only the public key checks tokens and issues none (etcd's verify-only).
    for (keys, public, method) in
        [(both.as_str(), "rsa.pub.pem", "RS256"), (&sec1, "ec521.pub.pem", "ES512")]
    {
        let signer = jwt(&format!("jwt,{keys},sign-method={method}"));
        let checker = jwt(&format!("jwt,pub-key={},sign-method={method}", key(public)));
        let token = signer.assign("bob", 3).expect("signs");
        assert_eq!(checker.info(&token), Some(("bob".to_string(), 3)), "{method}");
        assert_eq!(checker.assign("bob", 3), Err(AssignError::VerifyOnly), "{method}");
    }
}

#[test]
fn expired_forged_and_confused_tokens_are_refused() {
    let priv_key = key("rsa.pem");
    let member = jwt(&format!("jwt,priv-key={priv_key},sign-method=RS256"));
    let ok = |exp: u64| serde_json::json!({"username": "alice", "revision": 2, "exp": exp});
    assert!(member.info(&signed(&member, Algorithm::RS256, ok(now() + 30))).is_some());
    assert_eq!(member.info(&signed(&member, Algorithm::RS256, ok(now() - 1))), None, "expired");
    // jsonwebtoken does not check an exp it cannot read as a u64; etcd refuses a negative one.
    for exp in [-1.0, -1e10, (now() - 1) as f64 + 0.4] {
        let claims = serde_json::json!({"username": "alice", "revision": 2, "exp": exp});
        assert_eq!(member.info(&signed(&member, Algorithm::RS256, claims)), None, "exp {exp}");
    }
    // etcd does not require exp.
    let no_exp = serde_json::json!({"username": "alice", "revision": 2});
    assert!(member.info(&signed(&member, Algorithm::RS256, no_exp)).is_some());
    // Signed by another key.
    let other = jwt(&format!("jwt,priv-key={},sign-method=RS256", key("other-rsa.pem")));
    assert_eq!(member.info(&other.assign("root", 9).expect("signs")), None, "forged");
    // The same key with another method than the member's.
    assert_eq!(member.info(&signed(&member, Algorithm::RS512, ok(now() + 30))), None);
    assert_eq!(member.info(&signed(&member, Algorithm::PS256, ok(now() + 30))), None);
    // The public key used as an HMAC secret (the classic confusion), and no signature at all.
    let public = std::fs::read(key("rsa.pub.pem")).expect("the public key");
    let confused = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &ok(now() + 30),
        &EncodingKey::from_secret(&public),
    )
    .expect("signs");
    assert_eq!(member.info(&confused), None, "HS256 with the public key");
    let payload = b64(ok(now() + 30).to_string().as_bytes());
    for header in [r#"{"alg":"none","typ":"JWT"}"#, r#"{"alg":"None"}"#, r#"{"alg":"RS256"}"#] {
        let unsigned = format!("{}.{payload}.", b64(header.as_bytes()));
        assert_eq!(member.info(&unsigned), None, "{header}");
    }
    // Claims etcd cannot read.
    for claims in [
        serde_json::json!({"revision": 2, "exp": now() + 30}),
        serde_json::json!({"username": 5, "revision": 2}),
        serde_json::json!({"username": "alice", "revision": "2"}),
        serde_json::json!({"username": "alice", "revision": 2, "exp": "never"}),
        serde_json::json!(["alice", 2]),
    ] {
        assert_eq!(
            member.info(&signed(&member, Algorithm::RS256, claims.clone())),
            None,
            "{claims}"
        );
    }
}

/// An ES512 member with the test key, and one that signs with another P-521 key.
fn es512_members() -> (Arc<Jwt>, Arc<Jwt>) {
    let member = jwt(&format!("jwt,priv-key={},sign-method=ES512", key("ec521.pem")));
    let other = jwt(&format!("jwt,priv-key={},sign-method=ES512", key("other-ec521.pem")));
    (member, other)
}

/// A token with this header and these claims, signed by `j`'s ES512 key.
fn es512_signed(j: &Jwt, header: &str, claims: &serde_json::Value) -> String {
    let Keys::Es512(keys) = &j.keys else { panic!("{j:?} is not ES512") };
    keys.sign_with_header(header, claims).expect("signs")
}

#[test]
fn es512_expired_forged_and_confused_tokens_are_refused() {
    let (member, other) = es512_members();
    let ok = |exp: i64| serde_json::json!({"username": "alice", "revision": 2, "exp": exp});
    let header = r#"{"alg":"ES512","typ":"JWT"}"#;
    let soon = now() as i64 + 30;
    assert!(member.info(&es512_signed(&member, header, &ok(soon))).is_some());
    assert!(member.info(&es512_signed(&member, r#"{"alg":"ES512"}"#, &ok(soon))).is_some());
    for exp in [now() as i64 - 1, -1] {
        assert_eq!(member.info(&es512_signed(&member, header, &ok(exp))), None, "exp {exp}");
    }
    // etcd does not require exp, and refuses one that is not a number.
    let no_exp = serde_json::json!({"username": "alice", "revision": 2});
    assert!(member.info(&es512_signed(&member, header, &no_exp)).is_some());
    let never = serde_json::json!({"username": "alice", "revision": 2, "exp": "never"});
    assert_eq!(member.info(&es512_signed(&member, header, &never)), None);
    // Signed by another P-521 key.
    assert_eq!(member.info(&other.assign("root", 9).expect("signs")), None, "another key");
    // The right key with another method's name, or none.
    for alg in ["ES256", "ES384", "HS512", "RS512", "none", "es512", ""] {
        let confused = es512_signed(&member, &format!(r#"{{"alg":"{alg}"}}"#), &ok(soon));
        assert_eq!(member.info(&confused), None, "{alg}");
    }
    // Tokens of the other methods, and the public key used as an HMAC secret.
    let es256 = jwt(&format!("jwt,priv-key={},sign-method=ES256", key("ec.pem")));
    assert_eq!(member.info(&es256.assign("root", 9).expect("signs")), None);
    let public = std::fs::read(key("ec521.pub.pem")).expect("the public key");
    for alg in [Algorithm::HS256, Algorithm::HS512] {
        let secret = EncodingKey::from_secret(&public);
        let confused = jsonwebtoken::encode(&Header::new(alg), &ok(soon), &secret).expect("signs");
        assert_eq!(member.info(&confused), None, "{alg:?} with the public key");
    }
    // A signature over other claims, or with a changed bit.
    let good = es512_signed(&member, header, &ok(soon));
    let (message, signature) = good.rsplit_once('.').expect("three parts");
    let admin = es512_signed(&member, header, &ok(soon + 1));
    let spliced = format!("{}.{signature}", admin.rsplit_once('.').expect("three parts").0);
    assert_eq!(member.info(&spliced), None, "spliced");
    let mut sig = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(signature).expect("b64");
    assert_eq!(sig.len(), 132, "r||s");
    for byte in [0, 65, 66, 131] {
        sig[byte] ^= 1;
        assert_eq!(member.info(&format!("{message}.{}", b64(&sig))), None, "bit in {byte}");
        sig[byte] ^= 1;
    }
    assert!(member.info(&format!("{message}.{}", b64(&sig))).is_some());
}

#[test]
fn es512_signatures_of_the_wrong_shape_are_refused_without_a_panic() {
    let (member, _) = es512_members();
    // No exp: the signature (RFC 6979's deterministic ECDSA) is the same at every run.
    let claims = serde_json::json!({"username": "alice", "revision": 2});
    let good = es512_signed(&member, r#"{"alg":"ES512","typ":"JWT"}"#, &claims);
    assert!(member.info(&good).is_some());
    let (message, signature) = good.rsplit_once('.').expect("three parts");
    assert!(signature.contains(['-', '_']), "{signature} has base64url's own characters");
    let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(signature).expect("b64");
    let (r, s) = sig.split_at(66);
    let mut shapes = vec![
        Vec::new(),
        sig[..131].to_vec(),
        [&sig[..], &[0]].concat(),
        [&[0], &sig[..]].concat(),
        [r, s, r, s].concat(),
        [s, r].concat(),
        vec![0; 132],
        vec![0xff; 132],
        [&[0; 66], s].concat(),
        [r, &[0; 66]].concat(),
        sig[..64].to_vec(),
        sig[..96].to_vec(),
    ];
    shapes.extend((1..8).map(|n| sig[..132 - n].to_vec()));
    for shape in &shapes {
        assert_eq!(
            member.info(&format!("{message}.{}", b64(shape))),
            None,
            "{} bytes",
            shape.len()
        );
    }
    let (header, claims) = message.split_once('.').expect("two parts");
    let tokens = [
        format!("{message}.{signature}="),
        format!("{message}=.{signature}"),
        format!("{header}.{claims}.{}", signature.replace('-', "+").replace('_', "/")),
        format!("{header}.{claims}..{signature}"),
        format!("{header}.{claims}.{signature}.{signature}"),
        format!("{header}..{claims}.{signature}"),
        format!("{}.{claims}.{signature}", b64(b"[\"ES512\"]")),
        format!("{}.{claims}.{signature}", b64(b"{\"alg\":512}")),
        format!("{}.{claims}.{signature}", b64(b"not json")),
        format!("{header}.{}.{signature}", b64(b"not json")),
        format!("{message}.{}", &signature[..signature.len() - 1]),
        format!("{message}.{}A", &signature[..signature.len() - 1]),
        format!(".{claims}.{signature}"),
        format!("{header}..{signature}"),
    ];
    for t in &tokens {
        assert_eq!(member.info(t), None, "{t}");
    }
}

/// ES512 tokens made by golang-jwt v4 (etcd 3.5's JWT library) with the test key, read from
/// ec521.pem and from ec521-sec1.pem, expiring in 2100: the user, revision and token. (cairn's
/// tokens passed golang-jwt's `jwt.Parse` with ec521.pub.pem, checked by hand.)
const GOLANG_JWT_ES512: [(&str, u64, &str); 2] = [
    (
        "alice",
        7,
        concat!(
            "eyJhbGciOiJFUzUxMiIsInR5cCI6IkpXVCJ9.",
            "eyJleHAiOjQxMDI0NDQ4MDAsInJldmlzaW9uIjo3LCJ1c2VybmFtZSI6ImFsaWNlIn0.",
            "ARk-hE7mgj42TeE94XCMpnxDIuyOD981RnFZM8xqUPn_N7vjwIUJd4fnQDSrabZklXAjuF267gBHRb9e4Oqd",
            "GHmeALakJUK9jEVR2gxkMsPChUiKnib6EeCX6V8Bb81NF19FTIv4su9XpPmlWWAQ0dryzA8L_omAxvKwGz9m",
            "FzeDprLr",
        ),
    ),
    (
        "root",
        42,
        concat!(
            "eyJhbGciOiJFUzUxMiIsInR5cCI6IkpXVCJ9.",
            "eyJleHAiOjQxMDI0NDQ4MDAsInJldmlzaW9uIjo0MiwidXNlcm5hbWUiOiJyb290In0.",
            "ARq51hyxXpzUhG_wpYb3JUX3BOYEhcgGe41JKXVmPA-LM90Yf5uMPwfc3B5gJP7Utsbbz---X6YdQmvFu4b3",
            "0zwGAENLo6iwUs3W5rn7udiAVez75l6X9G-N3twPK3FxO17XILcGp0rQk2MqNPj4Q6X_z7mY4dwS2lt3ymTa",
            "z6tS4RvG",
        ),
    ),
];

#[test]
fn es512_tokens_of_golang_jwt_pass_as_etcds_would() {
    let (member, other) = es512_members();
    let checker = jwt(&format!("jwt,pub-key={},sign-method=ES512", key("ec521.pub.pem")));
    let sec1 = jwt(&format!("jwt,priv-key={},sign-method=ES512", key("ec521-sec1.pem")));
    for (user, revision, token) in GOLANG_JWT_ES512 {
        for j in [&member, &checker, &sec1] {
            assert_eq!(j.info(token), Some((user.to_string(), revision)), "{j:?}: {user}");
        }
        assert_eq!(other.info(token), None, "another key");
        assert_eq!(parts(token).0, parts(&member.assign(user, revision).expect("signs")).0);
    }
}

/// Cut, extended, garbled and random variations of `good`, none of which is a good token.
fn malformed(good: &str) -> Vec<String> {
    let mut tokens = vec![
        String::new(),
        ".".into(),
        "..".into(),
        "a.b.c".into(),
        "a.b.c.d".into(),
        "x".repeat(1 << 20),
        format!("{}.{}.{}", "e".repeat(1 << 19), "e".repeat(1 << 19), "e"),
        good.replace('.', ""),
        format!("{good}x"),
        good[..good.len() - 2].to_string(),
        String::from_utf8_lossy(&[0xff, 0x00, 0x2e, 0x80, 0x2e, 0x01]).into_owned(),
    ];
    // Every one-byte change of a good token, and runs of random bytes.
    let bytes = good.as_bytes();
    for i in 0..bytes.len() {
        let mut t = bytes.to_vec();
        t[i] = if t[i] == b'A' { b'B' } else { b'A' };
        tokens.push(String::from_utf8(t).expect("ASCII"));
    }
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for _ in 0..2000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (x % 200) as usize;
        let t: Vec<u8> =
            (0..len).map(|i| b"ab.-_=+/0eyJ"[((x >> (i % 60)) % 12) as usize]).collect();
        tokens.push(String::from_utf8(t).expect("ASCII"));
    }
    tokens
}

#[test]
fn malformed_tokens_are_refused_without_a_panic() {
    for method in ["ES256", "ES512"] {
        let private = if method == "ES256" { "ec.pem" } else { "ec521.pem" };
        let member = jwt(&format!("jwt,priv-key={},sign-method={method}", key(private)));
        let good = member.assign("alice", 2).expect("signs");
        for t in malformed(&good) {
            if t != good {
                assert_eq!(member.info(&t), None, "{method}: {}", &t[..t.len().min(80)]);
            }
        }
        assert!(member.info(&good).is_some());
    }
}
