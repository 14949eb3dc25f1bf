//! Reading one small frame ([`crate::codec`]'s `len | crc | payload`) off a connection, as
//! replies, probes and snapshot stream frames are read. The message connection reads only the
//! header here ([`read_header`]) and its payload in `inbound.rs`, growing its buffer with the
//! bytes that arrive, since its limit is large.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::codec::{self, DecodeError};

/// One frame's payload and checksum, read whole after its header was checked against `max`;
/// `None` when the other end hung up between frames.
pub(crate) async fn read_payload<S, E>(conn: &mut S, max: u32) -> Result<Option<(Bytes, u32)>, E>
where
    S: AsyncRead + Unpin,
    E: From<std::io::Error> + From<DecodeError>,
{
    let Some((len, crc)) = read_header::<S, E>(conn, max).await? else { return Ok(None) };
    let mut payload = BytesMut::zeroed(len as usize);
    conn.read_exact(&mut payload).await?;
    Ok(Some((payload.freeze(), crc)))
}

/// One frame's header, checked against `max`: its payload's length and checksum; `None` when
/// the other end hung up between frames. The message connection reads its payloads itself.
pub(crate) async fn read_header<S, E>(conn: &mut S, max: u32) -> Result<Option<(u32, u32)>, E>
where
    S: AsyncRead + Unpin,
    E: From<std::io::Error> + From<DecodeError>,
{
    let mut header = [0u8; codec::FRAME_HEADER_LEN];
    match conn.read_exact(&mut header).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    Ok(Some(codec::parse_frame_header(&header, max)?))
}
