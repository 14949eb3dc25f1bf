//! The wire format of peer connections. Pure (no IO), so the network code, the tests and any tool
//! that reads a capture share one definition.
//!
//! A connection opens with a Hello of [`HELLO_LEN`] bytes, fixed width and little-endian, so the
//! acceptor can read it in one exact read before it trusts anything:
//! `magic "CAIRNPR1" | version u16 | kind u8 (0 messages, 1 snapshot in one frame, 2 snapshot
//! in chunks, 3 members query, 4 round-trip probes) | cluster_id u64 | from u64 | to u64`. Later versions must keep
//! magic and version first, so that this one can name them.
//!
//! Everything after it travels in frames: `len u32 | crc32c(payload) u32 | payload`, both
//! little-endian. A reader checks `len` against its limit before it allocates, and the checksum
//! before it parses.
//!
//! Inside payloads, every integer (ids, terms, indexes, heartbeat sequences, counts, lengths) is
//! an unsigned LEB128 varint: most are small, so a heartbeat takes a handful of bytes. A flag is
//! one byte, 0 or 1. A byte string is `len | bytes`. An id set is `count | id*`, strictly
//! ascending.
//!
//! - batch payload: `count | message*`
//! - message: `from | to | term | tag u8 | fields`, by tag:
//!   1 Append `prev_index | prev_term | commit | count | entry*`;
//!   2 AppendResp `index | has_hint flag | [hint_index | hint_term]`;
//!   3 Vote `pre_vote flag | last_index | last_term | transfer flag`;
//!   4 VoteResp `pre_vote flag | granted flag`; 5 Heartbeat `commit | seq`; 6 HeartbeatResp `seq`;
//!   7 Snapshot `index | term | auto_leave flag | voters | voters_outgoing | learners |
//!   learners_next | data bytes`; 8 Propose `count | payload*`; 9 ReadIndex `count | ctx bytes*`;
//!   10 ReadIndexResp `count | ctx bytes* | index`; 11 TransferLeader `target`; 12 TimeoutNow.
//! - entry: `term | index | payload`; payload: `0 | data bytes` (normal) or
//!   `1 | leave_joint u8 (0 auto, 1 explicit) | count | (op u8 | node)*` with op 0 add voter,
//!   1 add learner, 2 remove; or `2 | ` the same `| context bytes` when the change carries a
//!   context.
//! - reply payload: `0` (ok) or `1 | reason bytes` (UTF-8, at most [`MAX_REASON_LEN`] bytes).
//! - snapshot stream payload ([`SnapFrame`]), by tag: 1 Offer `image_id | message` (a snapshot
//!   message whose data is empty); 2 Resume `offset`; 3 Chunk `offset | data bytes`;
//!   4 Done `len | crc u32 as varint`. The sender offers, the receiver answers with the offset
//!   it already holds of that image, the sender sends chunks from there and then Done, and the
//!   receiver ends with a reply frame.
//!
//! - probe payload: `seq`. The caller sends one, the peer sends the same frame back at once: the
//!   caller times the round trip (etcd's `etcd_network_peer_round_trip_time_seconds`).
//!
//! Decoding is strict and structural: unknown tags, flags other than 0 or 1, varints over 64
//! bits, unordered id sets and trailing bytes are errors, so a peer speaking a changed format
//! fails loudly instead of being misread. It never judges the values themselves (node 0, term 0):
//! that is the core's business.

use std::collections::BTreeSet;
use std::fmt;

use bytes::Bytes;
use cairn_raft::{
    ConfChange, ConfChangeSingle, ConfState, Entry, EntryPayload, HeartbeatSeq, LeaveJoint,
    LogIndex, Message, MessageBody, NodeId, ReadCtx, RejectHint, Snapshot, SnapshotMeta, Term,
};

/// First bytes of every peer connection.
pub const MAGIC: [u8; 8] = *b"CAIRNPR1";
/// Wire format version; a peer with another version is refused with a clear error.
pub const VERSION: u16 = 1;
/// Length of the fixed frame header: u32 little-endian payload length, u32 little-endian crc32c
/// of the payload.
pub const FRAME_HEADER_LEN: usize = 8;
/// Length of an encoded Hello: magic, version, kind and three u64s.
pub const HELLO_LEN: usize = 8 + 2 + 1 + 3 * 8;
/// Longest refusal reason a reply carries, in bytes; longer ones are truncated.
pub const MAX_REASON_LEN: usize = 1024;

