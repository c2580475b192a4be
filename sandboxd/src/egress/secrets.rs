//! Secrets the sandbox uses but never reads. The sandbox's variable holds a
//! random placeholder; the proxy puts the real value in its place only in
//! requests to the secret's hosts, over TLS (a plain `http://` request would show
//! the value to the network), and only in the parts of the request the secret
//! names (`substitute_in`: headers by default; see
//! [`crate::model::policy::SecretPlace`] for why). A placeholder anywhere else
//! refuses the request. An answer of a secret's host gets the placeholder back
//! wherever it shows a value of the session's secrets (a server that echoes a
//! header must not hand it to the sandbox), policy secrets' values first, then
//! the session's own: a value a tenant set itself never covers bytes of one the
//! operator set, so it cannot make the operator's show through.
//!
//! Pure: [`Secrets`] decides and [`Rewriter`] rewrites a stream of bytes, a chunk
//! at a time, finding a placeholder or a value split across chunks. The proxy
//! ([`super::forward`]) applies them.

use super::rules::{Host, HostPattern, Refusal};
use crate::model::policy::SecretPlace;
use aho_corasick::{AhoCorasick, MatchKind};
use std::borrow::Cow;

/// One secret as the proxy holds it for one session.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    pub name: String,
    pub hosts: Vec<HostPattern>,
    pub value: String,
    pub placeholder: String,
    /// Where in a request the value may be put.
    pub places: Vec<SecretPlace>,
    /// Set by the session through the API (not its policy's).
    pub own: bool,
    /// A session's own secret since deleted or given another value: never put in
    /// a request any more, but still taken out of its hosts' answers (which may
    /// have stored it), for the rest of the session.
    pub retired: bool,
}

// Never the value, whatever is logged.
impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret").field("name", &self.name).field("hosts", &self.hosts).finish_non_exhaustive()
    }
}

impl Secret {
    fn for_host(&self, host: &Host) -> bool {
        self.hosts.iter().any(|p| p.matches(host))
    }
}

/// A new placeholder: what the sandbox's variable holds instead of the value.
pub fn placeholder() -> String {
    format!("sandboxd-secret-{}", uuid::Uuid::new_v4().simple())
}

/// The secrets of one session (its policy's and its own).
#[derive(Debug, Clone, Default)]
pub struct Secrets(pub Vec<Secret>);

/// A session's secrets as they are now, shared by the session and every sandbox
/// of it the proxy serves: a secret set or deleted applies from the next request
/// on, also in a kernel that keeps running and in connections already open.
#[derive(Debug, Default)]
pub struct Live(std::sync::RwLock<std::sync::Arc<Secrets>>);

impl Live {
    pub fn get(&self) -> std::sync::Arc<Secrets> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set(&self, secrets: Secrets) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = std::sync::Arc::new(secrets);
    }
}

impl Secrets {
    /// Does a request to `host` carry any secret's value? (The proxy then
    /// terminates TLS for it.)
    pub fn for_host(&self, host: &Host) -> bool {
        self.0.iter().any(|s| s.for_host(host))
    }

    /// The secrets in use (not retired).
    fn current(&self) -> impl Iterator<Item = &Secret> {
        self.0.iter().filter(|s| !s.retired)
    }

    /// The variables the sandbox's environment gains: each name and its placeholder.
    pub fn environment(&self) -> std::collections::BTreeMap<String, String> {
        self.current().map(|s| (s.name.clone(), s.placeholder.clone())).collect()
    }

    /// The rewriting of `place` of a request to `host` (over TLS or not): each
    /// placeholder allowed there becomes its value; any other placeholder refuses
    /// the request ([`Secrets::refusal`] says why).
    pub fn outgoing(&self, host: &Host, place: SecretPlace, tls: bool) -> Rewriter {
        let pairs = self
            .current()
            .map(|s| {
                let allowed = tls && s.for_host(host) && s.places.contains(&place);
                Pair {
                    from: s.placeholder.clone().into_bytes(),
                    to: allowed.then(|| s.value.clone().into_bytes()),
                    name: s.name.clone(),
                }
            })
            .collect();
        Rewriter::new(vec![pairs])
    }

