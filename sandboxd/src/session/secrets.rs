//! A session's secrets: its policy's (their values read when the daemon started,
//! [`resolve`]) and its own (set through the API: write-only, kept in the daemon's
//! memory only, never on disk, gone with the session or the daemon). Each gets a
//! placeholder of the session's own the first time a sandbox of the session
//! needs it, the same for the session's life (a kernel keeps its environment).
//! The egress proxy gets them whole for a run ([`Manager::secrets_for`]); no
//! route ever answers a value.

use super::{key, Error, Manager};
use crate::egress::rules::{self, HostPattern};
use crate::egress::secrets::{placeholder, Live, Secret, Secrets};
use crate::model::policy::{Network, Policy, SecretPlace};
use crate::model::secrets::{SecretInfo, SecretSource};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The most bytes of a secret's value.
pub const MAX_VALUE: usize = 8 * 1024;
/// The most secrets a session sets of its own.
pub const MAX_OWN: usize = 32;
/// Most deleted or replaced own values a session keeps taking out of answers.
pub const MAX_RETIRED: usize = 32;
/// The most hosts of one secret.
const MAX_HOSTS: usize = 16;

/// A policy's secret, its value read (never shown by `Debug`).
#[derive(Clone)]
pub struct PolicySecret {
    pub name: String,
    pub hosts: Vec<HostPattern>,
    pub shown_hosts: Vec<String>,
    pub places: Vec<SecretPlace>,
    pub value: String,
}

impl std::fmt::Debug for PolicySecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicySecret")
            .field("name", &self.name)
            .field("hosts", &self.shown_hosts)
            .finish_non_exhaustive()
    }
}

/// Every policy's secrets, by policy name.
pub type PolicySecrets = BTreeMap<String, Vec<PolicySecret>>;

/// Read every policy's secrets' values (`env:NAME` from the daemon's environment,
/// `file:/path` the file's first line). A missing one stops the daemon's start:
/// a session of its policy could not do what the policy promises.
pub fn resolve<'a>(policies: impl Iterator<Item = &'a Policy>) -> Result<PolicySecrets, String> {
    let mut all = PolicySecrets::new();
    for p in policies {
        let mut list = vec![];
        for s in &p.secrets {
            let fail = |why: String| format!("policy {:?}, secret {}: {why}", p.name, s.name);
            let value = match s.value_from.split_once(':') {
                Some(("env", var)) => std::env::var(var).map_err(|_| {
                    fail(format!(
                        "value_from = \"env:{var}\", but the daemon's environment has no {var}: set it (systemd: Environment= or EnvironmentFile= in a drop-in), or remove the secret"
                    ))
                })?,
                Some(("file", path)) => {
                    let text = std::fs::read_to_string(path)
                        .map_err(|e| fail(format!("value_from = \"file:{path}\": {e}")))?;
                    text.lines().next().unwrap_or_default().to_string()
                }
                _ => return Err(fail(format!("value_from {:?} is neither env:NAME nor file:/path", s.value_from))),
            };
            check_value(&value).map_err(fail)?;
            let hosts = rules::patterns(&s.hosts).map_err(fail)?;
            list.push(PolicySecret {
                name: s.name.clone(),
                hosts,
                shown_hosts: s.hosts.clone(),
                places: s.substitute_in.clone(),
                value,
            });
        }
        all.insert(p.name.clone(), list);
    }
    Ok(all)
}

/// A value the proxy can put in a header: 1 to [`MAX_VALUE`] bytes, no line break
/// or NUL.
fn check_value(value: &str) -> Result<(), String> {
    if value.is_empty() || value.len() > MAX_VALUE {
        return Err(format!("its value is {} bytes; a secret's value is 1 to {MAX_VALUE} bytes", value.len()));
    }
    if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
        return Err("its value has a line break or a NUL byte, which no header can carry".into());
    }
    Ok(())
}

/// What a session holds of its secrets (in its live state).
#[derive(Default)]
pub(super) struct Held {
    own: BTreeMap<String, Own>,
    /// Own values deleted or replaced, newest last (at most [`MAX_RETIRED`]):
    /// their hosts' answers may still hold them.
    retired: Vec<(String, Own)>,
    placeholders: BTreeMap<String, String>,
    /// All of them as the egress proxy serves them now ([`Manager::secrets_for`]).
    live: Arc<Live>,
}

struct Own {
    hosts: Vec<HostPattern>,
    shown_hosts: Vec<String>,
    places: Vec<SecretPlace>,
    value: String,
}

