//! What a sandbox may reach, as pure rules: the hosts and ports a policy allows
//! ([`Rules`], its [`HostPattern`]s), and the addresses no name may lead to
//! ([`forbidden`]). No I/O here: the proxy ([`super::serve`]) resolves and
//! connects; these decide, and are unit-tested on their own.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A host as a request names it: a lower-case DNS name (no trailing dot) or an IP
/// address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    Name(String),
    Ip(IpAddr),
}

impl Host {
    /// Read a request's host: a name, an IPv4 address, or an IPv6 address in
    /// brackets (as in a URI or a CONNECT authority) or bare.
    pub fn parse(text: &str) -> Result<Host, String> {
        let inner = text.strip_prefix('[').and_then(|t| t.strip_suffix(']'));
        if let Some(v6) = inner {
            return v6.parse::<Ipv6Addr>().map(|a| Host::Ip(IpAddr::V6(a))).map_err(|_| bad_host(text));
        }
        if let Ok(ip) = text.parse::<IpAddr>() {
            return Ok(Host::Ip(ip));
        }
        let name = text.strip_suffix('.').unwrap_or(text).to_ascii_lowercase();
        if is_name(&name) {
            Ok(Host::Name(name))
        } else {
            Err(bad_host(text))
        }
    }

    /// As logs, results and refusals show it.
    pub fn text(&self) -> String {
        match self {
            Host::Name(n) => n.clone(),
            Host::Ip(IpAddr::V6(a)) => format!("[{a}]"),
            Host::Ip(a) => a.to_string(),
        }
    }
}

fn bad_host(text: &str) -> String {
    format!("{:?} is not a host name or an IP address", crate::isolate::channel::excerpt(text.as_bytes()))
}

/// A DNS name in its ASCII form: labels of letters, digits and `-` (not at either
/// end), 1 to 63 bytes each, at most 253 in all, and not all digits (an address).
fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
        && !name.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

/// One entry of a policy's `allow_hosts` (or a secret's `hosts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// This name only.
    Exact(String),
    /// `*.example.org`: every name below `example.org` (kept as `.example.org`),
    /// not `example.org` itself.
    Below(String),
    /// This address only.
    Ip(IpAddr),
}

impl HostPattern {
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        let why = || {
            format!("{text:?} is not a host pattern: use a name (data.example.com), `*.` and a name (*.example.org) or an IP address")
        };
        if text != text.trim() || text.is_empty() {
            return Err(why());
        }
        if let Some(rest) = text.strip_prefix("*.") {
            return match Host::parse(rest) {
                Ok(Host::Name(n)) if n.contains('.') && n == rest => Ok(HostPattern::Below(format!(".{n}"))),
                _ => Err(why()),
            };
        }
        match Host::parse(text) {
            Ok(Host::Name(n)) if n == text => Ok(HostPattern::Exact(n)),
            Ok(Host::Ip(ip)) => Ok(HostPattern::Ip(ip)),
            _ => Err(why()),
        }
    }

    pub fn matches(&self, host: &Host) -> bool {
        match (self, host) {
            (HostPattern::Exact(p), Host::Name(n)) => p == n,
            (HostPattern::Below(suffix), Host::Name(n)) => n.len() > suffix.len() && n.ends_with(suffix.as_str()),
            (HostPattern::Ip(p), Host::Ip(a)) => p == a,
            _ => false,
        }
    }
}

/// Whether every host `pattern` matches is matched by some pattern of `allowed`.
pub fn covers(allowed: &[HostPattern], pattern: &HostPattern) -> bool {
    match pattern {
        HostPattern::Exact(n) => allowed.iter().any(|a| a.matches(&Host::Name(n.clone()))),
        HostPattern::Ip(ip) => allowed.iter().any(|a| a.matches(&Host::Ip(*ip))),
        HostPattern::Below(suffix) => allowed.iter().any(|a| match a {
            HostPattern::Below(wider) => suffix.ends_with(wider.as_str()),
            _ => false,
        }),
    }
}

/// Parse every pattern of a list; the first bad one is the error.
pub fn patterns(list: &[String]) -> Result<Vec<HostPattern>, String> {
    list.iter().map(|h| HostPattern::parse(h)).collect()
}