    /// The rewriting of what `host` answers: every value of the session's secrets
    /// becomes its placeholder again, the policy's first, then the session's own,
    /// then those it had. `None` for a host no secret goes (or went) to.
    pub fn incoming(&self, host: &Host) -> Option<Rewriter> {
        if !self.for_host(host) {
            return None;
        }
        let layer = |own: bool, retired: bool| -> Vec<Pair> {
            self.0
                .iter()
                .filter(|s| s.own == own && s.retired == retired)
                .map(|s| Pair {
                    from: s.value.clone().into_bytes(),
                    to: Some(s.placeholder.clone().into_bytes()),
                    name: s.name.clone(),
                })
                .collect()
        };
        Some(Rewriter::new(vec![layer(false, false), layer(true, false), layer(true, true)]))
    }

    /// The refusal of a request to `host` that carries secret `name`'s
    /// placeholder in `place`.
    pub fn refusal(&self, name: &str, host: &Host, place: SecretPlace, tls: bool) -> Refusal {
        let Some(secret) = self.current().find(|s| s.name == name) else {
            return Refusal::new(
                super::rules::code::SECRET_NOT_ALLOWED,
                format!("the request to {} carries the placeholder of a secret the session no longer has", host.text()),
            );
        };
        let why = if !secret.for_host(host) {
            let hosts: Vec<String> = secret
                .hosts
                .iter()
                .map(|p| match p {
                    HostPattern::Exact(n) => n.clone(),
                    HostPattern::Below(suffix) => format!("*{suffix}"),
                    HostPattern::Ip(ip) => ip.to_string(),
                })
                .collect();
            format!(", which only {} may receive", hosts.join(", "))
        } else if !tls {
            " over plain http, where anyone on the way would read the value: use https".to_string()
        } else {
            let places: Vec<&str> = secret.places.iter().map(|p| p.as_str()).collect();
            format!(
                " in its {}, where the secret may not go (substitute_in = [{}])",
                match place {
                    SecretPlace::Headers => "headers",
                    SecretPlace::Url => "URL",
                    SecretPlace::Body => "body",
                },
                places.iter().map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join(", ")
            )
        };
        Refusal::new(
            super::rules::code::SECRET_NOT_ALLOWED,
            format!("the request to {} carries the placeholder of secret {name}{why}", host.text()),
        )
    }
}

#[derive(Debug, Clone)]
struct Pair {
    from: Vec<u8>,
    /// `None`: finding `from` is an error (a placeholder where it may not go).
    to: Option<Vec<u8>>,
    name: String,
}

/// One pass of a [`Rewriter`]: its pairs, their automaton, and the bytes it
/// holds back.
#[derive(Debug, Clone)]
struct Layer {
    pairs: Vec<Pair>,
    /// Finds the pairs' `from`s in one pass whatever their number and length
    /// (leftmost, the longest winning a tie: a value that begins another is never
    /// found inside it, leaving the rest of the longer one to show).
    /// `None` if it could not be built (only for patterns far beyond a secret's
    /// size): the layer then refuses everything.
    finder: Option<AhoCorasick>,
    /// Bytes held back: the end of what came, which could begin a `from`.
    carry: Vec<u8>,
    longest: usize,
}

/// Rewrites a stream of bytes chunk by chunk: every occurrence of a pair's `from`
/// becomes its `to`, even when split across chunks (the last bytes that could
/// begin one wait for the next chunk, or [`Rewriter::finish`]). A `from` without a
/// `to` makes [`Rewriter::push`] fail with the pair's name. Its layers rewrite one
/// after the other, each what the one before gave.
#[derive(Debug, Clone)]
pub struct Rewriter {
    layers: Vec<Layer>,
    /// Whether anything was replaced (the length changed).
    changed: bool,
}

