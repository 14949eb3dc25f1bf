//! Peer URLs as etcd's flags give them (`http://host:port`), resolved to socket addresses.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

/// Why a peer URL cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UrlError {
    /// `https://` needs TLS between peers, which cairn does not have yet.
    Tls(String),
    /// Not `http://host:port`.
    Malformed(String),
    /// The host did not resolve to any address.
    Unresolved(String),
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UrlError::Tls(u) => {
                write!(f, "peer URL {u:?} asks for TLS, which cairn's peer transport does not support yet; use http://")
            }
            UrlError::Malformed(u) => {
                write!(f, "peer URL {u:?} is not of the form http://host:port")
            }
            UrlError::Unresolved(u) => write!(f, "peer URL {u:?} does not resolve to an address"),
        }
    }
}

impl std::error::Error for UrlError {}

/// The `host:port` of an `http://host:port` URL (a trailing `/` is allowed, as etcd allows).
pub fn host_port(url: &str) -> Result<&str, UrlError> {
    if url.starts_with("https://") || url.starts_with("unixs://") {
        return Err(UrlError::Tls(url.to_string()));
    }
    let rest = url.strip_prefix("http://").ok_or_else(|| UrlError::Malformed(url.to_string()))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_etcd_forms_and_refuses_the_rest() {
        assert_eq!(host_port("http://127.0.0.1:2380"), Ok("127.0.0.1:2380"));
        assert_eq!(host_port("http://localhost:2380/"), Ok("localhost:2380"));
        assert_eq!(host_port("http://[::1]:2380"), Ok("[::1]:2380"));
        assert!(matches!(host_port("https://a:1"), Err(UrlError::Tls(_))));
        for bad in ["127.0.0.1:2380", "http://a", "http://a:x", "http://:1", "http://a:1/p"] {
            assert!(matches!(host_port(bad), Err(UrlError::Malformed(_))), "{bad}");
        }
        assert_eq!(resolve("http://127.0.0.1:9").unwrap(), vec!["127.0.0.1:9".parse().unwrap()]);
    }
}
