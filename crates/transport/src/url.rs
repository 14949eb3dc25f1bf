//! URLs as etcd's flags give them (`http://host:port`, or `https://host:port` for TLS): the
//! addresses to listen on, and the peer addresses to dial, resolved as etcd resolves them.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};

/// Why a URL cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UrlError {
    /// `unixs://` (and `unix://`): cairn listens on TCP only.
    Unix(String),
    /// `host:port` without `http://` in front (etcd's flags take URLs, not addresses).
    NoScheme(String),
    /// Not `http://host:port`.
    Malformed(String),
    /// The host did not resolve to any address.
    Unresolved(String),
    /// A URL to listen on names a host other than `localhost`: etcd binds only IP addresses,
    /// so that what a member listens on never depends on DNS.
    NotIp(String),
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UrlError::Unix(u) => {
                write!(f, "URL {u:?} is a unix socket, which cairn does not serve; use http:// or https://")
            }
            UrlError::NoScheme(u) => {
                write!(f, "URL {u:?} has no scheme: write http://{u}")
            }
            UrlError::Malformed(u) => {
                write!(f, "URL {u:?} is not of the form http://host:port or https://host:port")
            }
            UrlError::Unresolved(u) => write!(f, "URL {u:?} does not resolve to an address"),
            // etcd's wording (embed.checkBindURLs).
            UrlError::NotIp(u) => write!(
                f,
                "expected IP in URL for binding ({u}): listen on an IP address or localhost"
            ),
        }
    }
}

impl std::error::Error for UrlError {}

/// Whether the URL asks for TLS (`https://`).
pub fn is_tls(url: &str) -> bool {
    url.starts_with("https://")
}

/// The host of a URL that [`host_port`] takes, without the brackets of an IPv6 address.
pub fn host(url: &str) -> Result<&str, UrlError> {
    let hp = host_port(url)?;
    let (host, _) = hp.rsplit_once(':').ok_or_else(|| UrlError::Malformed(url.to_string()))?;
    Ok(host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host))
}

/// The `host:port` of an `http://host:port` or `https://host:port` URL (a trailing `/` is
/// allowed, as etcd allows).
pub fn host_port(url: &str) -> Result<&str, UrlError> {
    if url.starts_with("unix://") || url.starts_with("unixs://") {
        return Err(UrlError::Unix(url.to_string()));
    }
    if !url.contains("://") {
        return Err(UrlError::NoScheme(url.to_string()));
    }
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| UrlError::Malformed(url.to_string()))?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let ok = rest.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !rest.contains('/') && port.parse::<u16>().is_ok()
    });
    if ok {
        Ok(rest)
    } else {
        Err(UrlError::Malformed(url.to_string()))
    }
}

/// Every address the URL's host resolves to.
pub fn resolve(url: &str) -> Result<Vec<SocketAddr>, UrlError> {
    let hp = host_port(url)?;
    let addrs: Vec<SocketAddr> =
        hp.to_socket_addrs().map_err(|_| UrlError::Unresolved(url.to_string()))?.collect();
    if addrs.is_empty() {
        return Err(UrlError::Unresolved(url.to_string()));
    }
    Ok(addrs)
}

/// The address to listen on for a URL, as etcd binds it: an IP address, or `localhost`, which
/// is 127.0.0.1 (Go's listener takes the first IPv4 address `localhost` has); any other host
/// name is refused, as etcd refuses it.
pub fn listen_addr(url: &str) -> Result<SocketAddr, UrlError> {
    let hp = host_port(url)?;
    let (host, port) = hp.rsplit_once(':').ok_or_else(|| UrlError::Malformed(url.to_string()))?;
    let port: u16 = port.parse().map_err(|_| UrlError::Malformed(url.to_string()))?;
    let ip = if host == "localhost" {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        bare.parse().map_err(|_| UrlError::NotIp(url.to_string()))?
    };
    Ok(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_etcd_forms_and_refuses_the_rest() {
        assert_eq!(host_port("http://127.0.0.1:2380"), Ok("127.0.0.1:2380"));
        assert_eq!(host_port("http://localhost:2380/"), Ok("localhost:2380"));
        assert_eq!(host_port("http://[::1]:2380"), Ok("[::1]:2380"));
        assert_eq!(host_port("https://a:1"), Ok("a:1"));
        assert!(is_tls("https://a:1") && !is_tls("http://a:1"));
        assert_eq!(host("https://[::1]:2380"), Ok("::1"));
        assert_eq!(host("https://node-1.example:2380/"), Ok("node-1.example"));
        assert!(matches!(host_port("unixs://a:1"), Err(UrlError::Unix(_))));
        for bad in ["127.0.0.1:2380", "localhost:2380"] {
            assert!(matches!(host_port(bad), Err(UrlError::NoScheme(_))), "{bad}");
        }
        for bad in ["ftp://a:1", "http://a", "http://a:x", "http://:1", "http://a:1/p"] {
            assert!(matches!(host_port(bad), Err(UrlError::Malformed(_))), "{bad}");
        }
        assert_eq!(resolve("http://127.0.0.1:9").unwrap(), vec!["127.0.0.1:9".parse().unwrap()]);
    }

    #[test]
    fn listens_on_ips_and_localhost_only_as_etcd_does() {
        let ok = |u: &str| listen_addr(u).expect("a bindable URL");
        assert_eq!(ok("http://127.0.0.1:2379"), "127.0.0.1:2379".parse().expect("addr"));
        assert_eq!(ok("http://localhost:2379"), "127.0.0.1:2379".parse().expect("addr"));
        assert_eq!(ok("http://localhost:2379/"), "127.0.0.1:2379".parse().expect("addr"));
        assert_eq!(ok("http://[::1]:2379"), "[::1]:2379".parse().expect("addr"));
        assert_eq!(ok("http://0.0.0.0:2379"), "0.0.0.0:2379".parse().expect("addr"));
        let no_scheme = listen_addr("127.0.0.1:2379").expect_err("no scheme");
        assert_eq!(no_scheme, UrlError::NoScheme("127.0.0.1:2379".into()));
        assert!(no_scheme.to_string().contains("has no scheme: write http://127.0.0.1:2379"));
        let named = listen_addr("http://db1.example:2379").expect_err("a host name");
        assert_eq!(
            named.to_string().split(':').next(),
            Some("expected IP in URL for binding (http")
        );
        assert_eq!(ok("https://127.0.0.1:2379"), "127.0.0.1:2379".parse().expect("addr"));
        assert!(matches!(listen_addr("http://127.0.0.1:99999"), Err(UrlError::Malformed(_))));
    }
}
