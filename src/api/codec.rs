//! The gRPC codec: prost's, except that a message that does not decode is
//! the sender's fault. prost refuses, for example, a string field that is
//! not valid UTF-8; tonic would answer INTERNAL, as if the server had
//! failed. Here it is INVALID_ARGUMENT with prost's reason, which names the
//! message and field.

use prost::Message;
use tonic::{
    Code, Status,
    codec::{BufferSettings, DecodeBuf},
};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

use crate::Error;

#[derive(Debug, Clone)]
pub struct Codec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(ProstCodec::default())
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = Decoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic::codec::Codec::encoder(&mut self.0)
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decoder(tonic::codec::Codec::decoder(&mut self.0))
    }
}

#[derive(Debug)]
pub struct Decoder<U>(ProstDecoder<U>);

impl<U: Message + Default> tonic::codec::Decoder for Decoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| match status.code() {
            Code::Internal => Status::from(Error::Undecodable(status.message().to_owned())),
            _ => status,
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
