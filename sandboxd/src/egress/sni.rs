//! A relayed tunnel's first bytes: the TLS ClientHello, whose server name must be
//! the host the CONNECT named. The proxy cannot see inside a tunnel it relays;
//! without this a sandbox could CONNECT to an allowed host and then ask, in its
//! TLS, for another site served at the same address (a CDN's: domain fronting).
//!
//! The hello is parsed by rustls ([`rustls::server::Acceptor`], which only reads
//! it) and the same bytes are then sent on, unchanged, to the real server.

use super::rules::{code, Host, Refusal};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The most bytes a ClientHello may take (a post-quantum key share makes one
/// of a few KiB).
pub const MAX_HELLO: usize = 64 * 1024;
/// The longest the hello may take to arrive.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// The most TLS records a hello may come in (one, from every client we know).
const MAX_RECORDS: usize = 4;

/// How many whole TLS records `bytes` holds, if it ends where one does: only
/// then is it worth parsing (a hello trickled a byte at a time is parsed once per
/// record, not once per byte).
fn whole_records(bytes: &[u8]) -> Option<usize> {
    let (mut at, mut records) = (0, 0);
    while at < bytes.len() {
        let header = bytes.get(at..at + 5)?;
        at += 5 + usize::from(u16::from_be_bytes([header[3], header[4]]));
        records += 1;
    }
    (at == bytes.len()).then_some(records)
}

/// What the bytes so far say.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// Not a whole ClientHello yet.
    More,
    /// A ClientHello, and the server name it asks for.
    Name(Option<String>),
}

/// Read `bytes` (the tunnel's first, all of them so far) as a TLS ClientHello.
pub fn parse(bytes: &[u8]) -> Result<Hello, String> {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut rest = bytes;
    while !rest.is_empty() {
        match acceptor.read_tls(&mut rest) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => return Err(format!("not TLS: {e}")),
        }
    }
    match acceptor.accept() {
        Ok(None) => Ok(Hello::More),
        Ok(Some(accepted)) => Ok(Hello::Name(accepted.client_hello().server_name().map(str::to_string))),
        Err((e, _)) => Err(format!("not a TLS ClientHello: {e}")),
    }
}

/// Whether a hello asking for `name` may go to `host` (the CONNECT's): the
/// same name (any case), or no name for an IP address.
pub fn allowed(host: &Host, name: Option<&str>) -> Result<(), String> {
    match (host, name) {
        (Host::Name(h), Some(n)) if n.eq_ignore_ascii_case(h) => Ok(()),
        (Host::Name(h), Some(n)) => Err(format!("the tunnel to {h} asks its TLS for {n}")),
        (Host::Name(h), None) => Err(format!("the tunnel to {h} sends no server name in its TLS")),
        (Host::Ip(_), None) => Ok(()),
        (Host::Ip(ip), Some(n)) => Err(format!("the tunnel to {ip} asks its TLS for {n}")),
    }
}

