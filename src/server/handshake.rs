//! TLS on the gRPC port, terminated here rather than by tonic, so that the
//! port offers HTTP/1.1 beside HTTP/2 in ALPN: the JSON door and gRPC-Web
//! are called over HTTP/1.1 by clients that speak nothing else (Python's
//! urllib3, `curl --http1.1`). Handshakes run side by side, each within a
//! bound, so that a client that stalls one holds up no other connection.

use std::{
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use futures_util::stream::{FuturesUnordered, Stream};
use tokio_rustls::server::TlsStream;

use super::limits::{Limited, LimitedIncoming};
use crate::tls::LiveTls;

/// How long a client may take over its handshake.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);

type Handshake = Pin<Box<dyn Future<Output = Option<TlsStream<Limited>>> + Send>>;

/// The connections of `inner` once their handshake is done; those whose
/// handshake fails or stalls are closed (and their place given back).
pub(super) struct TlsIncoming {
    inner: LimitedIncoming,
    tls: LiveTls,
    handshakes: FuturesUnordered<Handshake>,
    ended: bool,
}

impl TlsIncoming {
    pub(super) fn new(inner: LimitedIncoming, tls: LiveTls) -> TlsIncoming {
        TlsIncoming { inner, tls, handshakes: FuturesUnordered::new(), ended: false }
    }
}

impl Stream for TlsIncoming {
    type Item = std::io::Result<TlsStream<Limited>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        while !self.ended {
            match Pin::new(&mut self.inner).poll_next(cx) {
                Poll::Ready(Some(Ok(connection))) => {
                    let accept = self.tls.acceptor().accept(connection);
                    // On a task of its own: handshakes use the cores the
                    // runtime has, not the accepting task's alone.
                    let handshake = tokio::spawn(async move {
                        match tokio::time::timeout(HANDSHAKE_WITHIN, accept).await {
                            Ok(Ok(stream)) => Some(stream),
                            Ok(Err(e)) => {
                                tracing::debug!(error = %e, "a TLS handshake failed");
                                None
                            }
                            Err(_) => {
                                tracing::debug!("a TLS handshake took too long");
                                None
                            }
                        }
                    });
                    self.handshakes.push(Box::pin(async move { handshake.await.ok().flatten() }));
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => self.ended = true,
                Poll::Pending => break,
            }
        }
        loop {
            match Pin::new(&mut self.handshakes).poll_next(cx) {
                Poll::Ready(Some(Some(stream))) => return Poll::Ready(Some(Ok(stream))),
                Poll::Ready(Some(None)) => continue,
                Poll::Ready(None) if self.ended => return Poll::Ready(None),
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}