/// Why the proxy did not serve a request: a code the sandbox's client prints (the
/// refusal's status line and body carry `code: message`), and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: &'static str,
    pub message: String,
}

impl Refusal {
    pub fn new(code: &'static str, message: impl Into<String>) -> Refusal {
        Refusal { code, message: message.into() }
    }

    /// One line: `code: message`.
    pub fn line(&self) -> String {
        format!("{}: {}", self.code, self.message)
    }
}

/// A refusal's codes.
pub mod code {
    /// The host is not in the policy's `allow_hosts`.
    pub const HOST_NOT_ALLOWED: &str = "host_not_allowed";
    /// The port is not in the policy's `allow_ports`.
    pub const PORT_NOT_ALLOWED: &str = "port_not_allowed";
    /// The name leads to an address no sandbox may reach.
    pub const ADDRESS_NOT_ALLOWED: &str = "address_not_allowed";
    /// The name did not resolve.
    pub const NAME_NOT_RESOLVED: &str = "name_not_resolved";
    /// No connection to the host could be made.
    pub const CONNECT_FAILED: &str = "connect_failed";
    /// The request carries a secret's placeholder to a host not among the secret's.
    pub const SECRET_NOT_ALLOWED: &str = "secret_not_allowed";
    /// A secret's host answered in a form the proxy cannot look through for the
    /// secrets' values (compressed, though asked for identity).
    pub const ANSWER_REFUSED: &str = "answer_refused";
    /// A relayed tunnel's TLS names another server than the CONNECT did, or is
    /// not TLS.
    pub const TUNNEL_REFUSED: &str = "tunnel_refused";
    /// The sandbox has its most connections open already.
    pub const TOO_MANY_CONNECTIONS: &str = "too_many_connections";
    /// Not a request the proxy serves (not HTTP, a bad host, an https:// URL
    /// without CONNECT).
    pub const BAD_REQUEST: &str = "bad_request";
}

/// The hosts and ports of one policy.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    pub hosts: Vec<HostPattern>,
    pub ports: Vec<u16>,
    /// As the policy wrote them, for messages.
    pub shown: Vec<String>,
    pub policy: String,
}

/// Hosts a refusal names before it says how many more there are.
const SHOWN_HOSTS: usize = 8;

impl Rules {
    /// The allowed hosts as a refusal names them: the first few, and how many more.
    fn allowed(&self) -> String {
        let mut text = self.shown.iter().take(SHOWN_HOSTS).cloned().collect::<Vec<_>>().join(", ");
        if self.shown.len() > SHOWN_HOSTS {
            text.push_str(&format!(" and {} more", self.shown.len() - SHOWN_HOSTS));
        }
        text
    }

    pub fn new(policy: &str, hosts: &[String], ports: &[u16]) -> Result<Rules, String> {
        Ok(Rules { hosts: patterns(hosts)?, ports: ports.to_vec(), shown: hosts.to_vec(), policy: policy.to_string() })
    }

    /// May a sandbox under these rules reach `host` on `port`?
    pub fn check(&self, host: &Host, port: u16) -> Result<(), Refusal> {
        if !self.hosts.iter().any(|p| p.matches(host)) {
            return Err(Refusal::new(
                code::HOST_NOT_ALLOWED,
                format!(
                    "{} is not in allow_hosts of policy {:?} ({}); only those hosts are reachable",
                    host.text(),
                    self.policy,
                    self.allowed()
                ),
            ));
        }
        if !self.ports.contains(&port) {
            let ports: Vec<String> = self.ports.iter().map(u16::to_string).collect();
            return Err(Refusal::new(
                code::PORT_NOT_ALLOWED,
                format!(
                    "port {port} of {} is not in allow_ports of policy {:?} ({})",
                    host.text(),
                    self.policy,
                    ports.join(", ")
                ),
            ));
        }
        Ok(())
    }
}

/// Why no sandbox may reach `addr`, if none may: the host's own loopback and
/// private networks, link-local addresses (the cloud metadata service among
/// them), unique-local, multicast, reserved and unspecified ones, and v6 forms of
/// such v4 addresses (mapped, NAT64, 6to4). `local` are the host's own
/// addresses, refused whatever range they are in.
pub fn forbidden(addr: IpAddr, local: &[IpAddr]) -> Option<&'static str> {
    let by_range = match addr {
        IpAddr::V4(a) => forbidden_v4(a),
        IpAddr::V6(a) => forbidden_v6(a, local),
    };
    by_range.or_else(|| local.contains(&addr).then_some("an address of the sandboxd host itself"))
}

