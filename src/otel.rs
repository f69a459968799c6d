//! A trace across the delay. A Schedule call's W3C trace context (the
//! `traceparent` and `tracestate` of its gRPC metadata, of an HTTP call's
//! headers, or of an ingress record's headers) is kept with the message as
//! record headers of the same names, so the delivered record carries it and
//! its consumer continues the trace.
//!
//! With `--otlp-endpoint`, two spans are exported over OTLP (gRPC): the
//! Schedule call's (a server span, child of the caller's), whose context is
//! the one kept; and the dispatch's (a producer span when the record is
//! handed to Kafka, child of the scheduling span and linked to it, as
//! OpenTelemetry's messaging conventions ask for deferred work), whose
//! context the delivered record then carries. Spans follow the caller's
//! sampled flag. Without the flag nothing is exported and no span is made:
//! a message without trace headers costs one check of a `OnceLock` more.
//!
//! Log lines follow the trace too: a call that comes with a `traceparent`
//! (on any door) runs in a `call` log span whose `trace_id` and `span_id`
//! (the caller's span) each of its lines carries (under `span` in
//! `--log-format json`).

use std::{sync::OnceLock, time::Duration};

use opentelemetry::{
    Context, KeyValue,
    trace::{
        Link, Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId,
        TraceState, Tracer as _, TracerProvider as _,
    },
};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::{
    SdkTracer, SdkTracerProvider, span_processor_with_async_runtime::BatchSpanProcessor,
};

use crate::proto;

/// The record header that carries the trace context (W3C Trace Context),
/// and its vendor part, passed as given.
pub(crate) const TRACEPARENT: &str = crate::message::TRACE_HEADERS[0];
const TRACESTATE: &str = crate::message::TRACE_HEADERS[1];
/// The longest `tracestate` kept (W3C: 32 members of up to 256 characters;
/// 512 is what implementations are told they may cut it to).
const MAX_TRACESTATE: usize = 512;

static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// The exporter, while spans are exported: [`Exporting::shutdown`] sends
/// what is left.
pub(crate) struct Exporting(SdkTracerProvider);

impl Exporting {
    pub(crate) async fn shutdown(self) {
        let provider = self.0;
        let done =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(Duration::from_secs(5)));
        if let Ok(Err(e)) = done.await {
            tracing::warn!(error = %e, "the last spans could not be exported");
        }
    }
}

/// Why spans cannot be exported.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExportError {
    #[error("--otlp-endpoint {endpoint}: {source}")]
    Exporter { endpoint: String, source: opentelemetry_otlp::ExporterBuildError },
    #[error("spans are exported already (one --otlp-endpoint per process)")]
    Twice,
}

/// Starts exporting spans to `endpoint` (an OTLP/gRPC collector, such as
/// http://127.0.0.1:4317). Once per process.
pub(crate) fn export_to(endpoint: &str) -> Result<Exporting, ExportError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .with_timeout(Duration::from_secs(10))
        .build()
        .map_err(|source| ExportError::Exporter { endpoint: endpoint.to_owned(), source })?;
    let processor = BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
    let resource = opentelemetry_sdk::Resource::builder().with_service_name("hourglass").build();
    let provider =
        SdkTracerProvider::builder().with_span_processor(processor).with_resource(resource).build();
    TRACER.set(provider.tracer("hourglass")).map_err(|_| ExportError::Twice)?;
    Ok(Exporting(provider))
}

/// A W3C `traceparent`: version 00, a trace id, the parent span's id and
/// the flags, in lower-case hex.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TraceParent {
    trace_id: TraceId,
    span_id: SpanId,
    flags: TraceFlags,
}

