//! Why a backend's answer breaks HTTP/1.1 framing: its head, a chunk, a trailer, or the
//! connection closed before a body of known end was complete.

use http::HeaderName;

use super::MAX_HEAD;

/// A response the framing refuses; the texts name no address.
#[derive(Debug, thiserror::Error)]
pub enum FramingError {
    #[error("response head larger than {MAX_HEAD} bytes")]
    HeadTooLarge,
    #[error("invalid response head: {0}")]
    Head(httparse::Error),
    #[error("invalid response status {0}")]
    Status(u16),
    #[error("backend switched protocols")]
    SwitchedProtocols,
    #[error("invalid header name {0:?}")]
    FieldName(String),
    #[error("invalid value of header {0}")]
    FieldValue(HeaderName),
    #[error("transfer-encoding in an HTTP/1.0 response")]
    CodingInHttp10,
    #[error("both transfer-encoding and content-length")]
    BothFramings,
    #[error("transfer-encoding other than chunked alone")]
    Coding,
    #[error("invalid content-length {0:?}")]
    Length(String),
    #[error("conflicting content-length values")]
    Lengths,
    /// A chunk-size or trailer line ended by a bare LF.
    #[error("{0} not ended by CRLF")]
    NoCrlf(&'static str),
    #[error("invalid chunk size line")]
    ChunkSize,
    #[error("chunk data not followed by CRLF")]
    ChunkEnd,
    #[error("trailers too large")]
    TrailersTooLarge,
    #[error("invalid trailer field")]
    Trailer,
    /// The connection ended before a body of known end was complete: the connection's fault,
    /// not the backend's framing (never wrapped in `Malformed`).
    #[error("connection closed before the body was complete")]
    Cut,
}
