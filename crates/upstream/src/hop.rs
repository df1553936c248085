//! Hop-by-hop header fields (RFC 9110 §7.6.1): they describe one connection, so they never
//! cross the proxy, in either direction.

use http::{header, HeaderMap, HeaderName};

/// The non-standard `Proxy-Connection`, hop-by-hop wherever it is sent.
pub(crate) const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// A client's fields that never reach a backend, plus `accept-encoding`: answers are relayed
/// uncompressed so events are never held in an encoder. `Host` and `Content-Length` are
/// written anew for the backend.
const REQUEST: [HeaderName; 11] = [
    header::CONNECTION,
    header::HOST,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    header::ACCEPT_ENCODING,
    HeaderName::from_static("keep-alive"),
    PROXY_CONNECTION,
];

/// A backend's fields that never reach the client besides `Connection` (whose value names
/// more of them, and which the proxy reads first), plus its CORS grant, which is not the
/// proxy's to make. Names as read off the wire, compared ignoring ASCII case.
const RESPONSE: [&str; 9] = [
    "content-length",
    "transfer-encoding",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "proxy-authenticate",
    "access-control-allow-origin",
];

/// Whether a client's field called `name` stays out of the request to a backend. The fields
/// its `Connection` names are hop-by-hop too: [`drop_named`] removes those.
pub(crate) fn request(name: &HeaderName) -> bool {
    REQUEST.contains(name)
}

/// Whether a backend's field called `name` never reaches the client by itself; `Connection`
/// and the fields it names are removed by [`drop_connection`].
pub(crate) fn response(name: &str) -> bool {
    RESPONSE.iter().any(|f| f.eq_ignore_ascii_case(name))
}

/// Remove the fields that `Connection` names from `headers`; `Connection` itself stays.
/// Costs one pass over the names when there is no `Connection`.
pub(crate) fn drop_named(headers: &mut HeaderMap) {
    if headers.keys().any(|name| name == header::CONNECTION) {
        remove_named(headers);
    }
}

/// Remove `Connection` and the fields it names from `headers`.
pub(crate) fn drop_connection(headers: &mut HeaderMap) {
    if headers.keys().any(|name| name == header::CONNECTION) {
        remove_named(headers);
        headers.remove(header::CONNECTION);
    }
}

/// Remove every hop-by-hop field of a client's request from `headers`, for a sender that
/// writes all of the map.
#[cfg(test)]
pub(crate) fn drop_request(headers: &mut HeaderMap) {
    drop_named(headers);
    remove_where(headers, request);
}

/// Remove the hop-by-hop fields of a backend's answer from `headers` but `Connection` and the
/// fields it names ([`drop_connection`]), for an answer whose head was read into a map whole.
#[cfg(test)]
pub(crate) fn drop_response(headers: &mut HeaderMap) {
    remove_where(headers, |name| response(name.as_str()));
}

/// Remove the fields of `headers` whose name `hop` picks.
fn remove_where(headers: &mut HeaderMap, hop: impl Fn(&HeaderName) -> bool) {
    let picked: Vec<HeaderName> = headers.keys().filter(|n| hop(n)).cloned().collect();
    for name in &picked {
        headers.remove(name);
    }
}

/// Remove the fields every `Connection` field of `headers` names.
fn remove_named(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    remove_where(headers, |name| named.contains(name));
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn message() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Secret-Hop"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert(header::HOST, HeaderValue::from_static("proxy:1"));
        h.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        h.insert(PROXY_CONNECTION, HeaderValue::from_static("keep-alive"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("access-control-allow-origin", HeaderValue::from_static("*"));
        h.insert("x-request-id", HeaderValue::from_static("abc"));
        h
    }

    fn names(h: &HeaderMap) -> Vec<&str> {
        let mut n: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        n.sort_unstable();
        n
    }

    #[test]
    fn each_direction_drops_its_fields_and_the_ones_connection_names() {
        let mut h = message();
        drop_request(&mut h);
        assert_eq!(names(&h), ["access-control-allow-origin", "x-request-id"]);
        let mut h = message();
        drop_response(&mut h);
        assert_eq!(
            names(&h),
            [
                "accept-encoding",
                "connection",
                "host",
                "x-request-id",
                "x-secret-hop"
            ]
        );
        drop_connection(&mut h);
        assert_eq!(names(&h), ["accept-encoding", "host", "x-request-id"]);
        let mut h = message();
        drop_connection(&mut h);
        assert!(!h.contains_key(header::CONNECTION) && !h.contains_key("x-secret-hop"));
        assert_eq!(h.len(), message().len() - 3);
        // Names off the wire are compared ignoring case.
        assert!(response("Keep-Alive") && response("TRANSFER-ENCODING"));
        assert!(!response("connection") && !response("content-type"));
    }

    #[test]
    fn drop_named_leaves_the_fixed_fields_to_the_sender() {
        let mut h = message();
        drop_named(&mut h);
        assert!(!h.contains_key("x-secret-hop"));
        assert!(!h.contains_key("keep-alive"));
        assert!(h.contains_key(header::CONNECTION) && h.contains_key(PROXY_CONNECTION));
        let mut written: Vec<&str> = h
            .keys()
            .filter(|n| !request(n))
            .map(HeaderName::as_str)
            .collect();
        written.sort_unstable();
        let mut dropped = message();
        drop_request(&mut dropped);
        assert_eq!(written, names(&dropped));
        // Nothing to do without a `Connection`.
        let mut h = HeaderMap::new();
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        drop_named(&mut h);
        assert!(h.contains_key("x-secret-hop"));
    }
}
