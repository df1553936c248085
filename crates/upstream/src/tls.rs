//! TLS to https backends: rustls (ring provider) trusting Mozilla's roots or a backend's own CA
//! file, SNI from the URL's host, ALPN `http/1.1`; handshake errors told without addresses.
//!
//! A CA file is read by a reader the caller hands [`TlsSettings::load`]: how a file a config
//! names is opened (a regular file only, bounded) is the proxy's rule for every such file
//! (`files.rs` there, tokenizers too), and config validation reads none; this crate opens no
//! file of its own and keeps only what it makes of the bytes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{CertificateError, ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

/// An https backend's TLS settings as configured (validated, nothing read yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSpec {
    /// The name its certificate must show, sent as SNI: the URL's host.
    pub server_name: ServerName<'static>,
    /// PEM file of the CAs to trust instead of the built-in roots (a self-signed fleet).
    pub ca_file: Option<PathBuf>,
}

/// What a connection to one https backend needs: the connector (its trust roots), the name to
/// verify, the key its kept-alive connections are pooled under.
pub(crate) struct BackendTls {
    pub(super) connector: TlsConnector,
    pub(super) server_name: ServerName<'static>,
    /// `https://{authority} {backend}`: never equal to a plain-http key (`host:port`), and
    /// one backend's connections (verified against its CA) are not handed to another.
    pub(super) pool_key: String,
}

impl std::fmt::Debug for BackendTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// The loaded TLS settings of a config's https backends, by backend name.
#[derive(Debug, Default)]
pub struct TlsSettings {
    backends: HashMap<String, Arc<BackendTls>>,
}

/// A backend's TLS settings that cannot be used; shown as the config key they come from.
#[derive(Debug, Clone, thiserror::Error)]
#[error("backends.{backend}.{key}: {value:?} {reason}")]
pub struct TlsError {
    pub backend: String,
    /// `ca_file` (or `url` if no TLS client can be made at all).
    pub key: &'static str,
    pub value: String,
    pub reason: Unusable,
}

/// Why a CA file, or the TLS client itself, cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unusable {
    /// The caller's reader refused the file; its text, whatever its error type.
    #[error("{0}")]
    Read(Arc<dyn std::error::Error + Send + Sync>),
    #[error("is not a PEM certificate file: {0}")]
    NotPem(Arc<rustls::pki_types::pem::Error>),
    #[error("holds a certificate that is not a usable CA: {0}")]
    NotCa(rustls::Error),
    #[error("holds no PEM certificate")]
    NoCertificate,
    #[error("cannot make a TLS client: {0}")]
    Client(rustls::Error),
}

impl TlsSettings {
    /// Make the connectors of `backends` (name, `host:port`, spec), reading each CA file once
    /// with `read_ca` (the caller's rules for a file a config names: this crate opens none).
    /// A backend whose CA file fails gets no settings (its connections fail) and an error.
    pub fn load<'a, E>(
        backends: impl IntoIterator<Item = (&'a str, &'a str, &'a TlsSpec)>,
        read_ca: impl Fn(&Path) -> Result<Vec<u8>, E>,
    ) -> (TlsSettings, Vec<TlsError>)
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let mut errors = Vec::new();
        let mut by_file: HashMap<Option<&Path>, Result<TlsConnector, Unusable>> = HashMap::new();
        let mut settings = TlsSettings::default();
        for (name, authority, spec) in backends {
            let file = spec.ca_file.as_deref();
            let made = by_file.entry(file).or_insert_with(|| match file {
                None => connector(public_roots()),
                Some(path) => read_ca(path)
                    .map_err(|e| Unusable::Read(Arc::new(e)))
                    .and_then(|pem| ca_roots(&pem))
                    .and_then(connector),
            });
            let connector = match made {
                Ok(c) => c.clone(),
                Err(reason) => {
                    errors.push(TlsError {
                        backend: name.to_string(),
                        key: if file.is_some() { "ca_file" } else { "url" },
                        value: file.map_or_else(
                            || format!("https://{authority}"),
                            |p| p.display().to_string(),
                        ),
                        reason: reason.clone(),
                    });
                    continue;
                }
            };
            settings.backends.insert(
                name.to_string(),
                Arc::new(BackendTls {
                    connector,
                    server_name: spec.server_name.clone(),
                    pool_key: format!("https://{authority} {name}"),
                }),
            );
        }
        (settings, errors)
    }

    /// The settings of backend `name`, when it is an https backend whose settings loaded.
    pub(crate) fn get(&self, name: &str) -> Option<&Arc<BackendTls>> {
        self.backends.get(name)
    }
}

