//! What bounds the resources clients can take from the server before any
//! call is read: connections (accepted no faster than they close past
//! `max_connections`) and gRPC health `Watch` streams (which need no token).
//! Calls and request bytes are bounded in `api`.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use http_body_util::BodyExt as _;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    sync::{OwnedSemaphorePermit, Semaphore},
};
use tokio_stream::Stream;
use tokio_util::sync::PollSemaphore;
use tonic::{
    Status,
    body::Body,
    codegen::{Service, http},
    server::NamedService,
    transport::server::{Connected, TcpConnectInfo, TcpIncoming},
};

/// Accepted connections, each holding one of `max` places until it closes.
/// At the limit the listener is not polled, so new connections wait in the
/// kernel's backlog instead of costing memory here.
pub(super) struct LimitedIncoming {
    inner: TcpIncoming,
    places: PollSemaphore,
    place: Option<OwnedSemaphorePermit>,
}

impl LimitedIncoming {
    pub(super) fn new(inner: TcpIncoming, max: usize) -> LimitedIncoming {
        LimitedIncoming { inner, places: PollSemaphore::new(Arc::new(Semaphore::new(max))), place: None }
    }
}

impl Stream for LimitedIncoming {
    type Item = std::io::Result<Limited>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.place.is_none() {
            match ready!(self.places.poll_acquire(cx)) {
                Some(place) => self.place = Some(place),
                None => return Poll::Ready(None),
            }
        }
        match ready!(Pin::new(&mut self.inner).poll_next(cx)) {
            Some(Ok(io)) => {
                let place = self.place.take().expect("a place was taken above");
                Poll::Ready(Some(Ok(Limited { io, _place: place })))
            }
            Some(Err(e)) => Poll::Ready(Some(Err(e))),
            None => Poll::Ready(None),
        }
    }
}

/// A connection and its place among the open ones.
pub(super) struct Limited {
    io: TcpStream,
    _place: OwnedSemaphorePermit,
}

impl Connected for Limited {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

impl AsyncRead for Limited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Limited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The health service with its `Watch` streams bounded: each holds one of
/// `max` places for as long as its answer stream lives; past that, a Watch
/// is refused with RESOURCE_EXHAUSTED. `Check` is unaffected.
#[derive(Clone)]
pub(super) struct BoundedWatch<S> {
    inner: S,
    places: Arc<Semaphore>,
    max: usize,
}

impl<S> BoundedWatch<S> {
    pub(super) fn new(inner: S, max: usize) -> Self {
        BoundedWatch { inner, places: Arc::new(Semaphore::new(max)), max }
    }
}

impl<S: NamedService> NamedService for BoundedWatch<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for BoundedWatch<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = std::convert::Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = std::convert::Infallible;
    type Future =
        Pin<Box<dyn Future<Output = Result<http::Response<Body>, std::convert::Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if !request.uri().path().ends_with("/Watch") {
            return Box::pin(self.inner.call(request));
        }
        let Ok(place) = Arc::clone(&self.places).try_acquire_owned() else {
            let status = Status::from(crate::Error::TooManyWatches(self.max));
            return Box::pin(async move { Ok(status.into_http()) });
        };
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            // The place goes with the answer stream: freed when it ends or
            // the client goes away.
            Ok(response.map(|body| {
                Body::new(body.map_frame(move |frame| {
                    let _ = &place;
                    frame
                }))
            }))
        })
    }
}
