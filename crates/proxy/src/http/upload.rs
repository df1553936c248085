//! `POST /v1/files`' multipart form, read as it comes (`multer`, with its bounds): each field
//! but the file at most [`FIELD_BYTES`], the file at most `batches.max_file_bytes` and written
//! where it is kept as it arrives, the whole form at most that and [`FORM_EXTRA`] more; each
//! piece within the client's body time. No field is held past its bound.

use axum::body::Body;
use axum::http::{header, HeaderMap};
use multer::{Constraints, Multipart, SizeLimit};
use tokio::time::Instant;

use super::intake::BodyTime;
use crate::batches::upload::Upload;
use crate::batches::{check_purpose, Batches};
use crate::config;
use crate::error::{Echo, ProxyError};

/// The most bytes of a field other than `file` (`purpose` is a word).
pub(crate) const FIELD_BYTES: u64 = 1024;
/// What a form may hold beyond its file: its parts' heads and its other fields.
pub(crate) const FORM_EXTRA: u64 = 64 << 10;

/// What a form brought.
#[derive(Debug)]
pub struct Form {
    pub(crate) purpose: String,
    pub(crate) filename: String,
    pub(crate) content: Upload,
}

/// The form of a request's `headers` and `body`, its file received by `batches` as it comes,
/// within `limits` and `time`.
pub(crate) async fn read(
    batches: &Batches,
    headers: &HeaderMap,
    body: Body,
    limits: &config::Batches,
    time: BodyTime,
) -> Result<Form, ProxyError> {
    let content_type = headers.get(header::CONTENT_TYPE);
    let boundary = content_type
        .and_then(|v| v.to_str().ok())
        .and_then(|v| multer::parse_boundary(v).ok())
        .ok_or_else(|| {
            ProxyError::InvalidRequest(
                "the body is not a multipart form: send content-type multipart/form-data with \
                 its boundary"
                    .into(),
            )
        })?;
    let whole = limits.max_file_bytes.saturating_add(FORM_EXTRA);
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > whole) {
        return Err(too_large(whole));
    }
    let bounds = SizeLimit::new()
        .whole_stream(whole)
        .per_field(FIELD_BYTES)
        .for_field("file", limits.max_file_bytes);
    let constraints = Constraints::new().size_limit(bounds);
    let mut form = Multipart::with_constraints(body.into_data_stream(), boundary, constraints);
    let refused = |e| refusal(e, limits.max_file_bytes);
    let end = Instant::now() + time.total;
    let (mut purpose, mut file) = (None, None);
    while let Some(mut field) = time.piece(end, form.next_field()).await?.map_err(refused)? {
        if field.name() == Some("file") {
            let filename = field.file_name().unwrap_or("upload.jsonl").to_string();
            let mut content = batches.receive().await?;
            while let Some(piece) = time.piece(end, field.chunk()).await?.map_err(refused)? {
                content.write(&piece).await.map_err(unkept)?;
            }
            file = Some((filename, content));
            continue;
        }
        let is_purpose = field.name() == Some("purpose");
        let mut text = Vec::new();
        while let Some(piece) = time.piece(end, field.chunk()).await?.map_err(refused)? {
            text.extend_from_slice(&piece);
        }
        if is_purpose {
            let p = String::from_utf8_lossy(&text).into_owned();
            // Refused before a file is received for it.
            check_purpose(&p)?;
            purpose = Some(p);
        }
    }
    let purpose = purpose.ok_or(ProxyError::InvalidParam {
        param: "purpose",
        message: "the form has no purpose field".into(),
    })?;
    let (filename, content) = file.ok_or(ProxyError::InvalidParam {
        param: "file",
        message: "the form has no file field".into(),
    })?;
    Ok(Form {
        purpose,
        filename,
        content,
    })
}

fn too_large(limit: u64) -> ProxyError {
    ProxyError::PayloadTooLarge {
        limit: usize::try_from(limit).unwrap_or(usize::MAX),
    }
}

/// A file's content that could not be written where files are kept (logged; the client is
/// told only that the store did not take it, as for the database's own errors).
fn unkept(detail: impl std::fmt::Display) -> ProxyError {
    ProxyError::database(detail)
}

/// What the client is told of a form that could not be read: a bound it passed (413), or why.
fn refusal(e: multer::Error, max_file_bytes: u64) -> ProxyError {
    match e {
        multer::Error::FieldSizeExceeded { field_name, .. }
            if field_name.as_deref() == Some("file") =>
        {
            too_large(max_file_bytes)
        }
        multer::Error::FieldSizeExceeded { field_name, limit } => ProxyError::FieldTooLarge {
            field: Echo::new(field_name.as_deref().unwrap_or("")),
            limit,
        },
        multer::Error::StreamSizeExceeded { limit } => too_large(limit),
        e => ProxyError::InvalidRequest(format!("the multipart form cannot be read: {e}")),
    }
}
