//! etcd's answer to a gRPC message over the receive limit: `ResourceExhausted` with grpc-go's
//! "grpc: received message larger than max (N vs. M)", decided from the message's 5-byte prefix
//! before any of it is buffered.
//!
//! tonic enforces the same limit but answers `OutOfRange` with a message of its own. This body
//! wrapper reads the gRPC framing as the request streams through and fails the body with etcd's
//! status the moment a prefix announces too much; tonic passes a `Status` found in a body error
//! through unchanged. tonic's own limit stays set to the same size as a backstop.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::{Buf, Bytes};
use http_body::{Frame, SizeHint};
use tonic::Status;

/// gRPC's length-prefixed message framing: a compression flag, then a big-endian u32 length.
const PREFIX: usize = 5;

/// Wraps `body` so that a message longer than `limit` fails it with etcd's status.
pub fn limit(body: Body, limit: usize) -> Body {
    Body::new(Limited { inner: body, limit, framing: Framing::default() })
}

/// Where the stream is in gRPC's framing.
#[derive(Debug, Default)]
struct Framing {
    prefix: [u8; PREFIX],
    /// Bytes of the current prefix seen so far.
    have: usize,
    /// Bytes of the current message still to come.
    remaining: u64,
}

impl Framing {
    /// Follows the framing through `data`; returns the announced length of the first message
    /// longer than `limit`.
    fn scan(&mut self, mut data: &[u8], limit: usize) -> Result<(), u64> {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(data.len() as u64);
                self.remaining -= n;
                data.advance(n as usize);
                continue;
            }
            self.prefix[self.have] = data[0];
            self.have += 1;
            data.advance(1);
            if self.have == PREFIX {
                self.have = 0;
                let len = u64::from(u32::from_be_bytes([
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ]));
                if len > limit as u64 {
                    return Err(len);
                }
                self.remaining = len;
            }
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Limited {
    inner: Body,
    limit: usize,
    framing: Framing,
}

fn too_large(len: u64, limit: usize) -> Status {
    Status::resource_exhausted(format!(
        "grpc: received message larger than max ({len} vs. {limit})"
    ))
}

impl http_body::Body for Limited {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        if let Some(data) = frame.data_ref() {
            if let Err(len) = this.framing.scan(data, this.limit) {
                return Poll::Ready(Some(Err(Box::new(too_large(len, this.limit)))));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: u32) -> Vec<u8> {
        let mut m = vec![0];
        m.extend_from_slice(&len.to_be_bytes());
        m.resize(PREFIX + len as usize, 7);
        m
    }

    #[test]
    fn follows_the_framing_across_any_split() {
        let mut stream = message(10);
        stream.extend(message(0));
        stream.extend(message(3));
        let mut over = stream.clone();
        over.extend(&message(11)[..PREFIX]);
        for chunk in 1..=over.len() {
            let mut f = Framing::default();
            let results: Vec<_> = over.chunks(chunk).map(|c| f.scan(c, 10)).collect();
            assert_eq!(results.iter().filter(|r| r.is_err()).count(), 1, "split {chunk}");
            assert_eq!(*results.last().unwrap(), Err(11), "split {chunk}");
            let mut f = Framing::default();
            assert!(stream.chunks(chunk).all(|c| f.scan(c, 10).is_ok()), "split {chunk}");
        }
    }

    #[test]
    fn a_huge_prefix_is_refused_with_etcds_status() {
        let mut f = Framing::default();
        assert_eq!(f.scan(&[0, 0xff, 0xff, 0xff, 0xff], 2 << 20), Err(u64::from(u32::MAX)));
        let s = too_large(u64::from(u32::MAX), 2 << 20);
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        assert_eq!(s.message(), "grpc: received message larger than max (4294967295 vs. 2097152)");
    }
}