impl Rewriter {
    fn new(layers: Vec<Vec<Pair>>) -> Rewriter {
        let layers = layers
            .into_iter()
            .filter(|pairs| !pairs.is_empty())
            .map(|pairs| {
                let longest = pairs.iter().map(|p| p.from.len()).max().unwrap_or(0);
                // Any case: a value the answer shows in another case (a header
                // name, lower-cased) is still taken out, and a placeholder
                // upper-cased is still a placeholder.
                let finder = AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostLongest)
                    .ascii_case_insensitive(true)
                    .build(pairs.iter().map(|p| &p.from))
                    .map_err(|e| tracing::error!(error = %e, "could not build the secrets' rewriter: refusing"))
                    .ok();
                Layer { pairs, finder, carry: vec![], longest }
            })
            .collect();
        Rewriter { layers, changed: false }
    }

    /// A rewriter that makes each `from` its `to` (any case), and refuses nothing.
    pub fn replacing(pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Rewriter {
        let pairs = pairs.into_iter().map(|(from, to)| Pair { from, to: Some(to), name: String::new() }).collect();
        Rewriter::new(vec![pairs])
    }

    /// Nothing to find.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    pub fn changed(&self) -> bool {
        self.changed
    }

    /// Rewrite `chunk`: what can be passed on now. `Err(name)` when a refused
    /// placeholder appears.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<u8>, String> {
        let mut data = chunk.to_vec();
        for layer in &mut self.layers {
            let mut held = std::mem::take(&mut layer.carry);
            held.extend_from_slice(&data);
            let (out, rest) = layer.rewrite(&held, false, &mut self.changed)?;
            layer.carry = held[rest..].to_vec();
            data = out;
        }
        Ok(data)
    }

    /// The end of the stream: what was held back, rewritten.
    pub fn finish(&mut self) -> Result<Vec<u8>, String> {
        let mut data = vec![];
        for layer in &mut self.layers {
            let mut held = std::mem::take(&mut layer.carry);
            held.extend_from_slice(&data);
            data = layer.rewrite(&held, true, &mut self.changed)?.0;
        }
        Ok(data)
    }

    /// Rewrite the whole of `text` at once (a header's value, a request line).
    pub fn whole<'a>(&mut self, text: &'a [u8]) -> Result<Cow<'a, [u8]>, String> {
        let mut data = Cow::Borrowed(text);
        for layer in &mut self.layers {
            if layer.finder.as_ref().is_none_or(|f| f.is_match(data.as_ref())) {
                data = Cow::Owned(layer.rewrite(&data, true, &mut self.changed)?.0);
            }
        }
        Ok(data)
    }
}

