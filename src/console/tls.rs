//! The console over TLS: each accepted connection's handshake (bounded in
//! time), then HTTP/1.1 on it, until `stop`.

use std::{sync::Arc, time::Duration};

use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
    service::TowerToHyperService,
};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// Longest a handshake may take.
const HANDSHAKE: Duration = Duration::from_secs(10);

pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: axum::Router,
    stop: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(tls);
    loop {
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
        let (acceptor, app, stop) = (acceptor.clone(), app.clone(), stop.clone());
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "a console TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let connection = auto::Builder::new(TokioExecutor::new())
                .http1_only()
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app))
                .into_owned();
            tokio::select! {
                _ = stop.cancelled() => {}
                served = connection => if let Err(e) = served {
                    tracing::debug!(%peer, error = %e, "a console connection ended");
                },
            }
        });
    }
}