impl Held {
    fn placeholder(&mut self, name: &str) -> String {
        self.placeholders.entry(name.to_string()).or_insert_with(placeholder).clone()
    }

    fn retire(&mut self, name: &str, old: Own) {
        if self.retired.len() >= MAX_RETIRED {
            self.retired.remove(0);
        }
        self.retired.push((name.to_string(), old));
    }
}

impl Manager {
    /// Set (or replace) the session's own secret `name`, sent to `hosts` only.
    pub fn set_secret(
        &self,
        id: &str,
        owner: Option<&str>,
        name: &str,
        value: String,
        hosts: Vec<String>,
        places: Vec<SecretPlace>,
    ) -> Result<SecretInfo, Error> {
        let key = key(id, owner)?;
        let mut map = self.lock();
        let live = Self::ready_mut(&mut map, &key, owner).ok_or_else(|| Self::not_found(id))?;
        let policy = self.policy(Some(&live.info.policy))?;
        let invalid = |why: String| Error::InvalidSecret(format!("secret {name:?}: {why}"));
        if policy.network != Network::Allowlist {
            return Err(invalid(format!(
                "policy {:?} has network = \"none\": a secret is used through the egress proxy; use a session of a policy with network = \"allowlist\"",
                policy.name
            )));
        }
        if !crate::policy::is_secret_name(name) {
            return Err(invalid("use a variable name of letters, digits and _ (not PATH, HOME, LANG, PYTHONPATH, SSL_CERT_FILE, LD_PRELOAD, *_PROXY or SANDBOXD_*)".into()));
        }
        if self.policy_secrets.get(&policy.name).is_some_and(|l| l.iter().any(|s| s.name == name)) {
            return Err(invalid(format!(
                "policy {:?} defines it already; give the session's another name",
                policy.name
            )));
        }
        check_value(&value).map_err(invalid)?;
        if hosts.is_empty() || hosts.len() > MAX_HOSTS {
            return Err(invalid(format!("give it 1 to {MAX_HOSTS} hosts")));
        }
        if places.is_empty() {
            return Err(invalid("substitute_in names no place: give [\"headers\"], \"url\" or \"body\"".into()));
        }
        let patterns = rules::patterns(&hosts).map_err(invalid)?;
        let allowed = rules::patterns(&policy.allow_hosts).unwrap_or_default();
        for (p, shown) in patterns.iter().zip(&hosts) {
            if !rules::covers(&allowed, p) {
                return Err(invalid(format!(
                    "{shown} is not in allow_hosts of policy {:?} ({}): the sandbox could never reach it",
                    policy.name,
                    policy.allow_hosts.join(", ")
                )));
            }
        }
        let held = &mut live.secrets;
        if !held.own.contains_key(name) && held.own.len() >= MAX_OWN {
            return Err(invalid(format!("the session has {MAX_OWN} secrets already: delete one first")));
        }
        let new = Own { hosts: patterns, shown_hosts: hosts.clone(), places: places.clone(), value };
        if let Some(old) = held.own.insert(name.to_string(), new) {
            held.retire(name, old);
        }
        let from_policy = self.policy_secrets.get(&policy.name).cloned().unwrap_or_default();
        held.publish(from_policy);
        Ok(SecretInfo { name: name.to_string(), hosts, substitute_in: places, source: SecretSource::Session })
    }

    /// The session's secrets, its policy's and its own: names and hosts, never values.
    pub fn list_secrets(&self, id: &str, owner: Option<&str>) -> Result<Vec<SecretInfo>, Error> {
        let key = key(id, owner)?;
        let map = self.lock();
        let live = Self::ready(&map, &key, owner).ok_or_else(|| Self::not_found(id))?;
        let mut list: Vec<SecretInfo> = self
            .policy_secrets
            .get(&live.info.policy)
            .into_iter()
            .flatten()
            .map(|s| SecretInfo {
                name: s.name.clone(),
                hosts: s.shown_hosts.clone(),
                substitute_in: s.places.clone(),
                source: SecretSource::Policy,
            })
            .collect();
        list.extend(live.secrets.own.iter().map(|(name, s)| SecretInfo {
            name: name.clone(),
            hosts: s.shown_hosts.clone(),
            substitute_in: s.places.clone(),
            source: SecretSource::Session,
        }));
        Ok(list)
    }

