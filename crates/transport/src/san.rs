//! etcd's check of a peer's client certificate against the address it calls from: with
//! `--peer-client-cert-auth`, a member's certificate that names IP addresses or DNS names (its
//! subject alternative names) is accepted only from an address it names. A certificate copied
//! off one member then cannot be used from another machine, even though the CA signed it.
//! etcd makes this check on its peer listeners (`checkSAN` in its transport package) unless
//! started with `--experimental-peer-skip-client-san-verification`; so does cairn.
//!
//! The rules are etcd's: a certificate with no IP or DNS names passes; the caller's IP passes
//! if the certificate lists it; else it passes if a DNS name of the certificate resolves to it.
//! etcd also tries a reverse lookup of the caller's IP against the names (and only that way
//! matches wildcard names); cairn does the forward lookups only, so a member certificate that
//! names its host by a wildcard alone should also list its IP address.

use std::net::IpAddr;
use std::time::Duration;

use rustls_pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;

/// How long the lookups of one check may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The IP addresses and DNS names a certificate's subject alternative names list.
pub fn alt_names(cert: &CertificateDer<'_>) -> (Vec<IpAddr>, Vec<String>) {
    let (mut ips, mut dns) = (Vec::new(), Vec::new());
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return (ips, dns);
    };
    let Ok(Some(san)) = parsed.subject_alternative_name() else { return (ips, dns) };
    for name in &san.value.general_names {
        match name {
            GeneralName::IPAddress(b) => match b.len() {
                4 => ips.push(IpAddr::from(<[u8; 4]>::try_from(*b).expect("4 bytes"))),
                16 => ips.push(IpAddr::from(<[u8; 16]>::try_from(*b).expect("16 bytes"))),
                _ => {}
            },
            GeneralName::DNSName(n) => dns.push((*n).to_string()),
            _ => {}
        }
    }
    (ips, dns)
}

/// Whether `cert` is valid for `host` as Go's `VerifyHostname` decides it: an IP address must be
/// among its IP addresses; a name must match one of its DNS names, ignoring case, where
/// `*.example.com` stands for exactly one label (etcd's `--peer-cert-allowed-hostname` and
/// `--client-cert-allowed-hostname` check this).
pub fn valid_for(cert: &CertificateDer<'_>, host: &str) -> bool {
    let (ips, dns) = alt_names(cert);
    names_valid_for(&ips, &dns, host)
}

fn names_valid_for(ips: &[IpAddr], dns: &[String], host: &str) -> bool {
    if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        return ips.iter().any(|c| c.to_canonical() == ip.to_canonical());
    }
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    dns.iter().any(|name| {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        match name.strip_prefix("*.") {
            Some(rest) => {
                host.split_once('.').is_some_and(|(label, tail)| !label.is_empty() && tail == rest)
            }
            None => name == host,
        }
    })
}

/// Whether a caller at `remote` may present `cert` ([etcd's rules](self)); the error is
/// etcd's wording of the refusal.
pub async fn check(cert: &CertificateDer<'_>, remote: IpAddr) -> Result<(), String> {
    let (ips, dns) = alt_names(cert);
    check_names(&ips, &dns, remote, |name| async move {
        let lookup = tokio::net::lookup_host((name.as_str(), 0));
        match tokio::time::timeout(LOOKUP_TIMEOUT, lookup).await {
            Ok(Ok(addrs)) => Ok(addrs.map(|a| a.ip()).collect()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("looking up {name} timed out")),
        }
    })
    .await
}

/// [`check`] with the lookup of a DNS name given (a test gives its own).
pub async fn check_names<F, Fut>(
    ips: &[IpAddr],
    dns: &[String],
    remote: IpAddr,
    lookup: F,
) -> Result<(), String>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<IpAddr>, String>>,
{
    let remote = remote.to_canonical();
    if ips.is_empty() && dns.is_empty() {
        return Ok(());
    }
    if ips.iter().any(|ip| ip.to_canonical() == remote) {
        return Ok(());
    }
    if dns.is_empty() {
        let listed: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
        return Err(format!("x509: certificate is valid for {}, not {remote}", listed.join(", ")));
    }
    let mut last_err = None;
    for name in dns.iter().filter(|n| !n.starts_with("*.")) {
        match lookup(name.clone()).await {
            Ok(addrs) if addrs.iter().any(|a| a.to_canonical() == remote) => return Ok(()),
            Ok(_) => {}
            Err(e) => last_err = Some(e),
        }
    }
    let why = last_err.map(|e| format!(" ({e})")).unwrap_or_default();
    Err(format!("tls: {:?} does not match any of DNSNames {dns:?}{why}", remote.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an IP")
    }

    async fn run(ips: &[&str], dns: &[&str], remote: &str) -> Result<(), String> {
        let ips: Vec<IpAddr> = ips.iter().map(|s| ip(s)).collect();
        let dns: Vec<String> = dns.iter().map(|s| s.to_string()).collect();
        // A resolver that knows two names.
        check_names(&ips, &dns, ip(remote), |name| async move {
            match name.as_str() {
                "m1.example" => Ok(vec![ip("10.0.0.1"), ip("10.0.0.2")]),
                "localhost" => Ok(vec![ip("127.0.0.1")]),
                _ => Err(format!("lookup {name}: no such host")),
            }
        })
        .await
    }

    #[test]
    fn host_names_match_as_go_matches_them() {
        let ips = [ip("10.0.0.1")];
        let dns = ["m1.example".to_string(), "*.peers.example".to_string()];
        for (host, valid) in [
            ("10.0.0.1", true),
            ("10.0.0.2", false),
            ("M1.Example", true),
            ("m1.example.", true),
            ("m2.example", false),
            ("a.peers.example", true),
            ("a.b.peers.example", false),
            ("peers.example", false),
        ] {
            assert_eq!(names_valid_for(&ips, &dns, host), valid, "{host}");
        }
    }

    #[tokio::test]
    async fn etcds_rules() {
        // No names: any caller.
        assert_eq!(run(&[], &[], "192.168.1.9").await, Ok(()));
        // A listed IP, IPv4-mapped IPv6 callers included.
        assert_eq!(run(&["10.0.0.1"], &[], "10.0.0.1").await, Ok(()));
        assert_eq!(run(&["10.0.0.1"], &[], "::ffff:10.0.0.1").await, Ok(()));
        assert_eq!(
            run(&["10.0.0.1", "10.0.0.3"], &[], "10.0.0.2").await,
            Err("x509: certificate is valid for 10.0.0.1, 10.0.0.3, not 10.0.0.2".into())
        );
        // A name that resolves to the caller; the IPs not matching do not matter then.
        assert_eq!(run(&["10.9.9.9"], &["m1.example"], "10.0.0.2").await, Ok(()));
        assert_eq!(run(&[], &["nowhere", "localhost"], "127.0.0.1").await, Ok(()));
        assert_eq!(
            run(&[], &["m1.example"], "10.0.0.3").await,
            Err(r#"tls: "10.0.0.3" does not match any of DNSNames ["m1.example"]"#.into())
        );
        assert_eq!(
            run(&[], &["nowhere"], "10.0.0.3").await,
            Err(r#"tls: "10.0.0.3" does not match any of DNSNames ["nowhere"] (lookup nowhere: no such host)"#.into())
        );
        // Wildcards are matched by etcd's reverse lookup only, which cairn does not make.
        assert!(run(&[], &["*.example"], "10.0.0.1").await.is_err());
    }
}