impl Layer {
    /// Rewrite `data`; unless `last`, stop where a `from` could still begin in what
    /// comes next. The output and how much of `data` it consumed.
    fn rewrite(&self, data: &[u8], last: bool, changed: &mut bool) -> Result<(Vec<u8>, usize), String> {
        let Some(finder) = &self.finder else {
            return Err(self.pairs.first().map(|p| p.name.clone()).unwrap_or_default());
        };
        let mut out = Vec::with_capacity(data.len());
        let keep = if last { data.len() } else { data.len().saturating_sub(self.longest.saturating_sub(1)) };
        let mut i = 0;
        for found in finder.find_iter(data) {
            // A match starting at or after `keep` may be a longer `from`'s
            // beginning: it waits for the next chunk with the rest. One starting
            // before `keep` is whole (no `from` is longer than what follows it).
            if found.start() >= keep {
                break;
            }
            let pair = &self.pairs[found.pattern().as_usize()];
            let Some(to) = &pair.to else { return Err(pair.name.clone()) };
            out.extend_from_slice(&data[i..found.start()]);
            out.extend_from_slice(to);
            *changed = true;
            i = found.end();
        }
        let upto = keep.max(i);
        out.extend_from_slice(&data[i..upto]);
        Ok((out, upto))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SecretPlace::{Body, Headers, Url};

    fn secret(name: &str, host: &str, value: &str, placeholder: &str, places: &[SecretPlace], own: bool) -> Secret {
        Secret {
            name: name.into(),
            hosts: vec![HostPattern::parse(host).unwrap()],
            value: value.into(),
            placeholder: placeholder.into(),
            places: places.to_vec(),
            own,
            retired: false,
        }
    }

    fn secrets() -> Secrets {
        Secrets(vec![
            secret("API_KEY", "api.example.com", "real-value-123", "sandboxd-secret-aaaa", &[Headers], false),
            secret("OTHER", "*.other.example", "v2", "sandboxd-secret-bbbb", &[Headers, Url, Body], false),
        ])
    }

    fn host(h: &str) -> Host {
        Host::parse(h).unwrap()
    }

    /// Push `chunks` through, then finish: the whole output.
    fn through(r: &mut Rewriter, chunks: &[&[u8]]) -> Result<Vec<u8>, String> {
        let mut out = vec![];
        for c in chunks {
            out.extend(r.push(c)?);
        }
        out.extend(r.finish()?);
        Ok(out)
    }

    #[test]
    fn placeholders_become_values_only_for_their_hosts() {
        let s = secrets();
        let api = host("api.example.com");
        let mut out = s.outgoing(&api, Headers, true);
        assert_eq!(
            through(&mut out, &[b"Bearer sandboxd-secret-aaaa and more"]).unwrap(),
            b"Bearer real-value-123 and more"
        );
        assert!(out.changed());
        // The other secret's placeholder, to this host: refused, by name.
        let mut out = s.outgoing(&api, Headers, true);
        assert_eq!(through(&mut out, &[b"x sandboxd-secret-bbbb"]).unwrap_err(), "OTHER");
        // To a host of neither: both refused; plain text passes unchanged.
        let mut out = s.outgoing(&host("pypi.org"), Headers, true);
        assert_eq!(through(&mut out, &[b"sandboxd-secret-aaaa"]).unwrap_err(), "API_KEY");
        let mut out = s.outgoing(&host("pypi.org"), Headers, true);
        assert_eq!(through(&mut out, &[b"nothing here"]).unwrap(), b"nothing here");
        assert!(!out.changed());
        assert!(s.for_host(&host("a.other.example")) && !s.for_host(&host("other.example")));
        assert_eq!(
            s.refusal("API_KEY", &host("pypi.org"), Headers, true).line(),
            "secret_not_allowed: the request to pypi.org carries the placeholder of secret API_KEY, which only api.example.com may receive"
        );
    }

    #[test]
    fn a_placeholder_goes_only_where_its_secret_names_and_only_over_tls() {
        let s = secrets();
        let api = host("api.example.com");
        // API_KEY: headers only. In the URL or the body it is refused, saying where it may go.
        for place in [Url, Body] {
            let mut out = s.outgoing(&api, place, true);
            assert_eq!(out.whole(b"?key=sandboxd-secret-aaaa").unwrap_err(), "API_KEY");
        }
        assert_eq!(
            s.refusal("API_KEY", &api, Body, true).line(),
            "secret_not_allowed: the request to api.example.com carries the placeholder of secret API_KEY in its body, where the secret may not go (substitute_in = [\"headers\"])"
        );
        // OTHER may go in the URL and the body too.
        let h = host("x.other.example");
        assert_eq!(s.outgoing(&h, Url, true).whole(b"/q?k=sandboxd-secret-bbbb").unwrap().as_ref(), b"/q?k=v2");
        // Never over plain http, anywhere.
        for place in [Headers, Url, Body] {
            assert_eq!(s.outgoing(&api, place, false).whole(b"sandboxd-secret-aaaa").unwrap_err(), "API_KEY");
        }
        assert!(s
            .refusal("API_KEY", &api, Headers, false)
            .line()
            .ends_with("over plain http, where anyone on the way would read the value: use https"));
    }

    #[test]
    fn a_placeholder_split_across_chunks_is_found() {
        let s = secrets();
        let text = b"key=sandboxd-secret-aaaa;";
        for cut in 0..text.len() {
            let mut out = s.outgoing(&host("api.example.com"), Headers, true);
            let got = through(&mut out, &[&text[..cut], &text[cut..]]).unwrap();
            assert_eq!(got, b"key=real-value-123;", "cut at {cut}");
            let mut out = s.outgoing(&host("pypi.org"), Headers, true);
            assert!(through(&mut out, &[&text[..cut], &text[cut..]]).is_err(), "cut at {cut}");
        }
        // A byte at a time.
        let mut out = s.outgoing(&host("api.example.com"), Headers, true);
        let chunks: Vec<&[u8]> = text.chunks(1).collect();
        assert_eq!(through(&mut out, &chunks).unwrap(), b"key=real-value-123;");
    }

    #[test]
    fn an_answer_that_echoes_a_value_gives_back_the_placeholder() {
        let s = secrets();
        let mut back = s.incoming(&host("api.example.com")).unwrap();
        let text = b"{\"auth\":\"Bearer real-value-123\", \"other\": \"v2\"}";
        for cut in 0..text.len() {
            let mut back = s.incoming(&host("api.example.com")).unwrap();
            assert_eq!(
                through(&mut back, &[&text[..cut], &text[cut..]]).unwrap(),
                b"{\"auth\":\"Bearer sandboxd-secret-aaaa\", \"other\": \"sandboxd-secret-bbbb\"}"
            );
        }
        assert_eq!(back.whole(b"no secret").unwrap(), Cow::Borrowed(&b"no secret"[..]));
        assert!(s.incoming(&host("pypi.org")).is_none());
    }

    #[test]
    fn a_sessions_own_value_cannot_make_a_policy_value_show() {
        // The tenant sets "Q" + the policy value's known prefix as its own secret,
        // for the same host, and has the host echo "Q" + the policy's placeholder.
        let policy = "sk-live-0123456789";
        let s = Secrets(vec![
            secret("API_KEY", "api.example.com", policy, "sandboxd-secret-aaaa", &[Headers], false),
            secret("MINE", "api.example.com", "Qsk-", "sandboxd-secret-cccc", &[Headers], true),
        ]);
        let echoed = format!("Q{policy}");
        for cut in 0..echoed.len() {
            let mut back = s.incoming(&host("api.example.com")).unwrap();
            let got = through(&mut back, &[&echoed.as_bytes()[..cut], &echoed.as_bytes()[cut..]]).unwrap();
            assert_eq!(got, b"Qsandboxd-secret-aaaa", "cut at {cut}");
        }
        let mut back = s.incoming(&host("api.example.com")).unwrap();
        assert_eq!(back.whole(echoed.as_bytes()).unwrap().as_ref(), b"Qsandboxd-secret-aaaa");
        // The own value alone still comes back as its placeholder.
        let mut back = s.incoming(&host("api.example.com")).unwrap();
        assert_eq!(back.whole(b"[Qsk-]").unwrap().as_ref(), b"[sandboxd-secret-cccc]");
    }

    #[test]
    fn a_retired_value_is_still_taken_out_of_answers_but_never_put_in() {
        let mut old = secret("MINE", "api.example.com", "old-value-1", "sandboxd-secret-cccc", &[Headers], true);
        old.retired = true;
        let s = Secrets(vec![old]);
        assert!(s.environment().is_empty());
        let mut out = s.outgoing(&host("api.example.com"), Headers, true);
        assert_eq!(out.whole(b"sandboxd-secret-cccc").unwrap().as_ref(), b"sandboxd-secret-cccc");
        let mut back = s.incoming(&host("api.example.com")).unwrap();
        assert_eq!(back.whole(b"stored: old-value-1").unwrap().as_ref(), b"stored: sandboxd-secret-cccc");
    }

    #[test]
    fn of_two_values_one_beginning_the_other_the_longer_is_found() {
        let s = Secrets(vec![
            secret("SHORT", "api.example.com", "sk-1234", "sandboxd-secret-aaaa", &[Headers], false),
            secret("LONG", "api.example.com", "sk-1234-5678", "sandboxd-secret-bbbb", &[Headers], false),
        ]);
        let mut back = s.incoming(&host("api.example.com")).unwrap();
        assert_eq!(back.whole(b"[sk-1234-5678]").unwrap().as_ref(), b"[sandboxd-secret-bbbb]");
    }

    #[test]
    fn a_value_in_another_case_is_taken_out_too() {
        let s = secrets();
        let mut back = s.incoming(&host("api.example.com")).unwrap();
        // A header name is lower-cased on the way: "Real-Value-123" -> "real-value-123".
        assert_eq!(back.whole(b"x-REAL-value-123-y").unwrap().as_ref(), b"x-sandboxd-secret-aaaa-y");
    }

    #[test]
    fn many_long_values_sharing_a_prefix_are_found_in_one_pass() {
        // 32 values of 8 KiB differing only in their last bytes: a scan pair by
        // pair at each byte would compare ~8 KiB 32 times per byte of the answer.
        let prefix = "v".repeat(8180);
        let own: Vec<Secret> = (0..32)
            .map(|i| {
                let value = format!("{prefix}{i:012}");
                secret(
                    &format!("S{i}"),
                    "api.example.com",
                    &value,
                    &format!("sandboxd-secret-{i:032x}"),
                    &[Headers],
                    true,
                )
            })
            .collect();
        let s = Secrets(own);
        let mut answer = prefix.repeat(32).into_bytes();
        answer.extend_from_slice(format!("{prefix}{:012}", 31).as_bytes());
        let chunks: Vec<&[u8]> = answer.chunks(16 * 1024).collect();
        let mut back = s.incoming(&host("api.example.com")).unwrap();
        let got = through(&mut back, &chunks).unwrap();
        assert!(got.ends_with(format!("sandboxd-secret-{:032x}", 31).as_bytes()));
        assert_eq!(got.len(), 32 * 8180 + "sandboxd-secret-".len() + 32);
    }

    #[test]
    fn whole_values_are_rewritten_in_one_go_and_nothing_shows_a_value() {
        let s = secrets();
        let mut out = s.outgoing(&host("api.example.com"), Headers, true);
        assert_eq!(out.whole(b"Bearer sandboxd-secret-aaaa").unwrap().as_ref(), b"Bearer real-value-123");
        assert_eq!(s.environment()["API_KEY"], "sandboxd-secret-aaaa");
        assert!(!format!("{s:?}").contains("real-value"));
        assert!(placeholder().starts_with("sandboxd-secret-") && placeholder() != placeholder());
    }
}