    /// Forget the session's own secret `name` (its policy's stay); from the next
    /// request on, no sandbox of the session gets its value.
    pub fn delete_secret(&self, id: &str, owner: Option<&str>, name: &str) -> Result<(), Error> {
        let key = key(id, owner)?;
        let mut map = self.lock();
        let live = Self::ready_mut(&mut map, &key, owner).ok_or_else(|| Self::not_found(id))?;
        let Some(old) = live.secrets.own.remove(name) else {
            return Err(Error::SecretNotFound { session: id.to_string(), name: name.to_string() });
        };
        live.secrets.retire(name, old);
        let from_policy = self.policy_secrets.get(&live.info.policy).cloned().unwrap_or_default();
        live.secrets.publish(from_policy);
        Ok(())
    }

    /// The session's secrets as the egress proxy serves them (its policy's and
    /// its own, each with the session's placeholder), kept up to date as the
    /// session's own change.
    pub fn secrets_for(&self, key: &str) -> Arc<Live> {
        let mut map = self.lock();
        let Some(live) = map.get_mut(key) else { return Arc::default() };
        let from_policy = self.policy_secrets.get(&live.info.policy).cloned().unwrap_or_default();
        live.secrets.publish(from_policy);
        live.secrets.live.clone()
    }
}

impl Held {
    /// Put the secrets as they are now where the proxy reads them.
    fn publish(&mut self, from_policy: Vec<PolicySecret>) {
        let mut all = vec![];
        for s in from_policy {
            let placeholder = self.placeholder(&s.name);
            all.push(Secret {
                name: s.name,
                hosts: s.hosts,
                value: s.value,
                placeholder,
                places: s.places,
                own: false,
                retired: false,
            });
        }
        let own: Vec<(String, Vec<HostPattern>, Vec<SecretPlace>, String)> =
            self.own.iter().map(|(n, s)| (n.clone(), s.hosts.clone(), s.places.clone(), s.value.clone())).collect();
        for (name, hosts, places, value) in own {
            let placeholder = self.placeholder(&name);
            all.push(Secret { name, hosts, value, placeholder, places, own: true, retired: false });
        }
        let retired: Vec<(String, Vec<HostPattern>, String)> =
            self.retired.iter().map(|(n, s)| (n.clone(), s.hosts.clone(), s.value.clone())).collect();
        for (name, hosts, value) in retired {
            let placeholder = self.placeholder(&name);
            all.push(Secret { name, hosts, value, placeholder, places: vec![], own: true, retired: true });
        }
        self.live.set(Secrets(all));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::policy::SecretRule;

    #[test]
    fn a_policys_secrets_are_read_from_the_environment_or_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("k");
        std::fs::write(&file, "from-file\nsecond line\n").unwrap();
        std::env::set_var("SANDBOXD_TEST_SECRET_A", "from-env");
        let rule = |name: &str, from: String| SecretRule {
            name: name.into(),
            hosts: vec!["api.example.com".into()],
            value_from: from,
            substitute_in: vec![SecretPlace::Headers],
        };
        let p = Policy {
            name: "p".into(),
            secrets: vec![
                rule("A", "env:SANDBOXD_TEST_SECRET_A".into()),
                rule("B", format!("file:{}", file.display())),
            ],
            ..Policy::default()
        };
        let all = resolve([&p].into_iter()).unwrap();
        let values: Vec<&str> = all["p"].iter().map(|s| s.value.as_str()).collect();
        assert_eq!(values, ["from-env", "from-file"]);
        // Unset, unreadable, empty: the daemon does not start, and says which and why.
        let p = Policy { secrets: vec![rule("C", "env:SANDBOXD_TEST_SECRET_UNSET".into())], ..p };
        let e = resolve([&p].into_iter()).unwrap_err();
        assert!(e.starts_with("policy \"p\", secret C: value_from = \"env:SANDBOXD_TEST_SECRET_UNSET\", but the daemon's environment has no SANDBOXD_TEST_SECRET_UNSET"), "{e}");
        let p = Policy { secrets: vec![rule("D", "file:/nonexistent/k".into())], ..p };
        assert!(resolve([&p].into_iter()).unwrap_err().contains("file:/nonexistent/k"));
        std::fs::write(&file, "\n").unwrap();
        let p = Policy { secrets: vec![rule("E", format!("file:{}", file.display()))], ..p };
        assert!(resolve([&p].into_iter()).unwrap_err().contains("1 to 8192 bytes"));
        assert!(check_value("a\r\nb").is_err() && check_value("ok").is_ok());
    }
}
