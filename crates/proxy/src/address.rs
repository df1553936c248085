//! Where a backend's URL points: `host:port`, the path prefix, and for https the server name
//! its certificate must show. Parsed, never read or connected.

use rustls::pki_types::{InvalidDnsNameError, ServerName};

/// Where a base URL's requests go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Address {
    /// `host:port`, the port the scheme's default when the URL has none.
    pub(crate) authority: String,
    /// The URL's path, put before every request path (empty for a server root).
    pub(crate) path_prefix: String,
    /// For https: the host as the name the certificate must show.
    pub(crate) server_name: Option<ServerName<'static>>,
}

/// Why a URL is no backend's address.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AddressError {
    #[error("scheme {0:?} is not http or https")]
    Scheme(String),
    #[error("no host")]
    NoHost,
    #[error("host is not a TLS server name ({0})")]
    ServerName(#[from] InvalidDnsNameError),
}

/// The address of an http or https base URL.
pub(crate) fn address(url: &url::Url) -> Result<Address, AddressError> {
    let tls = match url.scheme() {
        "http" => false,
        "https" => true,
        other => return Err(AddressError::Scheme(other.into())),
    };
    let (Some(host), Some(port)) = (url.host(), url.port_or_known_default()) else {
        return Err(AddressError::NoHost);
    };
    let server_name = if tls { Some(server_name(&host)?) } else { None };
    Ok(Address {
        // `host_str` keeps an IPv6 address's brackets, as `host:port` needs them.
        authority: format!("{}:{port}", url.host_str().unwrap_or_default()),
        path_prefix: url.path().trim_end_matches('/').to_string(),
        server_name,
    })
}

/// The host of an https URL as a TLS server name (a DNS name or an IP address).
pub(crate) fn server_name(host: &url::Host<&str>) -> Result<ServerName<'static>, AddressError> {
    let text = match host {
        url::Host::Domain(d) => (*d).to_string(),
        url::Host::Ipv4(ip) => ip.to_string(),
        url::Host::Ipv6(ip) => ip.to_string(),
    };
    Ok(ServerName::try_from(text)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_come_from_the_host() {
        for (url, name) in [
            ("https://gpu-box.fleet:8443", "gpu-box.fleet"),
            ("https://10.0.0.7", "10.0.0.7"),
            ("https://[::1]:9", "::1"),
        ] {
            let url = url::Url::parse(url).unwrap();
            let got = server_name(&url.host().unwrap()).unwrap();
            assert_eq!(got.to_str(), name);
        }
    }
}