/// Read the tunnel's ClientHello from `sandbox` and check its server name against
/// `host`: the bytes read, to send on. A refusal otherwise (not TLS, another
/// name, too slow or too long).
pub async fn read_hello<R: AsyncRead + Unpin>(sandbox: &mut R, host: &Host) -> Result<Vec<u8>, Refusal> {
    let refused = |why: String| Refusal::new(code::TUNNEL_REFUSED, why);
    let mut bytes = Vec::with_capacity(2048);
    let read = async {
        loop {
            let mut chunk = [0u8; 4096];
            let n = sandbox.read(&mut chunk).await.map_err(|e| refused(format!("reading the tunnel: {e}")))?;
            if n == 0 {
                return Err(refused("the tunnel closed before its TLS began".into()));
            }
            bytes.extend_from_slice(&chunk[..n]);
            // Not a handshake record at all: said at once, not after the wait.
            let tls = bytes.first() == Some(&0x16);
            let hello = match whole_records(&bytes) {
                None if tls && bytes.len() < MAX_HELLO => continue,
                Some(records) if records > MAX_RECORDS => {
                    return Err(refused(format!("its TLS ClientHello comes in over {MAX_RECORDS} records")))
                }
                _ => parse(&bytes),
            };
            match hello {
                Ok(Hello::More) if bytes.len() < MAX_HELLO => continue,
                Ok(Hello::More) => return Err(refused(format!("its TLS ClientHello is over {MAX_HELLO} bytes"))),
                Ok(Hello::Name(name)) => return allowed(host, name.as_deref()).map_err(refused),
                Err(e) => {
                    return Err(refused(format!(
                    "the proxy relays only TLS through CONNECT ({e}); send plain http:// requests to it as HTTP_PROXY"
                )))
                }
            }
        }
    };
    match tokio::time::timeout(HELLO_TIMEOUT, read).await {
        Ok(Ok(())) => Ok(bytes),
        Ok(Err(why)) => Err(why),
        Err(_) => Err(refused(format!("no TLS ClientHello within {} s", HELLO_TIMEOUT.as_secs()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_is_parsed_only_when_its_records_are_whole() {
        let h = hello("api.example.com");
        assert_eq!(whole_records(&h), Some(1));
        assert_eq!(whole_records(&h[..h.len() - 1]), None);
        assert_eq!(whole_records(&h[..3]), None);
        let mut two = h.clone();
        two.extend_from_slice(&[0x16, 3, 1, 0, 0]);
        assert_eq!(whole_records(&two), Some(2));
        assert_eq!(whole_records(&[]), Some(0));
    }
    use std::sync::Arc;

    /// The ClientHello a real client (rustls) sends for `name`.
    fn hello(name: &str) -> Vec<u8> {
        let roots = rustls::RootCertStore::empty();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server = rustls_pki_types::ServerName::try_from(name.to_string()).unwrap();
        let mut client = rustls::ClientConnection::new(Arc::new(config), server).unwrap();
        let mut out = vec![];
        client.write_tls(&mut out).unwrap();
        out
    }

    #[test]
    fn the_server_name_is_read_from_a_real_hello_in_any_number_of_pieces() {
        let bytes = hello("pypi.org");
        assert_eq!(parse(&bytes).unwrap(), Hello::Name(Some("pypi.org".into())));
        assert_eq!(parse(&bytes[..bytes.len() / 2]).unwrap(), Hello::More);
        assert_eq!(parse(&bytes[..3]).unwrap(), Hello::More);
        // An IP address is sent without a name.
        assert_eq!(parse(&hello("198.51.100.10")).unwrap(), Hello::Name(None));
        assert!(parse(b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n").is_err());
    }

    #[test]
    fn only_the_connects_own_name_may_be_asked_for() {
        let h = |s: &str| Host::parse(s).unwrap();
        assert!(allowed(&h("pypi.org"), Some("PyPI.org")).is_ok());
        assert_eq!(
            allowed(&h("pypi.org"), Some("evil.example")).unwrap_err(),
            "the tunnel to pypi.org asks its TLS for evil.example"
        );
        assert!(allowed(&h("pypi.org"), None).is_err());
        assert!(allowed(&h("198.51.100.10"), None).is_ok());
        assert!(allowed(&h("198.51.100.10"), Some("pypi.org")).is_err());
    }

    #[tokio::test]
    async fn a_tunnel_is_read_until_its_hello_and_what_was_read_goes_on_unchanged() {
        let bytes = hello("api.test.example");
        let (mut client, mut proxy) = tokio::io::duplex(64);
        let sent = bytes.clone();
        let writer = tokio::spawn(async move {
            for piece in sent.chunks(50) {
                tokio::io::AsyncWriteExt::write_all(&mut client, piece).await.unwrap();
            }
            client
        });
        let got = read_hello(&mut proxy, &Host::parse("api.test.example").unwrap()).await.unwrap();
        assert_eq!(got, bytes);
        drop(writer.await.unwrap());
        let (mut client, mut proxy) = tokio::io::duplex(4096);
        tokio::io::AsyncWriteExt::write_all(&mut client, &hello("other.test.example")).await.unwrap();
        let r = read_hello(&mut proxy, &Host::parse("api.test.example").unwrap()).await.unwrap_err();
        assert_eq!(r.line(), "tunnel_refused: the tunnel to api.test.example asks its TLS for other.test.example");
    }
}
