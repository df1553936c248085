//! The client's errors: what failed before an answer head ([`SendError`]), a body
//! that breaks HTTP/1.1 ([`Malformed`]), and an error's chain of messages.

use crate::framing::FramingError;

/// Any error of the exchange with a backend, as the relay sees it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What went wrong before a response head arrived. The texts name no address; the `String`s
/// are the texts of I/O and TLS errors told without it (and the variant is what is matched).
#[derive(Debug)]
pub enum SendError {
    /// No TCP connection could be made (refused, unreachable).
    Connect(String),
    /// No TCP connection within the connect timeout.
    ConnectTimeout,
    /// Not delivered: a new connection failed before the kernel took one byte of the request,
    /// so the backend cannot have seen it and it may go to another one.
    Unsent(String),
    /// The TLS handshake failed (an untrusted or wrong certificate, say).
    Tls(String),
    /// The connection failed while the request was being sent, some of it taken by the
    /// kernel: the backend may have seen part or all of it.
    Write(String),
    /// The connection closed, reset or failed while the answer's head was awaited, the
    /// request sent: the backend may be running it.
    Head(String),
    /// Connected, but no response head within the time the caller gave ([`Client::get`]).
    Timeout,
    /// The backend's head breaks HTTP/1.1.
    Malformed(FramingError),
    /// The proxy could not open a socket: out of file descriptors (EMFILE, ENFILE). Says
    /// nothing of the backend.
    Local(String),
}

/// Whether a failed `socket`/`connect` is the process or the system out of file descriptors.
pub(super) fn out_of_descriptors(e: &std::io::Error) -> bool {
    // EMFILE and ENFILE, 24 and 23 on Linux and the BSDs.
    matches!(e.raw_os_error(), Some(23 | 24))
}

/// A backend's answer that breaks HTTP/1.1 framing: a malformed head, chunk or trailer. A
/// body error of this type is the backend's fault; any other is the connection's.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub(crate) struct Malformed(pub(crate) FramingError);

/// Whether a body error is the backend breaking HTTP/1.1 rather than the connection failing.
pub(crate) fn is_malformed(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut err = Some(e);
    while let Some(e) = err {
        if e.is::<Malformed>() {
            return true;
        }
        err = e.source();
    }
    false
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Connect(e) => write!(f, "cannot connect: {e}"),
            SendError::Unsent(e) => write!(f, "not delivered: {e}"),
            SendError::ConnectTimeout => f.write_str("cannot connect: connect timed out"),
            SendError::Tls(e) | SendError::Write(e) | SendError::Head(e) => f.write_str(e),
            SendError::Malformed(e) => write!(f, "{e}"),
            SendError::Local(e) => write!(f, "cannot open a connection: {e}"),
            SendError::Timeout => f.write_str("no answer in time"),
        }
    }
}

impl std::error::Error for SendError {}

/// The chain of an error's messages.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(err) = source {
        s.push_str(": ");
        s.push_str(&err.to_string());
        source = err.source();
    }
    s
}
