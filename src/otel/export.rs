//! The OTLP/HTTP protobuf exporter over opentelemetry-http's hyper client (rustls for `https` collectors). The SDK
//! exports from a thread of its own; the client needs the Tokio runtime, so each export is sent on it.

use crate::config::otel::OtelSettings;
use bytes::Bytes;
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use std::sync::Arc;
use std::time::Duration;

/// How long one export may take (a slow collector holds up the export thread, never a request).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The span exporter posting to `settings.traces_url`.
pub(super) fn exporter(
    settings: &OtelSettings,
    runtime: tokio::runtime::Handle,
) -> Result<opentelemetry_otlp::SpanExporter, String> {
    let client = OnRuntime {
        runtime,
        client: HyperClient::new(connector()?, EXPORT_TIMEOUT, None),
    };
    opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(settings.traces_url.clone())
        .with_timeout(EXPORT_TIMEOUT)
        .with_headers(settings.headers.clone().into_iter().collect())
        .build()
        .map_err(|e| format!("cannot build the OTLP exporter: {e}"))
}

type Connector = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// Plain HTTP, or TLS by rustls with the webpki roots.
fn connector() -> Result<Connector, String> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(5)));
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("cannot build the OTLP client's TLS: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http))
}

/// The hyper client, each request sent as a task of the runtime (the SDK's export thread is not one of its
/// threads).
#[derive(Debug)]
struct OnRuntime {
    runtime: tokio::runtime::Handle,
    client: HyperClient<Connector>,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        self.runtime
            .spawn(async move { client.send_bytes(request).await })
            .await
            .map_err(|e| Box::new(e) as HttpError)?
    }
}
