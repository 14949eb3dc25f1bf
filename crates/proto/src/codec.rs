//! The gRPC codec every cairn service and client uses: prost messages, as tonic's own codec,
//! with buffers sized for etcd's messages.
//!
//! tonic starts each call's encode and decode buffers at 8 KiB. etcd requests and responses are
//! mostly tens to hundreds of bytes, so two 8 KiB allocations per call cost more than the
//! message: they miss the allocator's small-size caches and show up as `malloc`/`free` work in
//! server profiles. Buffers here start at 1 KiB and grow as a message needs, so large values and
//! big range responses still work (tests/compat writes and reads back a 1.4 MiB value).

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::BufferSettings;
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

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
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::new(BYTES, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(BufferSettings::new(BYTES, YIELD_THRESHOLD))
    }
}
