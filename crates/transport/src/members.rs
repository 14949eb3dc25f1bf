//! The members query: how a member started with `--initial-cluster-state existing` learns its
//! own id, the cluster's id and the other members from a running member, before it has either
//! id (etcd asks `GET /members` on a peer URL for the same reason).
//!
//! The caller opens a peer connection with a [`crate::codec::Hello`] of kind
//! [`StreamKind::Members`] whose ids are all zero (it knows none yet); the acceptor skips the
//! identity checks for this kind, accepts, answers with one frame and closes:
//! `format u8 (1) | cluster_id u64 | count u32 | member*`, member:
//! `id u64 | learner u8 | name str | peer_urls list | client_urls list`, a list being
//! `count u32 | str*` and a str `len u32 | UTF-8 bytes`; fixed-width integers are little-endian.
//! A later format takes another first byte, so this one refuses it by name. Over an `https://`
//! peer URL the query goes through TLS like any other peer connection.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use cairn_raft::NodeId;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::codec::{self, DecodeError, Hello, StreamKind};
use crate::url::{host, is_tls, resolve, UrlError};
use crate::ClientTls;

/// The format of a members answer this version writes and reads.
pub const FORMAT: u8 = 1;
/// The largest members answer accepted (a thousand members with long URLs fit).
const MAX_ANSWER_BYTES: u32 = 4 << 20;

/// One member as a running member lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemoteMember {
    /// Its id.
    pub id: u64,
    /// Its name, once it published it (empty for a member added but not started yet).
    pub name: String,
    /// Where its peers reach it.
    pub peer_urls: Vec<String>,
    /// Where it serves clients, once it published them.
    pub client_urls: Vec<String>,
    /// It is a learner.
    pub is_learner: bool,
}

/// A running cluster as one of its members sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemoteCluster {
    /// The cluster's id.
    pub cluster_id: u64,
    /// Every member, by id.
    pub members: Vec<RemoteMember>,
}