impl TraceParent {
    /// A valid header's context; `None` for anything else (ignored, as the
    /// W3C recommendation says, rather than refused).
    pub(crate) fn parse(text: &[u8]) -> Option<TraceParent> {
        let text = std::str::from_utf8(text).ok()?.trim();
        let mut parts = text.split('-');
        let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex =
            |s: &str, len: usize| s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        // A later version may add fields after these; 00 has none.
        if !hex(version, 2) || version == "ff" || (version == "00" && parts.next().is_some()) {
            return None;
        }
        if !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
            return None;
        }
        let trace_id = TraceId::from_hex(trace).ok().filter(|id| *id != TraceId::INVALID)?;
        let span_id = SpanId::from_hex(span).ok().filter(|id| *id != SpanId::INVALID)?;
        let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()? & TraceFlags::SAMPLED.to_u8());
        Some(TraceParent { trace_id, span_id, flags })
    }

    fn of(context: &SpanContext) -> TraceParent {
        TraceParent { trace_id: context.trace_id(), span_id: context.span_id(), flags: context.trace_flags() }
    }

    pub(crate) fn header(&self) -> String {
        format!("00-{}-{}-{:02x}", self.trace_id, self.span_id, self.flags.to_u8())
    }

    fn remote(&self, state: TraceState) -> SpanContext {
        SpanContext::new(self.trace_id, self.span_id, self.flags, true, state)
    }
}

fn header<'a>(headers: &'a [proto::Header], name: &str) -> Option<&'a [u8]> {
    headers.iter().find(|h| h.key.eq_ignore_ascii_case(name)).map(|h| h.value.as_slice())
}

fn trace_state(value: Option<&[u8]>) -> TraceState {
    value
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.parse::<TraceState>().ok())
        .unwrap_or_default()
}

/// The log span of a call that comes with a valid `traceparent` header,
/// naming its trace and span; a disabled span for any other call.
pub(crate) fn log_span(headers: &tonic::codegen::http::HeaderMap) -> tracing::Span {
    let Some(given) = headers.get(TRACEPARENT).and_then(|v| TraceParent::parse(v.as_bytes())) else {
        return tracing::Span::none();
    };
    tracing::info_span!(
        "call",
        trace_id = %given.trace_id,
        span_id = %given.span_id,
    )
}

/// The span of a Schedule call, ended when the call is answered.
pub(crate) struct CallSpan(opentelemetry_sdk::trace::Span);

impl CallSpan {
    pub(crate) fn end<T, E: std::fmt::Display>(mut self, result: &Result<T, E>) {
        if let Err(e) = result {
            self.0.set_status(Status::error(e.to_string()));
        }
        self.0.end();
    }
}

/// At intake, for each record of a Schedule call: the caller's trace
/// context (`traceparent`, `tracestate` from `metadata`), unless the record
/// carries its own, is kept on it as headers. With spans exported, the
/// call's span is started, child of that context, and its context kept
/// instead; the span is handed back to be ended with the answer.
pub(crate) fn carry<'a>(
    metadata: &tonic::metadata::MetadataMap,
    call: &'static str,
    messages: impl IntoIterator<Item = &'a mut proto::Message>,
) -> Option<CallSpan> {
    // The common case, an untraced call, stops here.
    let given = TraceParent::parse(metadata.get(TRACEPARENT)?.as_bytes())?;
    let state = metadata
        .get(TRACESTATE)
        .map(|v| v.as_bytes())
        .filter(|v| v.len() <= MAX_TRACESTATE)
        .map(<[u8]>::to_vec);
    let messages: Vec<_> = messages.into_iter().collect();
    let span = TRACER.get().map(|tracer| {
        let parent = Context::new().with_remote_span_context(given.remote(trace_state(state.as_deref())));
        let topic = messages.first().map(|m| m.topic.clone()).unwrap_or_default();
        let span = tracer
            .span_builder(format!("hourglass.v1.Scheduler/{call}"))
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", "hourglass.v1.Scheduler"),
                KeyValue::new("rpc.method", call),
                KeyValue::new("messaging.destination.name", topic),
            ])
            .start_with_context(tracer, &parent);
        CallSpan(span)
    });
    let kept = span.as_ref().map(|s| TraceParent::of(s.0.span_context())).unwrap_or(given).header();
    for message in messages {
        if header(&message.headers, TRACEPARENT).is_some() {
            continue;
        }
        message.headers.push(proto::Header { key: TRACEPARENT.into(), value: kept.clone().into_bytes() });
        if let Some(state) = state.as_ref().filter(|_| header(&message.headers, TRACESTATE).is_none()) {
            message.headers.push(proto::Header { key: TRACESTATE.into(), value: state.clone() });
        }
    }
    span
}