/// Which stream a connection carries: Raft messages (votes, appends, heartbeats...) or one
/// snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind {
    Messages,
    /// One snapshot in one frame (what cairn sent before snapshots were streamed; still
    /// accepted).
    Snapshot,
    /// One snapshot in chunks, resumable ([`SnapFrame`]).
    SnapshotStream,
    /// A joining member asks for the membership ([`crate::members`]).
    Members,
    /// Round-trip probes, each answered at once ([`encode_probe`]).
    Probe,
}

/// One frame of a chunked snapshot stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapFrame {
    /// From the sender: the snapshot message (its data empty) and its image's identity.
    Offer { image_id: u64, msg: Message },
    /// From the receiver: send from this offset (what it already holds of that image).
    Resume { offset: u64 },
    /// From the sender: image bytes starting at `offset`.
    Chunk { offset: u64, data: Bytes },
    /// From the sender: the image ended; its length and crc32c of all its bytes.
    Done { len: u64, crc: u32 },
}

/// The first thing a connecting member sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub cluster_id: u64,
    pub from: NodeId,
    pub to: NodeId,
    pub kind: StreamKind,
}

/// Why bytes from a peer were refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// A frame header claims more than the reader accepts.
    FrameTooLarge { len: u32, max: u32 },
    /// The connection does not start with [`MAGIC`].
    BadMagic,
    /// The peer speaks another wire version.
    UnsupportedVersion { peer: u16 },
    /// The payload does not match the crc32c of its frame header.
    ChecksumMismatch { expected: u32, actual: u32 },
    /// The payload ends in the middle of a value, or claims more items than it has bytes for.
    Truncated,
    /// A tag or flag byte has no meaning; `what` names the field.
    UnknownTag { what: &'static str, tag: u8 },
    /// A varint runs past 64 bits.
    VarintOverflow,
    /// An id set is not strictly ascending (a duplicate, or not the encoder's order).
    UnorderedIds,
    /// The payload goes on after its last value.
    TrailingBytes,
    /// A refusal reason is not UTF-8.
    ReasonNotUtf8,
    /// A refusal reason is longer than [`MAX_REASON_LEN`].
    ReasonTooLong { len: usize },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::FrameTooLarge { len, max } => {
                write!(f, "frame of {len} bytes exceeds the limit of {max}")
            }
            DecodeError::BadMagic => f.write_str("not a cairn peer (bad magic)"),
            DecodeError::UnsupportedVersion { peer } => {
                write!(f, "peer speaks wire version {peer}, this member speaks {VERSION}")
            }
            DecodeError::ChecksumMismatch { expected, actual } => write!(
                f,
                "checksum mismatch (frame header says {expected:08x}, payload has {actual:08x})"
            ),
            DecodeError::Truncated => f.write_str("truncated message"),
            DecodeError::UnknownTag { what, tag } => write!(f, "unknown {what} tag {tag}"),
            DecodeError::VarintOverflow => f.write_str("varint overflows 64 bits"),
            DecodeError::UnorderedIds => f.write_str("node id set is not strictly ascending"),
            DecodeError::TrailingBytes => f.write_str("trailing bytes after message"),
            DecodeError::ReasonNotUtf8 => f.write_str("refusal reason is not UTF-8"),
            DecodeError::ReasonTooLong { len } => {
                write!(f, "refusal reason of {len} bytes exceeds the limit of {MAX_REASON_LEN}")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

// Tag 0 is left unused so that a zeroed buffer never parses as a message.
const TAG_APPEND: u8 = 1;
const TAG_APPEND_RESP: u8 = 2;
const TAG_VOTE: u8 = 3;
const TAG_VOTE_RESP: u8 = 4;
const TAG_HEARTBEAT: u8 = 5;
const TAG_HEARTBEAT_RESP: u8 = 6;
const TAG_SNAPSHOT: u8 = 7;
const TAG_PROPOSE: u8 = 8;
const TAG_READ_INDEX: u8 = 9;
const TAG_READ_INDEX_RESP: u8 = 10;
const TAG_TRANSFER_LEADER: u8 = 11;
const TAG_TIMEOUT_NOW: u8 = 12;

const PAYLOAD_NORMAL: u8 = 0;
const PAYLOAD_CONF_CHANGE: u8 = 1;
/// A membership change with the application's context (only when the context is not empty, so
/// a change without one encodes as before).
const PAYLOAD_CONF_CONTEXT: u8 = 2;
const CHANGE_ADD_VOTER: u8 = 0;
const CHANGE_ADD_LEARNER: u8 = 1;
const CHANGE_REMOVE: u8 = 2;
const REPLY_OK: u8 = 0;
const REPLY_REFUSED: u8 = 1;

// The fewest bytes each repeated item can take. A claimed count is checked against them before
// anything is reserved, so a garbage count fails as truncated instead of allocating.
const MIN_MESSAGE_LEN: usize = 4; // from, to, term, tag
const MIN_ENTRY_LEN: usize = 4; // term, index, kind, data length
const MIN_PAYLOAD_LEN: usize = 2; // kind, data length
const MIN_CHANGE_LEN: usize = 2; // op, node
const MIN_BYTES_LEN: usize = 1; // length
const MIN_ID_LEN: usize = 1;

/// Appends exactly [`HELLO_LEN`] bytes: [`MAGIC`], [`VERSION`], then the hello's fields.
pub fn encode_hello(h: &Hello, out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.push(match h.kind {
        StreamKind::Messages => 0,
        StreamKind::Snapshot => 1,
        StreamKind::SnapshotStream => 2,
        StreamKind::Members => 3,
        StreamKind::Probe => 4,
    });
    out.extend_from_slice(&h.cluster_id.to_le_bytes());
    out.extend_from_slice(&h.from.0.to_le_bytes());
    out.extend_from_slice(&h.to.0.to_le_bytes());
}

/// Parses a hello. The magic is checked before the version, so that a stranger (an HTTP client
/// on the wrong port) is told it is not a peer rather than that it has the wrong version.
pub fn decode_hello(buf: &[u8; HELLO_LEN]) -> Result<Hello, DecodeError> {
    if buf[..8] != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let version = u16::from_le_bytes([buf[8], buf[9]]);
    if version != VERSION {
        return Err(DecodeError::UnsupportedVersion { peer: version });
    }
    let kind = match buf[10] {
        0 => StreamKind::Messages,
        1 => StreamKind::Snapshot,
        2 => StreamKind::SnapshotStream,
        3 => StreamKind::Members,
        4 => StreamKind::Probe,
        tag => return Err(DecodeError::UnknownTag { what: "stream kind", tag }),
    };
    let u64_at = |at: usize| {
        let mut b = [0; 8];
        b.copy_from_slice(&buf[at..at + 8]);
        u64::from_le_bytes(b)
    };
    Ok(Hello { cluster_id: u64_at(11), from: NodeId(u64_at(19)), to: NodeId(u64_at(27)), kind })
}

/// Appends one frame (header + payload) carrying a batch of messages, in order.
///
/// # Panics
///
/// If the payload exceeds `u32::MAX` bytes (a snapshot of 4 GiB or more), which a frame header
/// cannot describe.
pub fn encode_batch(msgs: &[Message], out: &mut Vec<u8>) {
    frame(out, |out| {
        put_varint(out, msgs.len() as u64);
        for m in msgs {
            put_message(out, m);
        }
    });
}

/// Parses a frame header: returns (payload length, crc). A length over `max_len` is an error, so
/// a garbage peer cannot make us allocate.
pub fn parse_frame_header(
    h: &[u8; FRAME_HEADER_LEN],
    max_len: u32,
) -> Result<(u32, u32), DecodeError> {
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    let crc = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    if len > max_len {
        return Err(DecodeError::FrameTooLarge { len, max: max_len });
    }
    Ok((len, crc))
}

/// Checks the payload against the crc and decodes the batch. Entry data, snapshot data and read
/// contexts in the result are zero-copy slices of `payload`.
pub fn decode_batch(payload: Bytes, crc: u32) -> Result<Vec<Message>, DecodeError> {
    check_crc(&payload, crc)?;
    let mut r = Reader { buf: payload, pos: 0 };
    let msgs = r.list(MIN_MESSAGE_LEN, Reader::message)?;
    r.finish()?;
    Ok(msgs)
}

/// Appends a reply frame: ok, or a refusal whose reason is cut to [`MAX_REASON_LEN`] bytes on a
/// char boundary (the reason is for logs; a peer must not be able to make us log megabytes).
pub fn encode_reply(result: Result<(), &str>, out: &mut Vec<u8>) {
    frame(out, |out| match result {
        Ok(()) => out.push(REPLY_OK),
        Err(reason) => {
            let mut end = reason.len().min(MAX_REASON_LEN);
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            out.push(REPLY_REFUSED);
            put_bytes(out, &reason.as_bytes()[..end]);
        }
    });
}

/// Checks a reply payload against the crc and decodes it: `Ok(Ok(()))` for ok,
/// `Ok(Err(reason))` for a refusal.
pub fn decode_reply(payload: Bytes, crc: u32) -> Result<Result<(), String>, DecodeError> {
    check_crc(&payload, crc)?;
    let mut r = Reader { buf: payload, pos: 0 };
    let reply = match r.u8()? {
        REPLY_OK => Ok(()),
        REPLY_REFUSED => {
            let reason = r.bytes()?;
            if reason.len() > MAX_REASON_LEN {
                return Err(DecodeError::ReasonTooLong { len: reason.len() });
            }
            let reason = std::str::from_utf8(&reason).map_err(|_| DecodeError::ReasonNotUtf8)?;
            Err(reason.to_owned())
        }
        tag => return Err(DecodeError::UnknownTag { what: "reply", tag }),
    };
    r.finish()?;
    Ok(reply)
}

/// Appends a probe frame carrying `seq`, the prober's count; the peer answers with the same
/// frame, so the prober can tell its answer from a late answer to an earlier probe.
pub fn encode_probe(seq: u64, out: &mut Vec<u8>) {
    frame(out, |out| put_varint(out, seq));
}

/// Checks a probe payload against the crc and decodes its `seq`.
pub fn decode_probe(payload: Bytes, crc: u32) -> Result<u64, DecodeError> {
    check_crc(&payload, crc)?;
    let mut r = Reader { buf: payload, pos: 0 };
    let seq = r.varint()?;
    r.finish()?;
    Ok(seq)
}

const SNAP_OFFER: u8 = 1;
const SNAP_RESUME: u8 = 2;
const SNAP_CHUNK: u8 = 3;
const SNAP_DONE: u8 = 4;

/// Appends one frame of a snapshot stream.
pub fn encode_snap_frame(f: &SnapFrame, out: &mut Vec<u8>) {
    frame(out, |out| match f {
        SnapFrame::Offer { image_id, msg } => {
            out.push(SNAP_OFFER);
            put_varint(out, *image_id);
            put_message(out, msg);
        }
        SnapFrame::Resume { offset } => {
            out.push(SNAP_RESUME);
            put_varint(out, *offset);
        }
        SnapFrame::Chunk { offset, data } => {
            out.push(SNAP_CHUNK);
            put_varint(out, *offset);
            put_bytes(out, data);
        }
        SnapFrame::Done { len, crc } => {
            out.push(SNAP_DONE);
            put_varints(out, &[*len, u64::from(*crc)]);
        }
    });
}

/// Checks a snapshot stream payload against the crc and decodes it; a chunk's data is a
/// zero-copy slice of `payload`.
pub fn decode_snap_frame(payload: Bytes, crc: u32) -> Result<SnapFrame, DecodeError> {
    check_crc(&payload, crc)?;
    let mut r = Reader { buf: payload, pos: 0 };
    let f = match r.u8()? {
        SNAP_OFFER => SnapFrame::Offer { image_id: r.varint()?, msg: r.message()? },
        SNAP_RESUME => SnapFrame::Resume { offset: r.varint()? },
        SNAP_CHUNK => SnapFrame::Chunk { offset: r.varint()?, data: r.bytes()? },
        SNAP_DONE => {
            let len = r.varint()?;
            let crc = u32::try_from(r.varint()?).map_err(|_| DecodeError::VarintOverflow)?;
            SnapFrame::Done { len, crc }
        }
        tag => return Err(DecodeError::UnknownTag { what: "snapshot stream frame", tag }),
    };
    r.finish()?;
    Ok(f)
}

fn check_crc(payload: &[u8], expected: u32) -> Result<(), DecodeError> {
    let actual = crc32c::crc32c(payload);
    if actual != expected {
        return Err(DecodeError::ChecksumMismatch { expected, actual });
    }
    Ok(())
}

/// Appends a frame whose payload `write` appends; the header is filled in afterwards so the
/// payload is written once, in place.
fn frame(out: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_LEN]);
    write(out);
    let payload = &out[start + FRAME_HEADER_LEN..];
    let len = u32::try_from(payload.len()).expect("frame payload exceeds u32::MAX bytes");
    let crc = crc32c::crc32c(payload);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_flag(out: &mut Vec<u8>, b: bool) {
    out.push(u8::from(b));
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn put_ids(out: &mut Vec<u8>, ids: &BTreeSet<NodeId>) {
    put_varint(out, ids.len() as u64);
    for id in ids {
        put_varint(out, id.0);
    }
}

fn put_varints(out: &mut Vec<u8>, vs: &[u64]) {
    for &v in vs {
        put_varint(out, v);
    }
}

fn put_message(out: &mut Vec<u8>, m: &Message) {
    put_varints(out, &[m.from.0, m.to.0, m.term.0]);
    match &m.body {
        MessageBody::Append { prev_index, prev_term, entries, commit } => {
            out.push(TAG_APPEND);
            put_varints(out, &[prev_index.0, prev_term.0, commit.0, entries.len() as u64]);
            for e in entries {
                put_varints(out, &[e.term.0, e.index.0]);
                put_payload(out, &e.payload);
            }
        }
        MessageBody::AppendResp { index, reject } => {
            out.push(TAG_APPEND_RESP);
            put_varint(out, index.0);
            put_flag(out, reject.is_some());
            if let Some(hint) = reject {
                put_varints(out, &[hint.index.0, hint.term.0]);
            }
        }
        MessageBody::Vote { pre_vote, last_index, last_term, transfer } => {
            out.push(TAG_VOTE);
            put_flag(out, *pre_vote);
            put_varints(out, &[last_index.0, last_term.0]);
            put_flag(out, *transfer);
        }
        MessageBody::VoteResp { pre_vote, granted } => {
            out.push(TAG_VOTE_RESP);
            put_flag(out, *pre_vote);
            put_flag(out, *granted);
        }
        MessageBody::Heartbeat { commit, seq } => {
            out.push(TAG_HEARTBEAT);
            put_varints(out, &[commit.0, seq.0]);
        }
        MessageBody::HeartbeatResp { seq } => {
            out.push(TAG_HEARTBEAT_RESP);
            put_varint(out, seq.0);
        }
        MessageBody::Snapshot { snapshot } => {
            out.push(TAG_SNAPSHOT);
            put_snapshot(out, snapshot);
        }
        MessageBody::Propose { payloads } => {
            out.push(TAG_PROPOSE);
            put_varint(out, payloads.len() as u64);
            payloads.iter().for_each(|p| put_payload(out, p));
        }
        MessageBody::ReadIndex { ctxs } => {
            out.push(TAG_READ_INDEX);
            put_ctxs(out, ctxs);
        }
        MessageBody::ReadIndexResp { ctxs, index } => {
            out.push(TAG_READ_INDEX_RESP);
            put_ctxs(out, ctxs);
            put_varint(out, index.0);
        }
        MessageBody::TransferLeader { target } => {
            out.push(TAG_TRANSFER_LEADER);
            put_varint(out, target.0);
        }
        MessageBody::TimeoutNow => out.push(TAG_TIMEOUT_NOW),
    }
}

fn put_payload(out: &mut Vec<u8>, p: &EntryPayload) {
    match p {
        EntryPayload::Normal(data) => {
            out.push(PAYLOAD_NORMAL);
            put_bytes(out, data);
        }
        EntryPayload::ConfChange(cc) => {
            let tag =
                if cc.context.is_empty() { PAYLOAD_CONF_CHANGE } else { PAYLOAD_CONF_CONTEXT };
            out.push(tag);
            put_flag(out, cc.leave_joint == LeaveJoint::Explicit);
            put_varint(out, cc.changes.len() as u64);
            for c in &cc.changes {
                let (op, id) = match c {
                    ConfChangeSingle::AddVoter(id) => (CHANGE_ADD_VOTER, id),
                    ConfChangeSingle::AddLearner(id) => (CHANGE_ADD_LEARNER, id),
                    ConfChangeSingle::Remove(id) => (CHANGE_REMOVE, id),
                };
                out.push(op);
                put_varint(out, id.0);
            }
            if !cc.context.is_empty() {
                put_bytes(out, &cc.context);
            }
        }
    }
}

fn put_snapshot(out: &mut Vec<u8>, s: &Snapshot) {
    put_varints(out, &[s.meta.index.0, s.meta.term.0]);
    let cs = &s.meta.conf_state;
    put_flag(out, cs.auto_leave);
    for set in [&cs.voters, &cs.voters_outgoing, &cs.learners, &cs.learners_next] {
        put_ids(out, set);
    }
    put_bytes(out, &s.data);
}

fn put_ctxs(out: &mut Vec<u8>, ctxs: &[ReadCtx]) {
    put_varint(out, ctxs.len() as u64);
    for c in ctxs {
        put_bytes(out, &c.0);
    }
}

/// A cursor over a payload. It keeps the `Bytes` (not a `&[u8]`) so that byte strings come out
/// as slices sharing the payload's buffer instead of copies. The struct literals below read
/// their fields in wire order: Rust evaluates field expressions in the order they are written.
struct Reader {
    buf: Bytes,
    pos: usize,
}

impl Reader {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        let b = *self.buf.get(self.pos).ok_or(DecodeError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            // The tenth byte holds bit 63 alone; anything more does not fit in a u64.
            if shift == 63 && b > 1 {
                return Err(DecodeError::VarintOverflow);
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError::VarintOverflow)
    }

    fn flag(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(DecodeError::UnknownTag { what, tag }),
        }
    }

    /// Reads a count of items that take at least `min_len` bytes each, refusing one the rest of
    /// the payload cannot hold; callers may then reserve the count safely.
    fn count(&mut self, min_len: usize) -> Result<usize, DecodeError> {
        let n = self.varint()?;
        match usize::try_from(n) {
            Ok(n) if n <= self.remaining() / min_len => Ok(n),
            _ => Err(DecodeError::Truncated),
        }
    }

    /// Reads `count | item*`, reserving no more than the rest of the payload can hold.
    fn list<T>(
        &mut self,
        min_len: usize,
        mut item: impl FnMut(&mut Reader) -> Result<T, DecodeError>,
    ) -> Result<Vec<T>, DecodeError> {
        let n = self.count(min_len)?;
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push(item(self)?);
        }
        Ok(items)
    }

    fn bytes(&mut self) -> Result<Bytes, DecodeError> {
        let len = self.count(MIN_BYTES_LEN)?;
        let b = self.buf.slice(self.pos..self.pos + len);
        self.pos += len;
        Ok(b)
    }

    fn finish(self) -> Result<(), DecodeError> {
        if self.remaining() != 0 {
            return Err(DecodeError::TrailingBytes);
        }
        Ok(())
    }

    fn message(&mut self) -> Result<Message, DecodeError> {
        let from = NodeId(self.varint()?);
        let to = NodeId(self.varint()?);
        let term = Term(self.varint()?);
        let body = match self.u8()? {
            TAG_APPEND => MessageBody::Append {
                prev_index: LogIndex(self.varint()?),
                prev_term: Term(self.varint()?),
                commit: LogIndex(self.varint()?),
                entries: self.list(MIN_ENTRY_LEN, Reader::entry)?,
            },
            TAG_APPEND_RESP => {
                let index = LogIndex(self.varint()?);
                let reject = if self.flag("reject hint")? {
                    Some(RejectHint { index: LogIndex(self.varint()?), term: Term(self.varint()?) })
                } else {
                    None
                };
                MessageBody::AppendResp { index, reject }
            }
            TAG_VOTE => MessageBody::Vote {
                pre_vote: self.flag("pre-vote")?,
                last_index: LogIndex(self.varint()?),
                last_term: Term(self.varint()?),
                transfer: self.flag("transfer")?,
            },
            TAG_VOTE_RESP => MessageBody::VoteResp {
                pre_vote: self.flag("pre-vote")?,
                granted: self.flag("granted")?,
            },
            TAG_HEARTBEAT => MessageBody::Heartbeat {
                commit: LogIndex(self.varint()?),
                seq: HeartbeatSeq(self.varint()?),
            },
            TAG_HEARTBEAT_RESP => MessageBody::HeartbeatResp { seq: HeartbeatSeq(self.varint()?) },
            TAG_SNAPSHOT => MessageBody::Snapshot { snapshot: self.snapshot()? },
            TAG_PROPOSE => {
                MessageBody::Propose { payloads: self.list(MIN_PAYLOAD_LEN, Reader::payload)? }
            }
            TAG_READ_INDEX => MessageBody::ReadIndex { ctxs: self.ctxs()? },
            TAG_READ_INDEX_RESP => {
                MessageBody::ReadIndexResp { ctxs: self.ctxs()?, index: LogIndex(self.varint()?) }
            }
            TAG_TRANSFER_LEADER => MessageBody::TransferLeader { target: NodeId(self.varint()?) },
            TAG_TIMEOUT_NOW => MessageBody::TimeoutNow,
            tag => return Err(DecodeError::UnknownTag { what: "message", tag }),
        };
        Ok(Message { from, to, term, body })
    }

    fn entry(&mut self) -> Result<Entry, DecodeError> {
        Ok(Entry {
            term: Term(self.varint()?),
            index: LogIndex(self.varint()?),
            payload: self.payload()?,
        })
    }

    fn payload(&mut self) -> Result<EntryPayload, DecodeError> {
        match self.u8()? {
            PAYLOAD_NORMAL => Ok(EntryPayload::Normal(self.bytes()?)),
            tag @ (PAYLOAD_CONF_CHANGE | PAYLOAD_CONF_CONTEXT) => {
                let explicit = self.flag("leave-joint")?;
                let leave_joint = if explicit { LeaveJoint::Explicit } else { LeaveJoint::Auto };
                let changes = self.list(MIN_CHANGE_LEN, Reader::change)?;
                let context =
                    if tag == PAYLOAD_CONF_CONTEXT { self.bytes()? } else { Bytes::new() };
                Ok(EntryPayload::ConfChange(ConfChange { changes, leave_joint, context }))
            }
            tag => Err(DecodeError::UnknownTag { what: "entry payload", tag }),
        }
    }

    fn change(&mut self) -> Result<ConfChangeSingle, DecodeError> {
        let op = self.u8()?;
        let id = NodeId(self.varint()?);
        match op {
            CHANGE_ADD_VOTER => Ok(ConfChangeSingle::AddVoter(id)),
            CHANGE_ADD_LEARNER => Ok(ConfChangeSingle::AddLearner(id)),
            CHANGE_REMOVE => Ok(ConfChangeSingle::Remove(id)),
            tag => Err(DecodeError::UnknownTag { what: "membership change", tag }),
        }
    }

    fn snapshot(&mut self) -> Result<Snapshot, DecodeError> {
        let index = LogIndex(self.varint()?);
        let term = Term(self.varint()?);
        let auto_leave = self.flag("auto-leave")?;
        let conf_state = ConfState {
            voters: self.ids()?,
            voters_outgoing: self.ids()?,
            learners: self.ids()?,
            learners_next: self.ids()?,
            auto_leave,
        };
        let data = self.bytes()?;
        Ok(Snapshot { meta: SnapshotMeta { index, term, conf_state }, data })
    }

    /// Reads an id set, insisting on the encoder's strictly ascending order: a duplicate would
    /// otherwise vanish silently and the set decode to something other than what was sent.
    fn ids(&mut self) -> Result<BTreeSet<NodeId>, DecodeError> {
        let ids = self.list(MIN_ID_LEN, Reader::varint)?;
        if ids.windows(2).any(|w| w[0] >= w[1]) {
            return Err(DecodeError::UnorderedIds);
        }
        Ok(ids.into_iter().map(NodeId).collect())
    }

    fn ctxs(&mut self) -> Result<Vec<ReadCtx>, DecodeError> {
        self.list(MIN_BYTES_LEN, |r| r.bytes().map(ReadCtx))
    }
}
