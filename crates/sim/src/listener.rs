//! The listener: accepts connections, records each request, simulates loading, routes.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tower::ServiceExt;

use super::recorder::Recorded;
use super::state::Shared;
use super::{
    api_tokens, chat, embed, info, llamacpp, messages_stream, reply, responses_stream, tokens_api,
};
use switchboard_wire::flavor::Flavor;

/// The longest request body the simulator reads.
const BODY_LIMIT: usize = 256 << 20;

/// The routes of one flavour.
fn router(sh: Arc<Shared>) -> Router {
    let mut r = Router::new()
        .route("/v1/chat/completions", post(chat::chat))
        .route("/v1/completions", post(chat::completions))
        .route("/v1/embeddings", post(embed::embeddings))
        .route("/v1/models", get(info::models))
        .route("/health", get(info::health))
        .route("/metrics", get(info::metrics))
        .route("/sim/gpu", get(info::sim_gpu));
    r = match sh.flavor() {
        Flavor::Llamacpp => r
            .route("/chat/completions", post(chat::chat))
            .route("/completions", post(chat::completions))
            .route("/embeddings", post(embed::embeddings))
            .route("/models", get(info::models))
            .route("/props", get(info::props))
            .route("/slots", get(info::slots))
            .route("/tokenize", post(tokens_api::llama_tokenize))
            .route("/detokenize", post(tokens_api::llama_detokenize))
            .route("/apply-template", post(tokens_api::apply_template))
            .route(
                "/v1/chat/completions/input_tokens",
                post(tokens_api::input_tokens),
            )
            .route("/v1/responses/input_tokens", post(api_tokens::input_tokens)),
        Flavor::Vllm => r
            .route("/tokenize", post(tokens_api::vllm_tokenize))
            .route("/detokenize", post(tokens_api::vllm_detokenize)),
        Flavor::Sglang => r
            .route("/server_info", get(info::sglang_server_info))
            .route("/get_server_info", get(info::sglang_server_info))
            .route("/model_info", get(info::sglang_model_info))
            .route("/get_model_info", get(info::sglang_model_info))
            .route("/tokenize", post(tokens_api::sglang_tokenize))
            .route("/v1/tokenize", post(tokens_api::sglang_tokenize))
            .route("/detokenize", post(tokens_api::sglang_detokenize))
            .route("/v1/detokenize", post(tokens_api::sglang_detokenize)),
        Flavor::Openai => r,
    };
    // Every flavour but a chat-only server speaks the Messages and Responses APIs natively.
    if sh.flavor() != Flavor::Openai {
        r = r
            .route("/v1/messages", post(messages_stream::messages))
            .route("/v1/messages/count_tokens", post(api_tokens::count_tokens))
            .route("/v1/responses", post(responses_stream::responses));
    }
    // llama-server and vLLM take a long prompt's body whole (axum's default would refuse
    // one past 2 MB).
    r.fallback(info::not_found)
        .method_not_allowed_fallback(info::not_found)
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(sh)
}

/// Serves until `shutdown` resolves, then closes every connection at once.
pub(crate) async fn run(
    sh: Arc<Shared>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let app = router(Arc::clone(&sh));
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => {
                    conns.spawn(connection(tcp, Arc::clone(&sh), app.clone()));
                }
                // Out of descriptors or a similar passing trouble: let it settle.
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.shutdown().await;
    Ok(())
}

async fn connection(tcp: TcpStream, sh: Arc<Shared>, app: Router) {
    let _ = tcp.set_nodelay(true);
    // Set once a streamed answer went out on this connection, with `close_after_stream`.
    let streamed = Arc::new(AtomicBool::new(false));
    let service = hyper::service::service_fn(move |req| {
        let (sh, app, streamed) = (Arc::clone(&sh), app.clone(), Arc::clone(&streamed));
        async move {
            if streamed.load(Ordering::Relaxed) {
                // The connection a stream ended on: closed, the request neither read nor
                // answered (hyper closes the connection on a service error).
                return Err(ClosedAfterStream);
            }
            let resp = handle(Arc::clone(&sh), app, req).await?;
            if sh.cfg.close_after_stream {
                return Ok(close_after_stream(resp, &streamed));
            }
            Ok(resp)
        }
    });
    // A connection error only concerns that client.
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(tcp), service)
        .await;
}

/// What ends a connection a stream was answered on (`close_after_stream`).
#[derive(Debug)]
struct ClosedAfterStream;

impl std::fmt::Display for ClosedAfterStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("closed after a streamed answer")
    }
}

impl std::error::Error for ClosedAfterStream {}

impl From<Infallible> for ClosedAfterStream {
    fn from(never: Infallible) -> Self {
        match never {}
    }
}

/// llama-server's headers on every answer (keep-alive announced); a streamed answer marks
/// its connection to be closed.
fn close_after_stream(mut resp: Response, streamed: &AtomicBool) -> Response {
    resp.headers_mut().insert(
        http::HeaderName::from_static("keep-alive"),
        http::HeaderValue::from_static("timeout=5, max=100"),
    );
    let stream = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if stream {
        streamed.store(true, Ordering::Relaxed);
    }
    resp
}

async fn handle(
    sh: Arc<Shared>,
    app: Router,
    req: Request<Incoming>,
) -> Result<Response, Infallible> {
    let (parts, body) = req.into_parts();
    let Ok(collected) = body.collect().await else {
        return Ok(reply::empty(sh.flavor(), StatusCode::BAD_REQUEST));
    };
    let bytes = collected.to_bytes();
    sh.recorder.record(Recorded {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        headers: parts.headers.clone(),
        body: bytes.clone(),
    });
    if let Some(ready_at) = sh.ready_at {
        if let Some(resp) = while_loading(&sh, parts.uri.path(), ready_at).await {
            return Ok(resp);
        }
    }
    let req = Request::from_parts(parts, Body::from(bytes));
    match app.oneshot(req).await {
        Ok(resp) => Ok(resp),
        Err(never) => match never {},
    }
}

/// What a backend that is still loading its model does with a request.
async fn while_loading(sh: &Shared, path: &str, ready_at: Instant) -> Option<Response> {
    if Instant::now() >= ready_at {
        return None;
    }
    let flavor = sh.flavor();
    match flavor {
        // llama.cpp answers model listings (with `meta: null`) and 503 for the rest.
        Flavor::Llamacpp if matches!(path, "/v1/models" | "/models") => None,
        Flavor::Llamacpp => Some(reply::json(
            flavor,
            StatusCode::SERVICE_UNAVAILABLE,
            &llamacpp::loading_body(),
        )),
        Flavor::Sglang => Some(reply::empty(flavor, StatusCode::SERVICE_UNAVAILABLE)),
        // vLLM has bound its port but answers nothing until the engine is up.
        Flavor::Vllm | Flavor::Openai => {
            tokio::time::sleep_until(ready_at.into()).await;
            None
        }
    }
}