/// Mozilla's root CAs, as shipped by `webpki-roots`.
fn public_roots() -> RootCertStore {
    RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    }
}

/// The certificates of a PEM file's bytes as trust roots.
fn ca_roots(pem: &[u8]) -> Result<RootCertStore, Unusable> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| Unusable::NotPem(Arc::new(e)))?;
        roots.add(cert).map_err(Unusable::NotCa)?;
    }
    if roots.is_empty() {
        return Err(Unusable::NoCertificate);
    }
    Ok(roots)
}

/// A connector trusting `roots`: TLS 1.2 and 1.3 with ring's ciphers, ALPN `http/1.1`.
fn connector(roots: RootCertStore) -> Result<TlsConnector, Unusable> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(Unusable::Client)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// What a failed handshake tells a client: the reason, never the backend's name or address
/// (rustls's own text of a name mismatch shows the names the certificate holds).
pub(crate) fn handshake_error(e: &std::io::Error) -> String {
    let reason = match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(cert)) => certificate_error(cert).to_string(),
        Some(other) => other.to_string(),
        None if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            "the backend closed the connection during the handshake".to_string()
        }
        None => e.to_string(),
    };
    format!("tls handshake failed: {reason}")
}

fn certificate_error(e: &CertificateError) -> &'static str {
    match e {
        CertificateError::UnknownIssuer => {
            "the backend's certificate is not signed by a trusted CA (ca_file sets the CA of a private fleet)"
        }
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            "the backend's certificate is not valid for the host name of its url"
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            "the backend's certificate has expired"
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            "the backend's certificate is not valid yet"
        }
        CertificateError::Revoked => "the backend's certificate is revoked",
        CertificateError::BadSignature => "the backend's certificate has a bad signature",
        _ => "the backend's certificate was refused",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio_rustls::TlsAcceptor;

    use super::*;
    use crate::{read_all, Pool, SendError, Target};

    /// A CA made at test time and a server certificate it signed.
    mod test_ca {
        include!("../../../tests/it/common/test_ca.rs");
    }
    use test_ca::test_ca;

    /// An https backend answering "ok" (kept alive) that counts its TCP connections.
    async fn tls_backend(server: Arc<rustls::ServerConfig>) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        let acceptor = TlsAcceptor::from(server);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = service_fn(|_req| async {
                        Ok::<_, Infallible>(hyper::Response::new(http_body_util::Full::new(
                            Bytes::from_static(b"ok"),
                        )))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        (addr, accepted)
    }

    /// A file that cannot be read, as the proxy's reader tells it.
    #[derive(Debug, thiserror::Error)]
    #[error("cannot be read: {0}")]
    struct Unread(std::io::Error);

    fn read(path: &Path) -> Result<Vec<u8>, Unread> {
        std::fs::read(path).map_err(Unread)
    }

    fn spec(server_name: &str, ca_file: Option<&Path>) -> TlsSpec {
        TlsSpec {
            server_name: ServerName::try_from(server_name.to_string()).unwrap(),
            ca_file: ca_file.map(Path::to_path_buf),
        }
    }

    /// The settings of one backend `b` at `addr`.
    fn settings(addr: &str, spec: &TlsSpec) -> TlsSettings {
        let (settings, errors) = TlsSettings::load([("b", addr, spec)], read);
        assert!(errors.is_empty(), "{errors:?}");
        settings
    }

    async fn post(pool: &Arc<Pool>, addr: &str, tls: &BackendTls) -> Result<Bytes, SendError> {
        let to = Target {
            authority: addr,
            tls: Some(tls),
            connect: None,
            watch: None,
        };
        let r = pool
            .post(
                to,
                "/v1/chat/completions",
                HeaderMap::new(),
                Bytes::from_static(b"{}").into(),
                &mut false,
            )
            .await?;
        assert_eq!(r.status, StatusCode::OK);
        Ok(read_all(r.body, crate::SMALL_ANSWER_LIMIT).await.unwrap())
    }

    /// Requests to an https backend in a row take one TLS connection, kept alive.
    #[tokio::test]
    async fn tls_connections_are_kept_alive() {
        let ca = test_ca("fleet CA");
        let (addr, accepted) = tls_backend(Arc::clone(&ca.server)).await;
        let tls = settings(&addr, &spec("localhost", Some(&ca.ca_file)));
        let tls = tls.get("b").unwrap();
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        for _ in 0..3 {
            assert_eq!(post(&pool, &addr, tls).await.unwrap(), "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle_count(&tls.pool_key), 1);
        // Pooled apart from a plain-http backend at the same address.
        assert_eq!(pool.idle_count(&addr), 0);
    }

    /// The certificate is verified for an IP address too (no SNI is sent for one).
    #[tokio::test]
    async fn a_backend_named_by_its_ip_address_is_verified() {
        let ca = test_ca("fleet CA");
        let (addr, _) = tls_backend(Arc::clone(&ca.server)).await;
        let tls = settings(&addr, &spec("127.0.0.1", Some(&ca.ca_file)));
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        assert_eq!(
            post(&pool, &addr, tls.get("b").unwrap()).await.unwrap(),
            "ok"
        );
    }

    /// A certificate no trusted CA signed fails the handshake, and the reason names neither
    /// the backend's host nor its address.
    #[tokio::test]
    async fn an_untrusted_certificate_fails_the_handshake() {
        let ca = test_ca("fleet CA");
        let (addr, _) = tls_backend(Arc::clone(&ca.server)).await;
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        let public = settings(&addr, &spec("localhost", None));
        let Err(SendError::Tls(e)) = post(&pool, &addr, public.get("b").unwrap()).await else {
            panic!("an untrusted certificate was accepted");
        };
        assert!(
            e.contains("tls handshake failed") && e.contains("not signed by a trusted CA"),
            "{e}"
        );
        let other = test_ca("another fleet CA");
        let wrong_ca = settings(&addr, &spec("localhost", Some(&other.ca_file)));
        let Err(SendError::Tls(e)) = post(&pool, &addr, wrong_ca.get("b").unwrap()).await else {
            panic!("a certificate of another CA was accepted");
        };
        assert!(e.contains("not signed by a trusted CA"), "{e}");
        assert!(!e.contains("localhost") && !e.contains("127.0.0.1"), "{e}");
    }

    #[tokio::test]
    async fn a_certificate_for_another_name_is_refused_without_naming_it() {
        let ca = test_ca("fleet CA");
        let (addr, _) = tls_backend(Arc::clone(&ca.server)).await;
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        let tls = settings(&addr, &spec("gpu-box.fleet.test", Some(&ca.ca_file)));
        let Err(SendError::Tls(e)) = post(&pool, &addr, tls.get("b").unwrap()).await else {
            panic!("a certificate for another name was accepted");
        };
        assert!(e.contains("not valid for the host name"), "{e}");
        assert!(!e.contains("gpu-box") && !e.contains("localhost"), "{e}");
    }

    /// A plain-http server behind an https URL: the handshake fails, as a TLS error.
    #[tokio::test]
    async fn a_plain_http_server_fails_the_handshake() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = tcp.read(&mut buf).await;
                let _ = tcp
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        });
        let ca = test_ca("fleet CA");
        let tls = settings(&addr, &spec("localhost", Some(&ca.ca_file)));
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        let r = post(&pool, &addr, tls.get("b").unwrap()).await;
        assert!(
            matches!(&r, Err(SendError::Tls(e)) if e.starts_with("tls handshake failed")),
            "{:?}",
            r.err()
        );
    }

    /// A backend that closes a kept-alive TLS connection (`close_notify`, then the FIN): the
    /// idle check sees it on the TCP socket by asking the kernel, and the next request goes
    /// on a new connection.
    #[tokio::test]
    async fn a_tls_connection_the_backend_closed_is_replaced() {
        let ca = test_ca("fleet CA");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        let acceptor = TlsAcceptor::from(Arc::clone(&ca.server));
        // The test says when to close; the backend says when it has.
        let (close, mut close_now) = tokio::sync::mpsc::unbounded_channel::<()>();
        let (closed_tx, mut closed) = tokio::sync::mpsc::unbounded_channel::<()>();
        // Answers one request per connection, kept alive, then closes it cleanly.
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    continue;
                };
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                while !req.ends_with(b"{}") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tls
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
                let _ = tls.flush().await;
                let _ = close_now.recv().await;
                let _ = tls.shutdown().await;
                let _ = closed_tx.send(());
            }
        });
        let tls = settings(&addr, &spec("localhost", Some(&ca.ca_file)));
        let tls = tls.get("b").unwrap();
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        assert_eq!(post(&pool, &addr, tls).await.unwrap(), "ok");
        assert_eq!(pool.idle_count(&tls.pool_key), 1);
        close.send(()).unwrap();
        let wait = Duration::from_secs(10);
        tokio::time::timeout(wait, closed.recv())
            .await
            .expect("the backend to close")
            .unwrap();
        // Its close reaches the pooled connection's socket: wait until the kernel has bytes
        // (or the FIN) to read there, the connection left in the pool.
        tokio::time::timeout(wait, async {
            while !close_arrived(&pool, &tls.pool_key) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the close to reach the pooled connection");
        assert_eq!(pool.idle_count(&tls.pool_key), 1);
        let to = Target {
            authority: &addr,
            tls: Some(tls),
            connect: None,
            watch: None,
        };
        assert!(pool.checkout(to).is_none());
        assert_eq!(post(&pool, &addr, tls).await.unwrap(), "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    /// Whether the last idle connection under `key` has something to read (a peek: it stays
    /// in the pool).
    fn close_arrived(pool: &Pool, key: &str) -> bool {
        let idle = pool.idle.lock().unwrap();
        idle.get(key)
            .and_then(|list| list.last())
            .is_some_and(|(kept, _)| {
                let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
                socket2::SockRef::from(kept.tcp()).peek(&mut probe).is_ok()
            })
    }

    /// CA files that cannot be used are errors naming the key and the file; the backend
    /// gets no settings, the others do.
    #[test]
    fn unusable_ca_files_name_the_key() {
        let ca = test_ca("fleet CA");
        let missing = ca.dir.path().join("missing.pem");
        let empty = ca.dir.path().join("empty.pem");
        std::fs::write(&empty, "no certificate here\n").unwrap();
        let broken = ca.dir.path().join("broken.pem");
        std::fs::write(
            &broken,
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let (good, a, b, c) = (
            spec("localhost", Some(&ca.ca_file)),
            spec("localhost", Some(&missing)),
            spec("localhost", Some(&empty)),
            spec("localhost", Some(&broken)),
        );
        let (settings, errors) = TlsSettings::load(
            [
                ("good", "localhost:1", &good),
                ("a", "localhost:1", &a),
                ("b", "localhost:1", &b),
                ("c", "localhost:1", &c),
                ("d", "localhost:1", &a),
            ],
            read,
        );
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 4, "{text:?}");
        assert!(
            text[0].starts_with("backends.a.ca_file: \"")
                && text[0].contains("missing.pem\" cannot be read"),
            "{}",
            text[0]
        );
        assert!(
            text[1].starts_with("backends.b.ca_file: ")
                && text[1].ends_with("holds no PEM certificate"),
            "{}",
            text[1]
        );
        assert!(
            text[2].starts_with("backends.c.ca_file: ")
                && text[2].contains("is not a PEM certificate file"),
            "{}",
            text[2]
        );
        assert!(
            text[3].starts_with("backends.d.ca_file: ") && text[3].contains("cannot be read"),
            "{}",
            text[3]
        );
        assert!(settings.get("good").is_some());
        assert!(["a", "b", "c", "d"]
            .iter()
            .all(|n| settings.get(n).is_none()));
    }
}