fn forbidden_v4(a: Ipv4Addr) -> Option<&'static str> {
    let [b0, b1, b2, _] = a.octets();
    if a.is_loopback() {
        Some("a loopback address")
    } else if a.is_private() {
        Some("a private address")
    } else if a.is_link_local() {
        Some("a link-local address (the cloud metadata service is one)")
    } else if b0 == 100 && (64..128).contains(&b1) {
        Some("a shared (carrier-grade NAT) address")
    } else if b0 == 0 || a.is_unspecified() {
        Some("an unspecified address")
    } else if a.is_multicast() || a.is_broadcast() || b0 >= 240 {
        Some("a multicast, broadcast or reserved address")
    } else if b0 == 192 && b1 == 0 && b2 == 0 {
        Some("an IETF protocol address")
    } else if b0 == 198 && (b1 == 18 || b1 == 19) {
        Some("a benchmarking address")
    } else {
        None
    }
}

fn forbidden_v6(a: Ipv6Addr, local: &[IpAddr]) -> Option<&'static str> {
    let s = a.segments();
    // v4 inside v6: mapped (::ffff:a.b.c.d), translated (::ffff:0:a.b.c.d, SIIT),
    // NAT64 (64:ff9b::/96), 6to4 (2002::/16).
    let siit = s[0..4] == [0, 0, 0, 0] && s[4] == 0xffff && s[5] == 0;
    let nat64 = s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0];
    let embedded = if let Some(v4) = a.to_ipv4_mapped() {
        Some(v4)
    } else if siit || nat64 {
        Some(Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8))
    } else if s[0] == 0x2002 {
        Some(Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8))
    } else {
        None
    };
    if let Some(v4) = embedded {
        return forbidden(IpAddr::V4(v4), local);
    }
    if a.is_loopback() {
        Some("a loopback address")
    } else if a.is_unspecified() {
        Some("an unspecified address")
    } else if (s[0] & 0xfe00) == 0xfc00 {
        Some("a unique-local (private) address")
    } else if (s[0] & 0xffc0) == 0xfe80 || (s[0] & 0xffc0) == 0xfec0 {
        Some("a link-local address")
    } else if a.is_multicast() {
        Some("a multicast address")
    } else if s[0] == 0 && s[1] == 0 && s[2] == 0 && s[3] == 0 && s[4] == 0 && s[5] == 0 {
        // ::a.b.c.d, the deprecated v4-compatible form, and the rest of ::/96.
        Some("a reserved address")
    } else if s[0] == 0x100 && s[1..4] == [0, 0, 0] {
        Some("a discard address")
    } else if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
        // 64:ff9b:1::/48: a network's own NAT64, whose v4 it cannot be told.
        Some("a local NAT64 address")
    } else if s[0] == 0x2001 && s[1] == 0 {
        // 2001::/32: Teredo, a v4 address and port inside.
        Some("a Teredo address")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(t: &str) -> Host {
        Host::parse(t).unwrap()
    }

    #[test]
    fn hosts_are_read_lower_case_without_their_last_dot() {
        assert_eq!(host("PyPI.org."), Host::Name("pypi.org".into()));
        assert_eq!(host("203.0.113.5"), Host::Ip("203.0.113.5".parse().unwrap()));
        assert_eq!(host("[::1]"), Host::Ip("::1".parse().unwrap()));
        assert_eq!(host("::1"), Host::Ip("::1".parse().unwrap()));
        assert_eq!(host("[2001:db8::1]").text(), "[2001:db8::1]");
        for bad in ["", "a..b", "-a.b", "a-.b", "a b", "ex\u{e4}mple.com", "a_b.c", "[1.2.3.4]", "1.2.3", "x/y", "a:b"]
        {
            assert!(Host::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Host::parse(&"a".repeat(64)).is_err());
        assert!(Host::parse(&format!("{}.com", "a.".repeat(130))).is_err());
    }

    #[test]
    fn patterns_match_exact_names_names_below_and_addresses() {
        let exact = HostPattern::parse("data.example.com").unwrap();
        assert!(exact.matches(&host("DATA.example.com")));
        assert!(!exact.matches(&host("x.data.example.com")) && !exact.matches(&host("example.com")));
        let below = HostPattern::parse("*.example.org").unwrap();
        assert!(below.matches(&host("a.example.org")) && below.matches(&host("a.b.example.org")));
        assert!(!below.matches(&host("example.org")) && !below.matches(&host("badexample.org")));
        let ip = HostPattern::parse("203.0.113.9").unwrap();
        assert!(ip.matches(&host("203.0.113.9")) && !ip.matches(&host("203.0.113.10")));
        for bad in
            ["", " a.com", "*", "*.", "*.com", "**.a.com", "a.*.com", "*.A.com", "A.com", "http://a.com", "a.com:443"]
        {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_pattern_is_covered_when_every_host_it_matches_is() {
        let allowed = patterns(&["*.example.org".into(), "api.example.com".into(), "203.0.113.9".into()]).unwrap();
        for (p, ok) in [
            ("api.example.com", true),
            ("x.example.org", true),
            ("*.a.example.org", true),
            ("*.example.org", true),
            ("example.org", false),
            ("*.example.com", false),
            ("203.0.113.9", true),
            ("203.0.113.10", false),
        ] {
            assert_eq!(covers(&allowed, &HostPattern::parse(p).unwrap()), ok, "{p}");
        }
    }

    #[test]
    fn rules_refuse_other_hosts_and_ports_saying_what_is_allowed() {
        let rules = Rules::new("default", &["pypi.org".into(), "*.pythonhosted.org".into()], &[443]).unwrap();
        assert!(rules.check(&host("files.pythonhosted.org"), 443).is_ok());
        let r = rules.check(&host("evil.example"), 443).unwrap_err();
        assert_eq!(r.code, code::HOST_NOT_ALLOWED);
        assert_eq!(
            r.line(),
            "host_not_allowed: evil.example is not in allow_hosts of policy \"default\" (pypi.org, *.pythonhosted.org); only those hosts are reachable"
        );
        let many: Vec<String> = (0..10).map(|i| format!("h{i}.example")).collect();
        let r = Rules::new("p", &many, &[443]).unwrap().check(&host("x.example"), 443).unwrap_err();
        assert!(r.message.contains("(h0.example, h1.example, h2.example, h3.example, h4.example, h5.example, h6.example, h7.example and 2 more)"), "{}", r.message);
        let r = rules.check(&host("pypi.org"), 22).unwrap_err();
        assert_eq!(r.line(), "port_not_allowed: port 22 of pypi.org is not in allow_ports of policy \"default\" (443)");
    }

    #[test]
    fn the_host_its_networks_and_metadata_are_never_reachable() {
        let local: Vec<IpAddr> = vec!["192.0.2.2".parse().unwrap()];
        let no = |a: &str| forbidden(a.parse().unwrap(), &local);
        for bad in [
            "127.0.0.1",
            "127.1.2.3",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.100.100.200",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "192.0.0.170",
            "198.18.0.1",
            "192.0.2.2",
            "::1",
            "::",
            "fd00:ec2::254",
            "fc00::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.2.3",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "2002:c000:202::1",
            "100::1",
            "::ffff:0:7f00:1",
            "64:ff9b:1::7f00:1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        ] {
            assert!(no(bad).is_some(), "{bad} should be refused");
        }
        // Public and documentation addresses are reachable (this machine's package
        // index answers on 203.0.113.80); the host's neighbours are not its own.
        for ok in [
            "203.0.113.80",
            "198.51.100.10",
            "192.0.2.1",
            "8.8.8.8",
            "2001:db8::1",
            "2a00:1450::1",
            "64:ff9b::808:808",
            "::ffff:0:808:808",
        ] {
            assert_eq!(no(ok), None, "{ok} should be reachable");
        }
        assert_eq!(no("127.0.0.1"), Some("a loopback address"));
        assert_eq!(no("::ffff:192.0.2.2"), Some("an address of the sandboxd host itself"));
    }
}
