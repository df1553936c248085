//! The way out of ended spans: a bounded queue the request path only ever offers a span to
//! (never waiting), and one thread of its own that posts batches to the collector with the
//! OTLP exporter of `opentelemetry-otlp` (HTTP/protobuf), sent by the project's upstream client.
//! A slow or dead collector fills the queue; what does not fit is dropped and counted. A batch
//! is also bounded in bytes (`tracing.export_max_bytes`, each span's encoded size reckoned from
//! above), so no export is refused whole by a collector's body limit.
//!
//! Written here rather than taken from `opentelemetry_sdk`'s `BatchSpanProcessor`: that one
//! counts the spans it drops in a private field, told only in its own log at shutdown, and
//! here they must be a metric (`switchboard_trace_spans_dropped_total`) the moment they are
//! lost. The batching is a dozen lines; the OTLP encoding and its HTTP request are the crate's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response};
use opentelemetry::Context;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use tokio::sync::mpsc;

use crate::config::Tracing;
use crate::observe::metrics::{SpanDrop, SpansDropped};
use crate::upstream::tls::{TlsError, TlsSettings};
use crate::upstream::{read_all, Client, Origin};
use crate::wire::payload::Payload;

mod size;

/// Spans sent in one export at most (no more than the queue holds, so the spans held are
/// at most twice the queue, and one held over for the next batch).
const BATCH: usize = 512;
/// The collector's name where the upstream client keeps TLS settings by name.
const COLLECTOR: &str = "otlp collector";

/// The span processor: hands every ended span to the export thread, or counts it dropped.
#[derive(Debug)]
pub(crate) struct Queue {
    tx: mpsc::Sender<SpanData>,
    dropped: SpansDropped,
    /// Whether the current run of drops was told in the log (told once, again after a
    /// successful export).
    told: Arc<AtomicBool>,
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if self.tx.try_send(span).is_err() {
            self.dropped.add(SpanDrop::queue_full, 1);
            if !self.told.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "the trace export queue is full: spans are dropped (the collector is slow or down)"
                );
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Why the trace export could not start; shown after the config key and value.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartError {
    #[error("tracing.otlp_endpoint: {}", .0.reason)]
    Tls(Box<TlsError>),
    #[error("the OTLP exporter: {0}")]
    Exporter(opentelemetry_otlp::ExporterBuildError),
    #[error("the trace export thread: {0}")]
    Thread(std::io::Error),
}

/// The processor for `settings`, its export thread started. The thread ends once every
/// span holding the processor is gone and the queue is sent.
pub(crate) fn start(
    settings: &Tracing,
    resource: &Resource,
    dropped: SpansDropped,
) -> Result<Queue, StartError> {
    let collector = Collector::new(settings)?;
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(collector)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(settings.url.clone())
        .with_timeout(settings.timeout)
        .build()
        .map_err(StartError::Exporter)?;
    exporter.set_resource(resource);
    let (tx, rx) = mpsc::channel(settings.queue);
    let told = Arc::new(AtomicBool::new(false));
    let run = Export {
        rx,
        exporter,
        interval: settings.interval,
        batch: BATCH.min(settings.queue),
        budget: size::budget(settings.export_max_bytes),
        held: None,
        told_large: false,
        timeout: settings.timeout,
        dropped: dropped.clone(),
        told: Arc::clone(&told),
        failing: false,
    };
    std::thread::Builder::new()
        .name("switchboard-otlp".into())
        .spawn(move || run.run())
        .map_err(StartError::Thread)?;
    Ok(Queue { tx, dropped, told })
}

/// The export thread's side.
struct Export {
    rx: mpsc::Receiver<SpanData>,
    exporter: opentelemetry_otlp::SpanExporter,
    interval: Duration,
    batch: usize,
    /// The reckoned bytes of one batch's spans at most.
    budget: usize,
    /// The span that did not fit the last batch: the next one's first.
    held: Option<SpanData>,
    /// A span too big for any export was told in the log (once).
    told_large: bool,
    timeout: Duration,
    dropped: SpansDropped,
    told: Arc<AtomicBool>,
    /// The last export failed (told once per run of failures).
    failing: bool,
}

impl Export {
    fn run(mut self) {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(error = %e, "no runtime for the trace export: spans are not exported");
                return;
            }
        };
        rt.block_on(async move {
            while let Some(batch) = self.batch().await {
                self.export(batch).await;
            }
        });
    }

    /// The next batch: the spans waiting when the first arrives, and those that come within
    /// the interval, up to a full batch in count or in bytes (the span that would pass the
    /// bytes is held for the next). `None` once the queue is closed and empty.
    async fn batch(&mut self) -> Option<Vec<SpanData>> {
        let first = self.first().await?;
        let mut bytes = size::of(&first);
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + self.interval;
        while batch.len() < self.batch {
            let span = match tokio::time::timeout_at(until, self.rx.recv()).await {
                Ok(Some(span)) => span,
                Ok(None) | Err(_) => break,
            };
            let n = size::of(&span);
            if n > self.budget {
                self.too_large();
                continue;
            }
            if bytes + n > self.budget {
                self.held = Some(span);
                break;
            }
            bytes += n;
            batch.push(span);
        }
        Some(batch)
    }

    /// A batch's first span: the one held over, else the next that fits an export alone
    /// (one too big is dropped and counted).
    async fn first(&mut self) -> Option<SpanData> {
        if let Some(span) = self.held.take() {
            return Some(span);
        }
        loop {
            let span = self.rx.recv().await?;
            if size::of(&span) <= self.budget {
                return Some(span);
            }
            self.too_large();
        }
    }

    /// A span bigger than an export may be: dropped, counted, told in the log the first time.
    fn too_large(&mut self) {
        self.dropped.add(SpanDrop::too_large, 1);
        if !std::mem::replace(&mut self.told_large, true) {
            tracing::warn!(
                "a span is larger than tracing.export_max_bytes allows: it is dropped (tracing.capture_max_bytes bounds its captured content)"
            );
        }
    }

    async fn export(&mut self, batch: Vec<SpanData>) {
        let n = batch.len() as u64;
        let done = tokio::time::timeout(self.timeout, self.exporter.export(batch)).await;
        let error = match done {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some("the collector did not answer in time".to_string()),
        };
        match error {
            None => {
                if std::mem::take(&mut self.failing) {
                    tracing::info!("trace export works again");
                }
                self.told.store(false, Ordering::Relaxed);
            }
            Some(e) => {
                self.dropped.add(SpanDrop::export_failed, n);
                if !std::mem::replace(&mut self.failing, true) {
                    tracing::warn!(error = %e, "trace export failed: spans are dropped until it works again");
                }
            }
        }
    }
}

