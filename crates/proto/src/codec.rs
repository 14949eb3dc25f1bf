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
/// tonic's default: how much a streaming call encodes before it yields to the runtime.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// A [`tonic::codec::Codec`] for prost messages with small starting buffers.
#[derive(Debug)]
pub struct Codec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(PhantomData)
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD)
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}
