//! The floor of the loopback harness: the least a hyper-based proxy does per request.
//!
//! usage: bare-proxy LISTEN MODEL=URL... (e.g. `127.0.0.1:17703 bench=http://127.0.0.1:17801`)
//! environment: BARE_WORKERS (default 1) threads, each with its own current-thread runtime,
//! accepting on the one listening socket; BARE_COALESCE=0 writes each piece of an answer's
//! body as it comes (default: gathered, see [`Gathered`]).
//!
//! Per request: the body read whole, its `model` read with serde_json, the upstream picked by
//! that name, the request sent through a pooled hyper-util client (one pool per worker) with
//! its method, path, query and headers, and the answer's head and body bytes passed back
//! unchanged as they come. No limits, no rewriting, no logs. benches/load/run.sh measures it
//! as the path `bare`, the denominator of the CPU budget in docs/PERFORMANCE.md.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::TcpListener as StdListener;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{HeaderName, CONNECTION, HOST, TRANSFER_ENCODING};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Deserialize;

type Upstreams = HashMap<String, String>;
type Answer = Response<Either<Gathered, Full<Bytes>>>;

/// The only member read from a request's body.
#[derive(Deserialize)]
struct Model<'a> {
    #[serde(borrow)]
    model: std::borrow::Cow<'a, str>,
}

/// One worker: its runtime, its client pool, its share of the accepts.
struct Worker {
    client: Client<HttpConnector, Full<Bytes>>,
    upstreams: Upstreams,
    /// Yields with nothing new before a gathered body's bytes are written (0: none gathered).
    yields: u8,
}

fn main() {
    if let Err(e) = run() {
        eprintln!("bare-proxy: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let listen = args.next().ok_or("usage: bare-proxy LISTEN MODEL=URL...")?;
    let upstreams: Upstreams = args
        .map(|a| match a.split_once('=') {
            Some((m, u)) => Ok((m.to_owned(), u.trim_end_matches('/').to_owned())),
            None => Err(format!("{a}: not MODEL=URL")),
        })
        .collect::<Result<_, _>>()?;
    let workers: usize = match std::env::var("BARE_WORKERS") {
        Ok(n) => n
            .parse()
            .map_err(|_| format!("BARE_WORKERS={n}: not a number"))?,
        Err(_) => 1,
    };
    let yields = match std::env::var("BARE_COALESCE").as_deref() {
        Ok("0") => 0,
        _ => GATHER_YIELDS,
    };
    let listener = StdListener::bind(&listen).map_err(|e| format!("bind {listen}: {e}"))?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let threads: Vec<_> = (0..workers.max(1))
        .map(|_| {
            let listener = listener.try_clone().map_err(|e| e.to_string())?;
            let upstreams = upstreams.clone();
            Ok(std::thread::spawn(move || {
                serve(listener, upstreams, yields)
            }))
        })
        .collect::<Result<_, String>>()?;
    for t in threads {
        t.join().map_err(|_| "a worker panicked".to_owned())??;
    }
    Ok(())
}

/// Accepts and serves connections on a current-thread runtime of its own.
fn serve(listener: StdListener, upstreams: Upstreams, yields: u8) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        let worker = Arc::new(Worker {
            client,
            upstreams,
            yields,
        });
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let worker = Arc::clone(&worker);
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let worker = Arc::clone(&worker);
                    async move { Ok::<_, Infallible>(worker.forward(req).await) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

impl Worker {
    async fn forward(&self, req: Request<Incoming>) -> Answer {
        let (mut head, body) = req.into_parts();
        let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
            return refuse(StatusCode::BAD_REQUEST, "unreadable body");
        };
        let Some(base) = serde_json::from_slice::<Model>(&body)
            .ok()
            .and_then(|m| self.upstreams.get(m.model.as_ref()))
        else {
            return refuse(StatusCode::NOT_FOUND, "unknown model");
        };
        let path = head.uri.path_and_query().map_or("/", |p| p.as_str());
        let Ok(uri) = format!("{base}{path}").parse::<Uri>() else {
            return refuse(StatusCode::BAD_REQUEST, "bad path");
        };
        head.uri = uri;
        for name in [
            HOST,
            CONNECTION,
            TRANSFER_ENCODING,
            HeaderName::from_static("keep-alive"),
        ] {
            head.headers.remove(name);
        }
        match self
            .client
            .request(Request::from_parts(head, Full::new(body)))
            .await
        {
            Ok(answer) => answer.map(|body| Either::Left(Gathered::new(body, self.yields))),
            Err(_) => refuse(StatusCode::BAD_GATEWAY, "upstream failed"),
        }
    }
}

fn refuse(status: StatusCode, why: &'static str) -> Answer {
    let mut answer = Response::new(Either::Right(Full::new(Bytes::from_static(why.as_bytes()))));
    *answer.status_mut() = status;
    answer
}

/// Most yields in a row with nothing new before the gathered bytes go out.
const GATHER_YIELDS: u8 = 3;
/// Most bytes gathered into one write.
const GATHER_LIMIT: usize = 64 * 1024;

/// An answer's body whose pieces ready together go out as one: hyper's client hands the body
/// over a piece (an HTTP chunk: an SSE event) at a time from its connection's task, and
/// hyper's server writes whatever it holds each time the body is not ready. After a piece, up
/// to `yields` yields with nothing new let the connection's task decode what its socket holds,
/// so a burst of events is one write, not one system call each.
struct Gathered {
    inner: Incoming,
    held: BytesMut,
    /// A frame other than data, after the held bytes.
    next: Option<Frame<Bytes>>,
    yields: u8,
    yielded: u8,
}

impl Gathered {
    fn new(inner: Incoming, yields: u8) -> Gathered {
        Gathered {
            inner,
            held: BytesMut::new(),
            next: None,
            yields,
            yielded: 0,
        }
    }

    fn out(&mut self) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        self.yielded = 0;
        Poll::Ready(Some(Ok(Frame::data(self.held.split().freeze()))))
    }
}

impl Body for Gathered {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if this.yields == 0 {
            return Pin::new(&mut this.inner).poll_frame(cx);
        }
        if this.held.is_empty() {
            if let Some(frame) = this.next.take() {
                return Poll::Ready(Some(Ok(frame)));
            }
        }
        while this.held.len() < GATHER_LIMIT && this.next.is_none() {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        this.yielded = 0;
                        this.held.extend_from_slice(&data);
                    }
                    Err(frame) => this.next = Some(frame),
                },
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) if this.held.is_empty() => return Poll::Ready(None),
                Poll::Ready(None) => break,
                Poll::Pending if this.held.is_empty() => return Poll::Pending,
                Poll::Pending if this.yielded < this.yields => {
                    this.yielded += 1;
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Poll::Pending => break,
            }
        }
        if this.held.is_empty() {
            return Poll::Ready(this.next.take().map(Ok));
        }
        this.out()
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_empty() && self.next.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        // Exact before anything is held (where hyper's server reads it), as the inner body's.
        if self.held.is_empty() && self.next.is_none() {
            return self.inner.size_hint();
        }
        let mut hint = hyper::body::SizeHint::default();
        hint.set_lower(self.held.len() as u64);
        hint
    }
}
