//! Plain `http://` requests for the package hosts, carried to them over TLS.
//!
//! An installer that speaks TLS to the proxy pays for it at every install: uv
//! seeds its TLS library's random generator from CPU jitter before its first
//! handshake (~40 ms of CPU per process), and the proxy ends that TLS again to
//! look into it. The sandbox's side of the proxy is a loopback socket in the
//! sandbox's own network namespace, with nothing on the way to read or change it.
//! So the installer asks the package hosts in plain HTTP, naming their TLS port
//! (`http://pypi.org:443/simple/`), and the proxy goes to them over TLS, verified,
//! as it does for a tunnel it looks into ([`super::forward`]): the same checks,
//! secrets, cache and pages. A plain request to a TLS port never worked before (a
//! TLS server does not answer one), so nothing that worked changes; a plain
//! request to port 80 is forwarded in plain HTTP as ever.
//!
//! The package hosts: the session's package index (its policy's `index_url`, over
//! TLS, when it installs packages) and the package cache's file hosts at 443.
//! An index page asked this way has its links to them written plain too
//! (`https://files.pythonhosted.org/` becomes `http://files.pythonhosted.org:443/`),
//! so the installer's next request is plain as well; a link left as it was (to
//! another host, or in a page the index compressed) still works, through a tunnel.

use super::bodies::{Body, Rewritten};
use super::rules::Host;
use super::secrets::Rewriter;
use super::{Egress, Tenant};
use http_body_util::BodyExt;
use hyper::header::{self, HeaderValue};
use hyper::Response;

/// The hosts and TLS ports a plain request is carried to over TLS.
fn package_hosts(egress: &Egress, tenant: &Tenant) -> Vec<(Host, u16)> {
    let mut hosts: Vec<(Host, u16)> = egress.cache_hosts.iter().map(|h| (h.clone(), 443)).collect();
    if let Some((host, port, _)) = &tenant.index {
        if !hosts.iter().any(|(h, p)| h == host && p == port) {
            hosts.push((host.clone(), *port));
        }
    }
    hosts
}

/// Whether a plain request for `host:port` goes to it over TLS.
pub(super) fn carried(egress: &Egress, tenant: &Tenant, host: &Host, port: u16) -> bool {
    package_hosts(egress, tenant).iter().any(|(h, p)| h == host && *p == port)
}

/// The session's package index as a plain URL the proxy carries over TLS
/// (`https://pypi.org/simple` → `http://pypi.org:443/simple/`), if it has one.
pub fn index_url(tenant: &Tenant) -> Option<String> {
    let (host, port, path) = tenant.index.as_ref()?;
    Some(format!("http://{}:{port}{path}/", host.text()))
}

/// The links to the package hosts as index pages write them, each with the
/// plain form that reaches the same host over TLS.
fn links(egress: &Egress, tenant: &Tenant) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut pairs = vec![];
    for (host, port) in package_hosts(egress, tenant) {
        let plain = format!("http://{}:{port}/", host.text()).into_bytes();
        if port == 443 {
            pairs.push((format!("https://{}/", host.text()).into_bytes(), plain.clone()));
        }
        pairs.push((format!("https://{}:{port}/", host.text()).into_bytes(), plain));
    }
    pairs
}

/// The answer to a plain request carried over TLS: a redirect to a package host
/// stays plain, and so do an index page's links (`page`: the request was one of
/// the index's pages, [`super::pages::key`]) unless the page is compressed.
pub(super) fn answer(egress: &Egress, tenant: &Tenant, answer: Response<Body>, page: bool) -> Response<Body> {
    let (mut parts, body) = answer.into_parts();
    let mut rewriter = Rewriter::replacing(links(egress, tenant));
    if let Some(location) = parts.headers.get(header::LOCATION) {
        let plain = rewriter.whole(location.as_bytes()).ok().and_then(|v| HeaderValue::from_bytes(&v).ok());
        if let Some(plain) = plain {
            parts.headers.insert(header::LOCATION, plain);
        }
    }
    let identity = parts.headers.get_all(header::CONTENT_ENCODING).iter().all(|v| v == "identity");
    if !page || !identity {
        return Response::from_parts(parts, body);
    }
    // Its length changes with its links: it goes chunked.
    parts.headers.remove(header::CONTENT_LENGTH);
    let body = Rewritten::new(body, rewriter).boxed();
    Response::from_parts(parts, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(pairs: Vec<(Vec<u8>, Vec<u8>)>, chunks: &[&str]) -> String {
        let mut r = Rewriter::replacing(pairs);
        let mut out = vec![];
        for c in chunks {
            out.extend(r.push(c.as_bytes()).unwrap());
        }
        out.extend(r.finish().unwrap());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn links_to_the_package_hosts_become_plain_and_others_stay() {
        let pairs = vec![
            (b"https://files.pythonhosted.org/".to_vec(), b"http://files.pythonhosted.org:443/".to_vec()),
            (b"https://files.pythonhosted.org:443/".to_vec(), b"http://files.pythonhosted.org:443/".to_vec()),
        ];
        let page = r#"{"files":[{"url":"https://files.pythonhosted.org/packages/ab/t.whl"},{"url":"https://example.org/x.whl"}]}"#;
        let want = r#"{"files":[{"url":"http://files.pythonhosted.org:443/packages/ab/t.whl"},{"url":"https://example.org/x.whl"}]}"#;
        assert_eq!(rewritten(pairs.clone(), &[page]), want);
        // Split anywhere, even inside a link.
        for cut in 1..page.len() {
            assert_eq!(rewritten(pairs.clone(), &[&page[..cut], &page[cut..]]), want, "cut at {cut}");
        }
        // A link to the same host on another port, or to a host whose name ends
        // the same, is not the package host's.
        let other = "https://files.pythonhosted.org:8443/a https://files.pythonhosted.org.example/b";
        assert_eq!(rewritten(pairs, &[other]), other);
    }
}