/// Why a members query failed.
#[derive(Debug)]
pub enum QueryError {
    /// The URL cannot be dialed.
    Url(UrlError),
    /// An `https://` URL and no peer TLS to dial it with.
    TlsMissing(String),
    /// Connecting, TLS or reading failed.
    Io(std::io::Error),
    /// The peer did not answer in time.
    Timeout,
    /// The peer refused, with its reason (a cairn that predates the query names the kind).
    Refused(String),
    /// The answer is malformed, or of a format this version does not read.
    Protocol(DecodeError),
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueryError::Url(e) => write!(f, "{e}"),
            QueryError::TlsMissing(url) => write!(
                f,
                "TLS key/cert (--peer-cert-file, --peer-key-file) must be provided for peer url {url} with HTTPS scheme"
            ),
            QueryError::Io(e) => write!(f, "{e}"),
            QueryError::Timeout => f.write_str("the peer did not answer in time"),
            QueryError::Refused(why) => write!(f, "the peer refused: {why}"),
            QueryError::Protocol(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for QueryError {}

impl From<std::io::Error> for QueryError {
    fn from(e: std::io::Error) -> QueryError {
        QueryError::Io(e)
    }
}

impl From<DecodeError> for QueryError {
    fn from(e: DecodeError) -> QueryError {
        QueryError::Protocol(e)
    }
}

/// Appends one frame holding `cluster` in [`FORMAT`].
pub fn encode(cluster: &RemoteCluster, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; codec::FRAME_HEADER_LEN]);
    out.push(FORMAT);
    out.extend_from_slice(&cluster.cluster_id.to_le_bytes());
    put_len(out, cluster.members.len());
    for m in &cluster.members {
        out.extend_from_slice(&m.id.to_le_bytes());
        out.push(u8::from(m.is_learner));
        put_str(out, &m.name);
        put_list(out, &m.peer_urls);
        put_list(out, &m.client_urls);
    }
    let payload = &out[start + codec::FRAME_HEADER_LEN..];
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let crc = crc32c::crc32c(payload);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

fn put_len(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_len(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

fn put_list(out: &mut Vec<u8>, l: &[String]) {
    put_len(out, l.len());
    l.iter().for_each(|s| put_str(out, s));
}

/// Checks a members payload against its frame's crc and decodes it.
pub fn decode(payload: &[u8], crc: u32) -> Result<RemoteCluster, DecodeError> {
    let actual = crc32c::crc32c(payload);
    if actual != crc {
        return Err(DecodeError::ChecksumMismatch { expected: crc, actual });
    }
    let mut r = Reader(payload);
    match r.take(1)?[0] {
        FORMAT => {}
        tag => return Err(DecodeError::UnknownTag { what: "members format", tag }),
    }
    let cluster_id = r.u64()?;
    let count = r.len()?;
    let mut members = Vec::new();
    for _ in 0..count {
        let id = r.u64()?;
        let is_learner = match r.take(1)?[0] {
            0 => false,
            1 => true,
            tag => return Err(DecodeError::UnknownTag { what: "learner flag", tag }),
        };
        let name = r.str()?;
        let peer_urls = r.list()?;
        let client_urls = r.list()?;
        members.push(RemoteMember { id, name, peer_urls, client_urls, is_learner });
    }
    if !r.0.is_empty() {
        return Err(DecodeError::TrailingBytes);
    }
    Ok(RemoteCluster { cluster_id, members })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut b = [0; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    /// A count or length, never more than the bytes left (each item takes at least one), so
    /// a garbage count fails as truncated instead of allocating.
    fn len(&mut self) -> Result<usize, DecodeError> {
        let mut b = [0; 4];
        b.copy_from_slice(self.take(4)?);
        let n = u32::from_le_bytes(b) as usize;
        if n > self.0.len() {
            return Err(DecodeError::Truncated);
        }
        Ok(n)
    }

    fn str(&mut self) -> Result<String, DecodeError> {
        let n = self.len()?;
        let s = std::str::from_utf8(self.take(n)?).map_err(|_| DecodeError::ReasonNotUtf8)?;
        Ok(s.to_owned())
    }

    fn list(&mut self) -> Result<Vec<String>, DecodeError> {
        let n = self.len()?;
        (0..n).map(|_| self.str()).collect()
    }
}

/// Answers a members query on an accepted connection: the membership as `sink` sees it, or a
/// refusal when it has none to give.
pub(crate) async fn serve<S: AsyncWrite + Unpin>(
    conn: &mut S,
    sink: &dyn crate::Sink,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    match sink.members() {
        Some(cluster) => {
            codec::encode_reply(Ok(()), &mut buf);
            encode(&cluster, &mut buf);
        }
        None => codec::encode_reply(Err("this member does not list its cluster"), &mut buf),
    }
    conn.write_all(&buf).await?;
    conn.flush().await?;
    conn.shutdown().await
}

/// Asks the member at peer URL `url` for its cluster, through TLS for an `https://` URL,
/// giving up after `limit`. Blocks the calling thread (on a thread of its own, so it may be
/// called from inside an async runtime too).
pub fn query(
    url: &str,
    tls: Option<Arc<ClientTls>>,
    limit: Duration,
) -> Result<RemoteCluster, QueryError> {
    let url = url.to_string();
    let ask = move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async {
            tokio::time::timeout(limit, query_async(&url, tls))
                .await
                .map_err(|_| QueryError::Timeout)?
        })
    };
    std::thread::spawn(ask)
        .join()
        .unwrap_or_else(|_| Err(QueryError::Io(std::io::Error::other("members query panicked"))))
}

async fn query_async(url: &str, tls: Option<Arc<ClientTls>>) -> Result<RemoteCluster, QueryError> {
    let addrs = resolve(url).map_err(QueryError::Url)?;
    let tls = match (is_tls(url), tls) {
        (false, _) => None,
        (true, None) => return Err(QueryError::TlsMissing(url.to_string())),
        (true, Some(tls)) => {
            let h = host(url).map_err(QueryError::Url)?;
            let name = rustls_pki_types::ServerName::try_from(h.to_string())
                .map_err(|_| QueryError::Url(UrlError::Malformed(url.to_string())))?;
            Some((name, tls))
        }
    };
    let mut last = QueryError::Url(UrlError::Malformed(url.to_string()));
    for addr in addrs {
        let conn = match TcpStream::connect(addr).await {
            Ok(c) => c,
            Err(e) => {
                last = e.into();
                continue;
            }
        };
        return match &tls {
            None => ask(conn).await,
            Some((name, tls)) => ask(tls.connector().connect(name.clone(), conn).await?).await,
        };
    }
    Err(last)
}

async fn ask<S: AsyncRead + AsyncWrite + Unpin>(mut conn: S) -> Result<RemoteCluster, QueryError> {
    let hello = Hello { cluster_id: 0, from: NodeId(0), to: NodeId(0), kind: StreamKind::Members };
    let mut buf = Vec::with_capacity(codec::HELLO_LEN);
    codec::encode_hello(&hello, &mut buf);
    conn.write_all(&buf).await?;
    conn.flush().await?;
    let (reply, crc) = read_frame(&mut conn, 4096).await?;
    codec::decode_reply(reply.into(), crc)?.map_err(QueryError::Refused)?;
    let (payload, crc) = read_frame(&mut conn, MAX_ANSWER_BYTES).await?;
    Ok(decode(&payload, crc)?)
}

async fn read_frame<S: AsyncRead + Unpin>(
    conn: &mut S,
    max: u32,
) -> Result<(Vec<u8>, u32), QueryError> {
    let mut header = [0u8; codec::FRAME_HEADER_LEN];
    conn.read_exact(&mut header).await?;
    let (len, crc) = codec::parse_frame_header(&header, max)?;
    let mut payload = vec![0; len as usize];
    conn.read_exact(&mut payload).await?;
    Ok((payload, crc))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RemoteCluster {
        RemoteCluster {
            cluster_id: 0xdead_beef,
            members: vec![
                RemoteMember {
                    id: 7,
                    name: "a".into(),
                    peer_urls: vec!["http://127.0.0.1:1".into()],
                    client_urls: vec!["http://127.0.0.1:2".into(), "http://h:3".into()],
                    is_learner: false,
                },
                RemoteMember {
                    id: u64::MAX,
                    peer_urls: vec!["https://h:4".into()],
                    is_learner: true,
                    ..RemoteMember::default()
                },
            ],
        }
    }

    fn frame_parts(buf: &[u8]) -> (&[u8], u32) {
        let mut h = [0; codec::FRAME_HEADER_LEN];
        h.copy_from_slice(&buf[..codec::FRAME_HEADER_LEN]);
        let (len, crc) = codec::parse_frame_header(&h, u32::MAX).expect("header");
        assert_eq!(len as usize, buf.len() - codec::FRAME_HEADER_LEN);
        (&buf[codec::FRAME_HEADER_LEN..], crc)
    }

    #[test]
    fn a_cluster_survives_the_round_trip() {
        let mut buf = Vec::new();
        encode(&sample(), &mut buf);
        let (payload, crc) = frame_parts(&buf);
        assert_eq!(decode(payload, crc), Ok(sample()));
    }

    #[test]
    fn damage_and_other_formats_are_refused() {
        let mut buf = Vec::new();
        encode(&sample(), &mut buf);
        let (payload, crc) = frame_parts(&buf);
        let mut other = payload.to_vec();
        other[0] = FORMAT + 1;
        let crc2 = crc32c::crc32c(&other);
        let e = decode(&other, crc2);
        assert_eq!(e, Err(DecodeError::UnknownTag { what: "members format", tag: FORMAT + 1 }));
        assert!(matches!(decode(payload, crc ^ 1), Err(DecodeError::ChecksumMismatch { .. })));
        for cut in 1..payload.len() {
            let short = &payload[..cut];
            assert!(decode(short, crc32c::crc32c(short)).is_err(), "cut at {cut}");
        }
        let mut long = payload.to_vec();
        long.push(0);
        assert_eq!(decode(&long, crc32c::crc32c(&long)), Err(DecodeError::TrailingBytes));
    }
}
