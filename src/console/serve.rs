//! The console's listener: each connection accepted (at most
//! [`MAX_CONNECTIONS`] at once), its TLS handshake when the console has a
//! certificate (bounded in time), then HTTP/1.1 on it with a bound on how
//! long a request's head may take to arrive, until `stop`.

use std::{sync::Arc, time::Duration};

use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
    service::TowerToHyperService,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
    sync::Semaphore,
};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// Connections served at once; more wait to be accepted.
pub const MAX_CONNECTIONS: usize = 256;
/// Longest a TLS handshake, or a request's head, may take.
const HANDSHAKE: Duration = Duration::from_secs(10);

pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    app: axum::Router,
    stop: CancellationToken,
) {
    let acceptor = tls.map(TlsAcceptor::from);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let slot = tokio::select! {
            _ = stop.cancelled() => return,
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => return,
            },
        };
        let (tcp, peer) = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, say: wait rather than spin.
                    tracing::warn!(error = %e, "the console cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, app, stop) = (acceptor.clone(), app.clone(), stop.clone());
        tokio::spawn(async move {
            let _slot = slot;
            match acceptor {
                None => connection(tcp, app, stop, peer).await,
                Some(acceptor) => match tokio::time::timeout(HANDSHAKE, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => connection(stream, app, stop, peer).await,
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "a console TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "a console TLS handshake took too long"),
                },
            }
        });
    }
}

async fn connection<S>(stream: S, app: axum::Router, stop: CancellationToken, peer: std::net::SocketAddr)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new()).http1_only();
    builder.http1().timer(TokioTimer::new()).header_read_timeout(HANDSHAKE);
    let served = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    tokio::select! {
        _ = stop.cancelled() => {}
        served = served => if let Err(e) = served {
            tracing::debug!(%peer, error = %e, "a console connection ended");
        },
    }
}
