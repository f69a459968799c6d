//! The clients of the other nodes a router passes calls on to: a channel
//! kept per node (TLS where the node is advertised at https://), and a
//! bounded number of calls to each at once.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::{CONNECT_TIMEOUT, KEPT_CLIENTS, PeerClient};
use crate::{Error, cluster::Cluster, metrics};

pub(super) struct Peers {
    cluster: Arc<Cluster>,
    tls: Option<ClientTlsConfig>,
    /// Calls to one other node at once, at most.
    per_peer: usize,
    /// The largest answer read from another node.
    max_answer: usize,
    clients: Mutex<HashMap<String, (Channel, Arc<Semaphore>)>>,
}

impl Peers {
    pub(super) fn new(
        cluster: Arc<Cluster>,
        tls: Option<ClientTlsConfig>,
        per_peer: usize,
        max_answer: usize,
    ) -> Peers {
        Peers { cluster, tls, per_peer: per_peer.max(1), max_answer, clients: Mutex::new(HashMap::new()) }
    }

    /// A client of the node at `addr`, and one of the slots for calls to
    /// it: none free (that many calls to it unanswered, as when it hangs)
    /// fails the call at once rather than holding the caller's admission
    /// too, so that a node that does not answer costs only its own shards.
    pub(super) fn client<C: PeerClient>(&self, addr: &str) -> Result<(C, OwnedSemaphorePermit), Error> {
        let (channel, slots) = self.peer(addr)?;
        let slot = slots.try_acquire_owned().map_err(|_| {
            metrics::FORWARD_REFUSED.inc();
            tracing::warn!(node = %addr, calls = self.per_peer, "every slot for calls to the node that owns a shard is taken");
            Error::Relayed {
                code: tonic::Code::Unavailable as i32,
                message: format!(
                    "the node that owns the message's shard has {} calls from this node unanswered; retry with \
                     backoff",
                    self.per_peer
                ),
                details: Vec::new(),
            }
        })?;
        Ok((C::on(channel, self.max_answer), slot))
    }

    fn peer(&self, addr: &str) -> Result<(Channel, Arc<Semaphore>), Error> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((client, slots)) = clients.get(addr) {
            return Ok((client.clone(), Arc::clone(slots)));
        }
        // Nodes come and go (a new address per restart in some setups):
        // keep those the routing topic names.
        if clients.len() >= KEPT_CLIENTS {
            let named = self.cluster.peers();
            clients.retain(|kept, _| named.contains(kept));
        }
        // The caller learns nothing of the cluster's addresses; the log does.
        let unreachable = |e: &dyn std::fmt::Display| {
            tracing::warn!(node = %addr, error = %e, "no client for the node that owns a shard");
            Error::Relayed {
                code: tonic::Code::Unavailable as i32,
                message: "cannot reach the node that owns the message's shard".to_owned(),
                details: Vec::new(),
            }
        };
        let mut endpoint = Endpoint::from_shared(addr.to_owned())
            .map_err(|e| unreachable(&e))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(10));
        if addr.starts_with("https://") {
            endpoint =
                endpoint.tls_config(self.tls.clone().unwrap_or_default()).map_err(|e| unreachable(&e))?;
        } else if self.tls.is_some() {
            // This node speaks TLS, so the cluster does: an address
            // without it is not one of its nodes', or a mistake.
            return Err(unreachable(&"a plaintext address in a cluster whose nodes speak TLS"));
        }
        let channel = endpoint.connect_lazy();
        let slots = Arc::new(Semaphore::new(self.per_peer));
        clients.insert(addr.to_owned(), (channel.clone(), Arc::clone(&slots)));
        Ok((channel, slots))
    }
}
