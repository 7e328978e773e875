//! OpenTelemetry traces (`[otel]`, off unless configured): the tracer and its batched OTLP/HTTP export
//! (`export.rs`), the server span of every `/v1/*` request with W3C trace context in and out (`server.rs`), and the
//! spans of a conversation request's stages — plan, each upstream round (`chat <model>`, GenAI conventions),
//! each recall call, summary jobs as their own linked traces (`spans.rs`). Spans are handed to a queue that a
//! thread of the SDK exports in batches: a request never waits for, or fails because of, the collector.

mod export;
mod server;
pub mod spans;

pub use server::{inject, trace_request};
pub use spans::{
    ChatSpan, ChatStart, JobTrace, PlanSpan, Planned, RequestTrace, SummarySpan, ToolSpan,
    UpstreamTrace,
};

use crate::config::otel::OtelSettings;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use std::time::Duration;

/// Longest wait, at shutdown (after the drain), for the spans still queued to be exported.
pub const FLUSH_WITHIN: Duration = Duration::from_secs(5);

/// A running tracer: where spans are made, and the pipeline that exports them.
pub struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    capture_content: bool,
    traces_url: String,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracing")
            .field("traces_url", &self.traces_url)
            .field("capture_content", &self.capture_content)
            .finish()
    }
}

impl Tracing {
    /// Starts the tracer and its exporter (which sends on the current Tokio runtime).
    pub fn start(settings: &OtelSettings) -> Result<Tracing, String> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| "tracing needs the async runtime".to_string())?;
        let exporter = export::exporter(settings, runtime)?;
        // The SDK's batch processor: a bounded queue (spans beyond it are dropped, never waited for) that its own
        // thread exports in batches; `OTEL_BSP_*` tune it.
        let processor = BatchSpanProcessor::builder(exporter).build();
        let sampler =
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(settings.sample_ratio)));
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(sampler)
            .with_resource(
                Resource::builder()
                    .with_service_name(settings.service_name.clone())
                    .build(),
            )
            .build();
        let scope = opentelemetry::InstrumentationScope::builder("ctxgate")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let tracer = provider.tracer_with_scope(scope);
        Ok(Tracing {
            provider,
            tracer,
            capture_content: settings.capture_content,
            traces_url: settings.traces_url.clone(),
        })
    }

    /// A tracer over `provider` (tests: an in-memory exporter).
    #[cfg(test)]
    pub(crate) fn with_provider(provider: SdkTracerProvider, capture_content: bool) -> Tracing {
        let tracer = provider.tracer("ctxgate");
        Tracing {
            provider,
            tracer,
            capture_content,
            traces_url: String::new(),
        }
    }

    /// Where spans are posted.
    pub fn traces_url(&self) -> &str {
        &self.traces_url
    }

    /// Whether message content goes into spans (`otel.capture_content`).
    pub fn captures_content(&self) -> bool {
        self.capture_content
    }

    /// Exports what is still queued and stops the exporter, waiting at most `within`; `false` when spans were
    /// left behind (the collector is down or slow).
    pub async fn shutdown(&self, within: Duration) -> bool {
        let provider = self.provider.clone();
        // The SDK blocks while its thread exports; that thread sends on this runtime, so wait off it.
        let flush = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(within));
        match tokio::time::timeout(within + Duration::from_millis(500), flush).await {
            Ok(Ok(Ok(()))) => true,
            Ok(Ok(Err(e))) => {
                tracing::warn!(error = %e, "otel: could not export every span at shutdown");
                false
            }
            _ => {
                tracing::warn!("otel: exporting the last spans took too long; they are lost");
                false
            }
        }
    }
}
