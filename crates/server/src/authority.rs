//! Accepting etcdctl 3.4's `:authority`: its `endpoint status` sends the endpoint URL itself
//! (`http://127.0.0.1:2379`) as the HTTP/2 `:authority`. h2 parses `:authority` as a URI
//! authority before any of cairn's code sees the request and resets the stream
//! (`PROTOCOL_ERROR`) when it is not one; grpc-go, and so etcd, accept it. Debian and Ubuntu ship
//! that etcdctl, and h2 has no setting to relax the check.
//!
//! So the client's bytes pass through [`FixAuthority`] on their way to hyper. It watches an
//! HTTP/2 connection's frames up to the first request's header block and decodes it (HPACK). If
//! its `:authority` is a URL, every header block of that connection from then on is decoded and
//! sent on re-encoded as plain literals with the scheme stripped from `:authority` (the literals
//! leave h2's decoding table empty, so it never needs the client's). Otherwise, as for every
//! other client, the block goes on untouched and the connection's bytes pass straight through
//! from then on. HTTP/1 and anything unexpected pass through too, for hyper and h2 to judge.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEAD: usize = 9;
/// HTTP/2's default SETTINGS_MAX_FRAME_SIZE, which hyper's server keeps: larger frames are
/// h2's to refuse, so they pass through.
const MAX_FRAME: usize = 16_384;
/// Larger header blocks pass through for h2 to refuse (its header list limit is far lower).
const MAX_BLOCK: usize = 1 << 20;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Before the HTTP/2 connection preface is seen whole.
    Preface,
    /// Frames before the first header block is complete.
    Sniff,
    /// Every header block is re-encoded.
    Rewrite,
    /// Bytes go through untouched.
    Passthrough,
}

/// The first frame of a header block.
#[derive(Debug)]
struct BlockStart {
    stream: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
}

/// The byte-stream transformation, fed what the client sends.
struct Rewriter {
    mode: Mode,
    /// Input not yet a whole frame.
    pending: BytesMut,
    /// The header block being gathered (HEADERS and CONTINUATION fragments), and its raw frames.
    block: BytesMut,
    block_raw: BytesMut,
    start: Option<BlockStart>,
    decoder: loona_hpack::Decoder<'static>,
}

impl std::fmt::Debug for Rewriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rewriter").field("mode", &self.mode).finish_non_exhaustive()
    }
}

impl Rewriter {
    fn new() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        // hyper's server leaves SETTINGS_HEADER_TABLE_SIZE at HTTP/2's default.
        decoder.set_max_allowed_table_size(4096);
        Rewriter {
            mode: Mode::Preface,
            pending: BytesMut::new(),
            block: BytesMut::new(),
            block_raw: BytesMut::new(),
            start: None,
            decoder,
        }
    }

    /// Takes `input` from the client and appends what hyper should read to `out`.
    fn feed(&mut self, input: &[u8], out: &mut BytesMut) {
        self.pending.extend_from_slice(input);
        loop {
            match self.mode {
                Mode::Passthrough => {
                    out.extend_from_slice(&self.pending.split());
                    return;
                }
                Mode::Preface => {
                    let have = self.pending.len().min(PREFACE.len());
                    if self.pending[..have] != PREFACE[..have] {
                        self.mode = Mode::Passthrough;
                    } else if have < PREFACE.len() {
                        return;
                    } else {
                        out.extend_from_slice(&self.pending.split_to(PREFACE.len()));
                        self.mode = Mode::Sniff;
                    }
                }
                Mode::Sniff | Mode::Rewrite => {
                    if self.pending.len() < FRAME_HEAD {
                        return;
                    }
                    let len = usize::from(self.pending[0]) << 16
                        | usize::from(self.pending[1]) << 8
                        | usize::from(self.pending[2]);
                    if len > MAX_FRAME {
                        self.give_up(out);
                        continue;
                    }
                    if self.pending.len() < FRAME_HEAD + len {
                        return;
                    }
                    let frame = self.pending.split_to(FRAME_HEAD + len).freeze();
                    self.frame(frame, out);
                }
            }
        }
    }

    /// Everything held back goes on as it came, and so does all that follows.
    fn give_up(&mut self, out: &mut BytesMut) {
        out.extend_from_slice(&self.block_raw.split());
        self.block.clear();
        self.start = None;
        self.mode = Mode::Passthrough;
    }

    fn frame(&mut self, frame: Bytes, out: &mut BytesMut) {
        let (ty, flags) = (frame[3], frame[4]);
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[FRAME_HEAD..];
        let fragment = match (&self.start, ty) {
            (Some(start), CONTINUATION) if start.stream == stream => payload,
            (None, HEADERS) => {
                let Some((fragment, priority)) = headers_fragment(flags, payload) else {
                    self.give_up(out);
                    out.extend_from_slice(&frame);
                    return;
                };
                self.start = Some(BlockStart { stream, flags, priority });
                fragment
            }
            (None, _) if ty != CONTINUATION => {
                out.extend_from_slice(&frame);
                return;
            }
            // A CONTINUATION out of place, or another frame inside a header block.
            _ => {
                self.give_up(out);
                out.extend_from_slice(&frame);
                return;
            }
        };
        self.block.extend_from_slice(fragment);
        self.block_raw.extend_from_slice(&frame);
        if self.block.len() > MAX_BLOCK {
            self.give_up(out);
        } else if flags & END_HEADERS != 0 {
            self.finish_block(out);
        }
    }

    fn finish_block(&mut self, out: &mut BytesMut) {
        let Ok(mut fields) = self.decoder.decode(&self.block) else {
            return self.give_up(out);
        };
        let url = |(name, value): &(Vec<u8>, Vec<u8>)| {
            name == b":authority" && value.windows(3).any(|w| w == b"://")
        };
        if self.mode == Mode::Sniff && !fields.iter().any(url) {
            // The usual case: this connection needs nothing from here on.
            return self.give_up(out);
        }
        self.mode = Mode::Rewrite;
        for (name, value) in &mut fields {
            if name == b":authority" {
                *value = strip_scheme(value).to_vec();
            }
        }
        let start = self.start.take().expect("a complete block has a first frame");
        write_block(&start, &encode_literals(&fields), out);
        self.block.clear();
        self.block_raw.clear();
    }
}

