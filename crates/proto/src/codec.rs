//! The gRPC codec every cairn service and client uses: prost messages, as tonic's own codec,
//! with buffers sized for etcd's messages.
//!
//! tonic starts each call's encode and decode buffers at 8 KiB. etcd requests and responses are
//! mostly tens to hundreds of bytes, so two 8 KiB allocations per call cost more than the
//! message: they miss the allocator's small-size caches and show up as `malloc`/`free` work in
//! server profiles. Buffers here start at 1 KiB and grow as a message needs, so large values and
//! big range responses still work (tests/compat writes and reads back a 1.4 MiB value).
//!
//! Decoding is prost's, with one difference in how a failure is reported: prost refuses
//! messages nested more than 100 deep (so hostile input cannot exhaust the stack), and tonic
//! reports that like any malformed message, as `Internal`. In etcd's schema only transactions
//! nest (a `TxnRequest` in a `RequestOp` in a `TxnRequest`, two levels per transaction), so a
//! request that deep is a client asking for too much, not a fault: it gets `InvalidArgument`
//! with [`NESTED_TOO_DEEPLY`], as a transaction nested past cairn's own limit does.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, DecodeBuf};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstEncoder};

/// What a client hears when its request nests deeper than decoding allows: the message cairn
/// gives a transaction nested past its limit (`cairn_kv::KvError::TxnTooDeep`).
pub const NESTED_TOO_DEEPLY: &str = "cairn: transactions nested too deeply";

/// The end of prost's description of a message nested past its recursion limit. prost does not
/// expose the error's kind, only its text; the server's tests catch a change of wording.
const RECURSION_LIMIT: &str = "recursion limit reached";

/// Starting size of a call's encode and decode buffer.
const BUFFER_BYTES: usize = 1024;
/// Starting size for the long-lived Watch streams: none. Each stream holds its two buffers for
/// as long as it is open, idle or not, and a member may hold thousands of streams; an empty
/// buffer allocates on first use, as much as the message needs, and keeps it for the next one
/// (100 idle streams of 100 watchers: 4 bytes less per watcher than 256-byte buffers).
const STREAM_BUFFER_BYTES: usize = 0;
/// tonic's default: how much a streaming call encodes before it yields to the runtime.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// A [`tonic::codec::Codec`] for prost messages whose buffers start at `BYTES`.
#[derive(Debug)]
pub struct SizedCodec<T, U, const BYTES: usize>(PhantomData<(T, U)>);

/// The codec of every service but Watch.
pub type Codec<T, U> = SizedCodec<T, U, BUFFER_BYTES>;

/// The codec of the Watch service's streams.
pub type StreamCodec<T, U> = SizedCodec<T, U, STREAM_BUFFER_BYTES>;

impl<T, U, const BYTES: usize> Default for SizedCodec<T, U, BYTES> {
    fn default() -> Self {
        SizedCodec(PhantomData)
    }
}

impl<T, U, const BYTES: usize> tonic::codec::Codec for SizedCodec<T, U, BYTES>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = Decoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::new(BYTES, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decoder { settings: BufferSettings::new(BYTES, YIELD_THRESHOLD), _message: PhantomData }
    }
}

/// Decodes prost messages, reporting nesting past prost's limit as `InvalidArgument` (see the
/// module's comment) and any other malformed message as `Internal`, as grpc-go does.
#[derive(Debug)]
pub struct Decoder<U> {
    settings: BufferSettings,
    _message: PhantomData<U>,
}

impl<U: Message + Default> tonic::codec::Decoder for Decoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|e| decode_status(&e))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.settings
    }
}

/// The status a malformed message is answered with.
pub fn decode_status(e: &prost::DecodeError) -> Status {
    let text = e.to_string();
    if text.ends_with(RECURSION_LIMIT) {
        Status::invalid_argument(NESTED_TOO_DEEPLY)
    } else {
        Status::internal(text)
    }
}