/// The collector as the OTLP exporter's HTTP client: posts through the upstream client.
#[derive(Debug)]
struct Collector {
    client: Client,
    authority: String,
    tls: bool,
    headers: Vec<(HeaderName, HeaderValue)>,
    timeout: Duration,
}

impl Collector {
    fn new(settings: &Tracing) -> Result<Collector, StartError> {
        let specs = settings
            .tls
            .as_ref()
            .map(|spec| (COLLECTOR, settings.authority.as_str(), spec));
        let (tls, errors) = TlsSettings::load(specs, crate::files::read_ca);
        if let Some(e) = errors.into_iter().next() {
            return Err(StartError::Tls(Box::new(e)));
        }
        Ok(Collector {
            client: Client::new(settings.timeout.min(Duration::from_secs(3)), tls),
            authority: settings.authority.clone(),
            tls: settings.tls.is_some(),
            headers: settings.headers.clone(),
            timeout: settings.timeout,
        })
    }
}

/// An answer body longer than this is not read (a collector answers with a few bytes).
const ANSWER_LIMIT: usize = 1 << 20;

#[async_trait::async_trait]
impl HttpClient for Collector {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut headers = parts.headers;
        for (name, value) in &self.headers {
            headers.insert(name.clone(), value.clone());
        }
        let origin = Origin {
            name: COLLECTOR,
            authority: &self.authority,
            path_prefix: "",
            tls: self.tls,
            connect: None,
            auth: None,
        };
        let post = async {
            let answer = self
                .client
                .post(origin, path, headers, Payload::from(body))
                .await?;
            let body = read_all(answer.body, ANSWER_LIMIT).await?;
            let mut response = Response::new(body);
            *response.status_mut() = answer.status;
            *response.headers_mut() = answer.headers;
            Ok::<_, HttpError>(response)
        };
        tokio::time::timeout(self.timeout, post)
            .await
            .map_err(|_| HttpError::from("the collector did not answer in time"))?
    }
}