/// At dispatch, with spans exported: for a record that carries a trace
/// context, the dispatch's span (child of it, linked to it), made as the
/// record is handed to Kafka; the `traceparent` the record goes out with
/// instead, its own. `None` without export or without a context.
pub(crate) fn dispatch(
    topic: &str,
    id: &str,
    due_ms: u64,
    headers: &[crate::message::Header],
) -> Option<String> {
    let tracer = TRACER.get()?;
    let stored = headers.iter().find(|h| h.key.eq_ignore_ascii_case(TRACEPARENT))?;
    let parent = TraceParent::parse(&stored.value)?;
    let state = headers.iter().find(|h| h.key.eq_ignore_ascii_case(TRACESTATE)).map(|h| h.value.as_slice());
    let scheduled = parent.remote(trace_state(state));
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default();
    let mut span = tracer
        .span_builder(format!("send {topic}"))
        .with_kind(SpanKind::Producer)
        .with_links(vec![Link::with_context(scheduled.clone())])
        .with_attributes([
            KeyValue::new("messaging.system", "kafka"),
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.destination.name", topic.to_owned()),
            KeyValue::new("messaging.message.id", id.to_owned()),
            KeyValue::new("hourglass.due_ms", due_ms as i64),
            KeyValue::new("hourglass.late_ms", now_ms - due_ms as i64),
        ])
        .start_with_context(tracer, &Context::new().with_remote_span_context(scheduled));
    let own = TraceParent::of(span.span_context()).header();
    span.end();
    Some(own)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_is_read_as_w3c_writes_it() {
        let text = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let parsed = TraceParent::parse(text.as_bytes()).unwrap();
        assert_eq!(parsed.header(), text);
        assert!(parsed.flags.is_sampled());
        // A later version with more fields is read for the fields it shares.
        let later = "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-comes-next";
        assert_eq!(TraceParent::parse(later.as_bytes()).unwrap().header(), text);
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-xx",
        ] {
            assert_eq!(TraceParent::parse(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn the_callers_context_is_kept_on_each_record_that_has_none_of_its_own() {
        let mut metadata = tonic::metadata::MetadataMap::new();
        metadata
            .insert(TRACEPARENT, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".parse().unwrap());
        metadata.insert(TRACESTATE, "vendor=x".parse().unwrap());
        let mut plain = proto::Message { topic: "t".into(), ..Default::default() };
        let own = proto::Header { key: "traceparent".into(), value: b"mine".to_vec() };
        let mut traced =
            proto::Message { topic: "t".into(), headers: vec![own.clone()], ..Default::default() };
        // No exporter in unit tests: the caller's context itself is kept.
        assert!(carry(&metadata, "Schedule", [&mut plain, &mut traced]).is_none());
        assert_eq!(plain.headers[0].value, b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        assert_eq!(
            (plain.headers[1].key.as_str(), plain.headers[1].value.as_slice()),
            ("tracestate", &b"vendor=x"[..])
        );
        assert_eq!(traced.headers, [own]);
        // Without a (valid) context, nothing is added.
        let mut bare = proto::Message::default();
        metadata.insert(TRACEPARENT, "garbage".parse().unwrap());
        carry(&metadata, "Schedule", [&mut bare]);
        assert!(bare.headers.is_empty());
    }
}
