//! `GET /`: the status page. Server-rendered HTML from the live snapshot (minijinja templates,
//! every value escaped), readable without JavaScript; client auth as `/v1/models` has it (a
//! client sees its own aliases and client section), admin keys that see it all, plus HTTP
//! Basic for browsers.

mod aliases;
mod batches;
mod charts;
mod clients;
#[cfg(test)]
mod escaped;
mod html;
mod palette;
mod slots;
mod span;
mod templates;
mod usage;
mod view;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;

use super::intake;
use crate::error::ProxyError;
use crate::live::{AppState, Snapshot};
use clients::Viewer;

pub use html::REFRESH_SECS;

/// `GET /`: aliases, their backends and health, load and the last five minutes.
pub async fn page(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let snap = state.live.load_full();
    let Ok(viewer) = authorize(&snap, &headers) else {
        let mut resp = ProxyError::Unauthorized.into_response();
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"switchboard\", charset=\"UTF-8\""),
        );
        return resp;
    };
    let nonce = format!("{:032x}", rand::random::<u128>());
    let body = match html::render(&view::collect(&state, &snap, &viewer), &nonce) {
        Ok(body) => body,
        Err(e) => {
            tracing::error!(error = %e, "the status page did not render");
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the status page did not render\n",
            )
                .into_response();
        }
    };
    let csp = format!(
        "default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; \
         connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
         frame-ancestors 'none'"
    );
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if let Ok(v) = HeaderValue::from_str(&csp) {
        h.insert(HeaderName::from_static("content-security-policy"), v);
    }
    resp
}

/// The page shows no secrets but does show the fleet's layout, so it takes the keys
/// `/v1/models` takes, and the admin keys (`server.admin_keys_env`), which see all of it. A
/// browser cannot send a bearer token when it opens a page, so a key is also accepted as the
/// password of HTTP Basic auth (any user name), which browsers ask for after the 401's
/// `WWW-Authenticate` and then send with the page's own refreshes.
fn authorize(snap: &Snapshot, headers: &HeaderMap) -> Result<Viewer, ProxyError> {
    let basic = basic_password(headers);
    if let Some(admin) = &snap.config.server.admin_keys {
        let key = crate::clients::presented(headers).or(basic.as_deref());
        if key.is_some_and(|k| crate::clients::one_of(admin, k)) {
            return Ok(Viewer::Admin);
        }
    }
    let e = match intake::identify(snap, headers) {
        Ok(c) => return Ok(c.map_or(Viewer::Open, Viewer::Client)),
        Err(e) => e,
    };
    match basic.and_then(|p| snap.clients.holder(&p).cloned()) {
        Some(c) => Ok(Viewer::Client(c)),
        None => Err(e),
    }
}

/// The password of an `Authorization: Basic` header.
fn basic_password(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, creds) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(creds.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (_user, password) = text.split_once(':')?;
    Some(password.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_auth_gives_its_password() {
        let mut h = HeaderMap::new();
        // "anyone:sk-1"
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic YW55b25lOnNrLTE="),
        );
        assert_eq!(basic_password(&h).as_deref(), Some("sk-1"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer sk-1"),
        );
        assert_eq!(basic_password(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic !!"));
        assert_eq!(basic_password(&h), None);
    }
}