/// A HEADERS payload's header block fragment and priority, without padding.
fn headers_fragment(flags: u8, mut payload: &[u8]) -> Option<(&[u8], Option<[u8; 5]>)> {
    let mut pad = 0;
    if flags & PADDED != 0 {
        pad = usize::from(*payload.first()?);
        payload = &payload[1..];
    }
    let mut priority = None;
    if flags & PRIORITY != 0 {
        priority = Some(payload.get(..5)?.try_into().ok()?);
        payload = &payload[5..];
    }
    let end = payload.len().checked_sub(pad)?;
    Some((&payload[..end], priority))
}

/// `http://host:port/...` becomes `host:port`.
fn strip_scheme(value: &[u8]) -> &[u8] {
    let Some(at) = value.windows(3).position(|w| w == b"://") else {
        return value;
    };
    let rest = &value[at + 3..];
    let end = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
    &rest[..end]
}

/// HPACK's integer with an `n`-bit prefix, `first` holding the bits above it.
fn put_int(out: &mut BytesMut, first: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.put_u8(first | value as u8);
        return;
    }
    out.put_u8(first | max as u8);
    value -= max;
    while value >= 0x80 {
        out.put_u8((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

/// Every field as a literal without indexing, with a literal name: h2's table stays empty.
fn encode_literals(fields: &[(Vec<u8>, Vec<u8>)]) -> BytesMut {
    let mut out = BytesMut::new();
    for (name, value) in fields {
        out.put_u8(0);
        for s in [name, value] {
            put_int(&mut out, 0, 7, s.len());
            out.extend_from_slice(s);
        }
    }
    out
}

/// The block as a HEADERS frame and as many CONTINUATION frames as it needs.
fn write_block(start: &BlockStart, mut block: &[u8], out: &mut BytesMut) {
    let mut first = true;
    loop {
        let room = MAX_FRAME - if first && start.priority.is_some() { 5 } else { 0 };
        let take = block.len().min(room);
        let last = take == block.len();
        let (ty, mut flags, prio) = if first {
            let keep = start.flags & (END_STREAM | PRIORITY);
            (HEADERS, keep, start.priority)
        } else {
            (CONTINUATION, 0, None)
        };
        if last {
            flags |= END_HEADERS;
        }
        let len = take + prio.map_or(0, |p| p.len());
        out.put_uint(len as u64, 3);
        out.put_u8(ty);
        out.put_u8(flags);
        out.put_u32(start.stream);
        if let Some(p) = prio {
            out.extend_from_slice(&p);
        }
        out.extend_from_slice(&block[..take]);
        block.advance(take);
        first = false;
        if last {
            return;
        }
    }
}

/// A client connection whose bytes go through the `:authority` fix-up (see the module's comment).
#[derive(Debug)]
pub(crate) struct FixAuthority<T> {
    inner: T,
    /// None once the bytes pass straight through.
    rewriter: Option<Box<Rewriter>>,
    /// Transformed bytes not yet read.
    out: BytesMut,
}

impl<T> FixAuthority<T> {
    pub(crate) fn new(inner: T) -> Self {
        FixAuthority { inner, rewriter: Some(Box::new(Rewriter::new())), out: BytesMut::new() }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for FixAuthority<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.out.is_empty() {
                let n = this.out.len().min(buf.remaining());
                buf.put_slice(&this.out.split_to(n));
                return Poll::Ready(Ok(()));
            }
            let Some(rewriter) = this.rewriter.as_mut() else {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            };
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                // End of input: whatever was held back goes on for hyper to judge.
                rewriter.give_up(&mut this.out);
                rewriter.feed(&[], &mut this.out);
                this.rewriter = None;
                if this.out.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            rewriter.feed(read.filled(), &mut this.out);
            if rewriter.mode == Mode::Passthrough {
                this.rewriter = None;
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FixAuthority<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = BytesMut::new();
        f.put_uint(payload.len() as u64, 3);
        f.put_u8(ty);
        f.put_u8(flags);
        f.put_u32(stream);
        f.extend_from_slice(payload);
        f.to_vec()
    }

    /// A request's header block as grpc-go encodes it: `authority` as a literal added to the
    /// dynamic table (indexed name 1), or, once there, by its index (63: the first block's
    /// `:path` came after it).
    fn block(authority: Option<&str>) -> Vec<u8> {
        let mut b = vec![0x83, 0x86]; // :method POST, :scheme http
        match authority {
            Some(a) => {
                b.push(0x41);
                b.push(a.len() as u8);
                b.extend_from_slice(a.as_bytes());
            }
            None => b.push(0x80 | 63),
        }
        let path = b"/etcdserverpb.Maintenance/Status";
        b.push(0x44); // :path, literal added to the table
        b.push(path.len() as u8);
        b.extend_from_slice(path);
        b
    }

    /// The connection: preface, SETTINGS, then for each block a request with a DATA frame.
    fn connection(blocks: &[Vec<u8>]) -> Vec<u8> {
        let mut c = PREFACE.to_vec();
        c.extend(frame(0x4, 0, 0, &[]));
        for (i, b) in blocks.iter().enumerate() {
            let stream = 1 + 2 * i as u32;
            // Split each block over HEADERS and CONTINUATION, the first one padded.
            let (a, z) = b.split_at(3);
            let mut padded = vec![2];
            padded.extend_from_slice(a);
            padded.extend_from_slice(&[0, 0]);
            c.extend(frame(HEADERS, PADDED, stream, &padded));
            c.extend(frame(CONTINUATION, END_HEADERS, stream, z));
            c.extend(frame(0x0, END_STREAM, stream, &[0, 0, 0, 0, 0]));
        }
        c
    }

    /// What comes out when `input` is fed in chunks of `chunk` bytes.
    fn run(input: &[u8], chunk: usize) -> Vec<u8> {
        let mut r = Rewriter::new();
        let mut out = BytesMut::new();
        for c in input.chunks(chunk) {
            r.feed(c, &mut out);
        }
        r.give_up(&mut out);
        r.feed(&[], &mut out);
        out.to_vec()
    }

    /// Every frame of an HTTP/2 connection's bytes (after the preface): type, flags, stream,
    /// payload.
    fn frames(mut c: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        c = c.strip_prefix(PREFACE).expect("the preface first");
        let mut out = Vec::new();
        while !c.is_empty() {
            let len = (usize::from(c[0]) << 16) | (usize::from(c[1]) << 8) | usize::from(c[2]);
            let stream = u32::from_be_bytes([c[5], c[6], c[7], c[8]]);
            out.push((c[3], c[4], stream, c[9..9 + len].to_vec()));
            c = &c[9 + len..];
        }
        out
    }

    #[test]
    fn other_traffic_passes_through_unchanged_however_it_is_split() {
        let h1 = b"POST /etcdserverpb.KV/Range HTTP/1.1\r\nhost: x\r\n\r\n".to_vec();
        let h2 = connection(&[block(Some("127.0.0.1:2379")), block(None)]);
        let mut garbage = PREFACE.to_vec();
        garbage.extend(frame(CONTINUATION, END_HEADERS, 1, b"junk"));
        for input in [h1, h2, garbage, PREFACE[..10].to_vec()] {
            for chunk in 1..=input.len() {
                assert_eq!(run(&input, chunk), input, "split {chunk}");
            }
        }
    }

    #[test]
    fn a_url_authority_loses_its_scheme_in_every_block() {
        let input = connection(&[block(Some("http://127.0.0.1:2379")), block(None)]);
        for chunk in 1..=input.len() {
            let out = run(&input, chunk);
            let fs = frames(&out);
            let heads: Vec<_> = fs.iter().filter(|f| f.0 == HEADERS).collect();
            assert_eq!(heads.len(), 2, "split {chunk}");
            assert_eq!(fs.iter().filter(|f| f.0 == 0x0).count(), 2, "split {chunk}");
            let mut decoder = loona_hpack::Decoder::new();
            for (i, h) in heads.iter().enumerate() {
                assert_eq!((h.1, h.2), (END_HEADERS, 1 + 2 * i as u32), "split {chunk}");
                let fields = decoder.decode(&h.3).expect("a valid block");
                let want: Vec<(Vec<u8>, Vec<u8>)> = [
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":authority", "127.0.0.1:2379"),
                    (":path", "/etcdserverpb.Maintenance/Status"),
                ]
                .iter()
                .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect();
                assert_eq!(fields, want, "split {chunk}");
            }
        }
    }

    #[test]
    fn hostile_header_blocks_pass_through_without_a_panic() {
        // A fixed xorshift sequence: random HPACK bytes in a first header block, which is decoded
        // on every connection, then random frames.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..3000 {
            let len = (next() % 64) as usize;
            let block: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let mut input = PREFACE.to_vec();
            input.extend(frame(HEADERS, END_HEADERS | (next() as u8 & PADDED), 1, &block));
            let tail: Vec<u8> = (0..(next() % 64)).map(|_| next() as u8).collect();
            input.extend(&tail);
            // No block here decodes to a URL :authority, so all of it goes on as it came, for h2
            // to judge; nothing is held back at the end.
            assert_eq!(run(&input, 1 + (next() % 17) as usize), input);
        }
    }

    #[test]
    fn a_long_block_is_split_into_continuations_and_keeps_its_priority() {
        let mut b = block(Some("http://h:1"));
        let long = vec![b'a'; 40_000];
        // x: a long value, a literal with a literal name.
        b.extend_from_slice(&[0x40, 0x01, b'x']);
        let mut n = BytesMut::new();
        put_int(&mut n, 0, 7, long.len());
        b.extend_from_slice(&n);
        b.extend_from_slice(&long);
        let mut input = PREFACE.to_vec();
        let mut payload = vec![0, 0, 0, 3, 15];
        payload.extend_from_slice(&b);
        for (i, part) in payload.chunks(MAX_FRAME).enumerate() {
            let (ty, flags) =
                if i == 0 { (HEADERS, PRIORITY | END_STREAM) } else { (CONTINUATION, 0) };
            input.extend(frame(ty, flags, 1, part));
        }
        let last = input.len() - 9 - (payload.len() % MAX_FRAME);
        input[last + 4] |= END_HEADERS;
        let fs = frames(&run(&input, 4096));
        assert!(fs.len() >= 3 && fs.iter().all(|f| f.3.len() <= MAX_FRAME));
        assert_eq!((fs[0].0, fs[0].1), (HEADERS, PRIORITY | END_STREAM));
        assert_eq!(fs[0].3[..5], [0, 0, 0, 3, 15]);
        let mut whole = fs[0].3[5..].to_vec();
        for f in &fs[1..] {
            assert_eq!(f.0, CONTINUATION);
            whole.extend_from_slice(&f.3);
        }
        assert_eq!(fs.last().expect("frames").1, END_HEADERS);
        let fields = loona_hpack::Decoder::new().decode(&whole).expect("a valid block");
        assert_eq!(fields[2], (b":authority".to_vec(), b"h:1".to_vec()));
        assert_eq!(fields[4], (b"x".to_vec(), long));
    }
}
