//! The console's listener: each connection accepted (at most
//! [`MAX_CONNECTIONS`] at once, and at most
//! `--console-connections-per-peer` from one address), its TLS handshake
//! when the console has a certificate, then HTTP/1.1 on it, until `stop`.
//! Each request reaches the pages with its peer's address
//! ([`ConnectInfo`]), which the guard and sign-in look at.
//!
//! Time: a TLS handshake, and a request's head, must arrive within
//! `--console-request-timeout`; hyper's head timer runs from when the
//! connection waits for a request, so a kept-alive connection that starts
//! none within it is closed too. (The body's share of that bound is the
//! guard's: [`super::guard`].)

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::extract::ConnectInfo;
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
use tokio_util::sync::CancellationToken;

use crate::tls::LiveTls;

/// Connections served at once; more wait to be accepted.
pub(super) const MAX_CONNECTIONS: usize = 256;

/// How the listener bounds its clients.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Longest a TLS handshake, a request's head (or the wait for it on a
    /// kept-alive connection) may take.
    pub request_timeout: Duration,
    /// Connections one peer (one IPv4 address, one IPv6 /64) may hold.
    pub per_peer: usize,
}

impl Limits {
    pub(crate) fn of(config: &crate::config::Config) -> Limits {
        Limits {
            request_timeout: *config.console_request_timeout,
            per_peer: config.console_connections_per_peer,
        }
    }
}

pub(super) async fn serve(
    listener: TcpListener,
    tls: Option<LiveTls>,
    app: axum::Router,
    limits: Limits,
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let peers = Peers::new(limits.per_peer);
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
        // Closed at once, unanswered: a peer over its share would otherwise
        // take every connection slot, from the other peers.
        let Some(held) = peers.enter(peer.ip()) else {
            tracing::debug!(%peer, "a console connection refused: its address holds its share already");
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, app, stop) = (tls.as_ref().map(LiveTls::acceptor), app.clone(), stop.clone());
        let timeout = limits.request_timeout;
        tokio::spawn(async move {
            let (_slot, _held) = (slot, held);
            match acceptor {
                None => connection(tcp, app, timeout, stop, peer).await,
                Some(acceptor) => match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => connection(stream, app, timeout, stop, peer).await,
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "a console TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "a console TLS handshake took too long"),
                },
            }
        });
    }
}

async fn connection<S>(
    stream: S,
    app: axum::Router,
    timeout: Duration,
    stop: CancellationToken,
    peer: SocketAddr,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new()).http1_only();
    builder.http1().timer(TokioTimer::new()).header_read_timeout(timeout);
    let app = TowerToHyperService::new(app);
    let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        hyper::service::Service::call(&app, request)
    });
    let served = builder.serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = stop.cancelled() => {}
        served = served => if let Err(e) = served {
            tracing::debug!(%peer, error = %e, "a console connection ended");
        },
    }
}

/// Whom a bound per peer counts: an IPv4 address (an IPv4-mapped IPv6 one
/// as the IPv4 it is), or an IPv6 /64, the least a host is handed.
pub(super) fn peer_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        v4 => v4,
    }
}

/// Connections held per peer.
struct Peers {
    most: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection of a peer's share, given back when dropped.
struct Held {
    peers: Arc<Peers>,
    key: IpAddr,
}

impl Peers {
    fn new(most: usize) -> Arc<Peers> {
        Arc::new(Peers { most, held: Mutex::new(HashMap::new()) })
    }

    fn enter(self: &Arc<Self>, ip: IpAddr) -> Option<Held> {
        let key = peer_key(ip);
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let count = held.entry(key).or_default();
        if *count >= self.most {
            return None;
        }
        *count += 1;
        Some(Held { peers: Arc::clone(self), key })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.peers.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = held.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_holds_its_share_and_gives_it_back() {
        let peers = Peers::new(2);
        let one: IpAddr = "10.0.0.1".parse().unwrap();
        let (a, b) = (peers.enter(one).unwrap(), peers.enter(one).unwrap());
        assert!(peers.enter(one).is_none(), "over its share");
        assert!(peers.enter("10.0.0.2".parse().unwrap()).is_some(), "another address has its own");
        drop(a);
        assert!(peers.enter(one).is_some(), "one given back");
        drop(b);
    }

    #[test]
    fn an_ipv6_host_counts_as_its_64_and_a_mapped_ipv4_as_itself() {
        let key = |s: &str| peer_key(s.parse().unwrap());
        assert_eq!(key("2001:db8:1:2:aaaa::1"), key("2001:db8:1:2:bbbb::2"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("::ffff:192.0.2.7"), key("192.0.2.7"));
    }
}
