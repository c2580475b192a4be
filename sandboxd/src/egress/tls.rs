//! TLS for the hosts the proxy looks into (a secret's hosts, the package cache's):
//! the per-daemon CA that signs a certificate for each such host on first use
//! ([`Tls::acceptor`]), and the client that verifies the real server against the
//! host's CA bundle ([`Tls::connector`]).
//!
//! The CA is made when the daemon starts and its key never leaves the daemon's
//! memory: no file holds it, and a restart makes another. Sandboxes trust it
//! through the bundle bound over their `/etc/ssl/certs/ca-certificates.crt`
//! ([`Tls::bundle`]: the host's bundle, then this CA); nothing on the host does.

use super::rules::Host;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("making the egress proxy's CA: {0}")]
    Ca(rcgen::Error),
    #[error("the CA bundle {path}: {why}")]
    Bundle { path: String, why: String },
    #[error("a certificate for {host}: {why}")]
    Leaf { host: String, why: String },
}

/// Certificates kept for intercepted hosts; past it, the oldest are dropped.
const MAX_LEAVES: usize = 1024;

/// A TLS client (HTTP/1.1) that trusts the CA certificates of `bundle` (PEM,
/// read from `path`): what the egress proxy and the chat's model endpoint use to
/// verify real servers.
pub fn client_config(bundle: &[u8], path: &str) -> Result<ClientConfig, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    let mut found = 0;
    for cert in CertificateDer::pem_slice_iter(bundle) {
        let cert = cert.map_err(|e| Error::Bundle { path: path.into(), why: e.to_string() })?;
        // A certificate rustls cannot use as a root is skipped, as OpenSSL would.
        if roots.add(cert).is_ok() {
            found += 1;
        }
    }
    if found == 0 {
        return Err(Error::Bundle { path: path.into(), why: "no usable CA certificate in it".into() });
    }
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Bundle { path: path.into(), why: e.to_string() })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(client)
}

pub struct Tls {
    /// The CA's certificate, PEM.
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
    /// One key for every host's certificate (signing is the cost that matters).
    leaf_key: KeyPair,
    leaves: Mutex<HashMap<Host, Arc<ServerConfig>>>,
    provider: Arc<CryptoProvider>,
    client: Arc<ClientConfig>,
    /// The host's bundle followed by the CA: what sandboxes trust.
    bundle: Vec<u8>,
}

impl Tls {
    /// A new CA, and a client trusting the certificates of `bundle` (PEM, read
    /// from `path`).
    pub fn new(bundle: &[u8], path: &str) -> Result<Tls, Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client = client_config(bundle, path)?;

        let ca_key = KeyPair::generate().map_err(Error::Ca)?;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, "sandboxd egress proxy CA");
        name.push(DnType::OrganizationName, "sandboxd");
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        params.not_before = rcgen::date_time_ymd(2024, 1, 1);
        params.not_after = rcgen::date_time_ymd(2124, 1, 1);
        let ca = params.self_signed(&ca_key).map_err(Error::Ca)?;
        let ca_pem = ca.pem();
        let mut with_ca = bundle.to_vec();
        if !with_ca.ends_with(b"\n") {
            with_ca.push(b'\n');
        }
        with_ca.extend_from_slice(b"# sandboxd's egress proxy CA (this daemon's run only)\n");
        with_ca.extend_from_slice(ca_pem.as_bytes());
        Ok(Tls {
            ca_pem,
            issuer: Issuer::new(params, ca_key),
            leaf_key: KeyPair::generate().map_err(Error::Ca)?,
            leaves: Mutex::new(HashMap::new()),
            provider,
            client: Arc::new(client),
            bundle: with_ca,
        })
    }

    /// The CA's certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// What a sandbox trusts: the host's bundle, then this CA.
    pub fn bundle(&self) -> &[u8] {
        &self.bundle
    }

    /// The client side of a connection to a real server (verified against the
    /// host's bundle).
    pub fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(self.client.clone())
    }

    /// The server side of a sandbox's connection to `host`: a certificate for it,
    /// signed by the CA (made once per host).
    pub fn acceptor(&self, host: &Host) -> Result<tokio_rustls::TlsAcceptor, Error> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(config) = leaves.get(host) {
            return Ok(tokio_rustls::TlsAcceptor::from(config.clone()));
        }
        let config = Arc::new(self.server_config(host)?);
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(host.clone(), config.clone());
        Ok(tokio_rustls::TlsAcceptor::from(config))
    }

    fn server_config(&self, host: &Host) -> Result<ServerConfig, Error> {
        let leaf = |why: String| Error::Leaf { host: host.text(), why };
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, host.text());
        params.distinguished_name = name;
        params.subject_alt_names = vec![match host {
            Host::Name(n) => SanType::DnsName(n.clone().try_into().map_err(|e: rcgen::Error| leaf(e.to_string()))?),
            Host::Ip(ip) => SanType::IpAddress(*ip),
        }];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.not_before = rcgen::date_time_ymd(2024, 1, 1);
        params.not_after = rcgen::date_time_ymd(2124, 1, 1);
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&self.leaf_key, &self.issuer).map_err(|e| leaf(e.to_string()))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| leaf(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .map_err(|e| leaf(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A certificate the daemon signs for a host is one a client trusting the
    /// daemon's bundle accepts for that host, and only for it.
    #[tokio::test]
    async fn a_client_trusting_the_bundle_accepts_the_hosts_certificate() {
        // A bundle of one unrelated CA stands in for the host's.
        let other = Tls::new(b"", "none").err();
        assert!(matches!(other, Some(Error::Bundle { .. })), "an empty bundle is refused");
        let host_ca = {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::default();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.self_signed(&key).unwrap().pem()
        };
        let tls = Tls::new(host_ca.as_bytes(), "test").unwrap();
        assert!(tls.bundle().starts_with(host_ca.as_bytes()));
        assert!(std::str::from_utf8(tls.bundle()).unwrap().ends_with(tls.ca_pem()));

        // What a sandbox's client trusts: the bundle.
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(tls.bundle()) {
            let _ = roots.add(c.unwrap());
        }
        let client = Arc::new(
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth(),
        );
        let host = Host::parse("api.example.com").unwrap();
        for (name, ok) in [("api.example.com", true), ("other.example.com", false)] {
            let acceptor = tls.acceptor(&host).unwrap();
            let (a, b) = tokio::io::duplex(64 * 1024);
            let server = tokio::spawn(async move {
                let mut s = acceptor.accept(a).await.ok()?;
                s.write_all(b"hello").await.ok()?;
                s.shutdown().await.ok()
            });
            let connector = tokio_rustls::TlsConnector::from(client.clone());
            let server_name = rustls_pki_types::ServerName::try_from(name.to_string()).unwrap();
            let got = async {
                let mut c = connector.connect(server_name, b).await?;
                let mut text = String::new();
                c.read_to_string(&mut text).await?;
                Ok::<_, std::io::Error>(text)
            }
            .await;
            let _ = server.await;
            assert_eq!(got.is_ok(), ok, "{name}: {got:?}");
            if ok {
                assert_eq!(got.unwrap(), "hello");
            }
        }
        // Made once per host.
        assert_eq!(tls.leaves.lock().unwrap().len(), 1);
    }
}
