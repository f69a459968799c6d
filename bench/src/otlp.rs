//! `--trace`: the bench's calls carry a sampled W3C `traceparent` and the
//! server exports its spans (`--otlp-endpoint`) to a collector in this
//! process, which decodes every export and counts the spans in it. The
//! cost of tracing is then measured with its export, not beside a refused
//! connection.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use anyhow::Context as _;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
    trace_service_server::{TraceService, TraceServiceServer},
};
use tokio_util::sync::CancellationToken;

/// An OTLP/gRPC receiver on a free loopback port, until dropped.
pub struct Collector {
    pub endpoint: String,
    spans: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl Collector {
    pub async fn start() -> anyhow::Result<Collector> {
        let listener =
            tokio::net::TcpListener::bind("127.0.0.1:0").await.context("a port for the OTLP collector")?;
        let addr: SocketAddr = listener.local_addr()?;
        let spans = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let service = TraceServiceServer::new(Count(Arc::clone(&spans))).max_decoding_message_size(64 << 20);
        let server = tonic::transport::Server::builder().add_service(service).serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            stop.clone().cancelled_owned(),
        );
        tokio::spawn(async move {
            if let Err(e) = server.await {
                eprintln!("bench: the OTLP collector stopped: {e}");
            }
        });
        Ok(Collector { endpoint: format!("http://{addr}"), spans, stop })
    }

    /// Spans received so far.
    pub fn spans(&self) -> u64 {
        self.spans.load(Ordering::Relaxed)
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

struct Count(Arc<AtomicU64>);

#[tonic::async_trait]
impl TraceService for Count {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans: usize =
            request.get_ref().resource_spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len()).sum();
        self.0.fetch_add(spans as u64, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

/// A sampled `traceparent` of a new trace, as a caller's tracer makes one
/// for each request.
pub fn traceparent() -> tonic::metadata::AsciiMetadataValue {
    let (trace, span): (u128, u64) = (rand::random::<u128>() | 1, rand::random::<u64>() | 1);
    format!("00-{trace:032x}-{span:016x}-01").parse().expect("a traceparent is ASCII")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_traceparent_is_w3c_shaped_and_new_each_time() {
        let (a, b) = (super::traceparent(), super::traceparent());
        let a = a.to_str().unwrap();
        let parts: Vec<_> = a.split('-').collect();
        assert_eq!(
            (parts.len(), parts[0], parts[1].len(), parts[2].len(), parts[3]),
            (4, "00", 32, 16, "01")
        );
        assert_ne!(a, b.to_str().unwrap());
    }
}
