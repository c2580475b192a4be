//! Who a request is, by its bearer token, and what it may see.
//!
//! With no tokens configured (`tokens`, `operator_tokens`) every caller is the
//! one tokenless caller and sees everything. With tokens, HTTP needs one; the
//! Unix socket (root's and the `sandboxd` group's) may go without and is then
//! the operator. A token's owner id is keyed ([`crate::owner`]): the token never
//! leaves this module. Each token, operator tokens included, has an id space of
//! its own; an operator token may also read the full health report and
//! `GET /metrics`, which show every tenant's figures.

use super::Listener;
use crate::owner::OwnerKey;
use axum::http::{header, HeaderMap};
use std::collections::HashMap;

/// What a token may do beyond its own sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Tenant,
    /// Also reads the full health report and the metrics.
    Operator,
}

/// The configured tokens, by owner id.
pub struct Tokens {
    key: OwnerKey,
    roles: HashMap<String, Role>,
}

/// Who a request is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Who {
    /// Needs no token (no tokens configured, or the Unix socket without one):
    /// sees every session and every figure.
    Tokenless,
    Token {
        owner: String,
        role: Role,
    },
}

impl Who {
    /// The owner id the service sees (None: every session).
    pub fn owner(&self) -> Option<&str> {
        match self {
            Who::Tokenless => None,
            Who::Token { owner, .. } => Some(owner),
        }
    }

    /// May read what shows every tenant (the full health report, the metrics).
    pub fn is_operator(&self) -> bool {
        matches!(self, Who::Tokenless | Who::Token { role: Role::Operator, .. })
    }
}

/// A request that needs a token and has none that is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unknown;

impl Tokens {
    pub fn new(key: OwnerKey, tenants: &[String], operators: &[String]) -> Tokens {
        let mut roles: HashMap<String, Role> = tenants.iter().map(|t| (key.id(t), Role::Tenant)).collect();
        roles.extend(operators.iter().map(|t| (key.id(t), Role::Operator)));
        Tokens { key, roles }
    }

    /// Whether any token is configured (then HTTP needs one).
    pub fn required(&self) -> bool {
        !self.roles.is_empty()
    }

    /// Who sent `headers` on `listener` (see the module's rules).
    pub fn who(&self, listener: Listener, headers: &HeaderMap) -> Result<Who, Unknown> {
        if !self.required() {
            return Ok(Who::Tokenless);
        }
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        match (presented, listener) {
            (Some(token), _) => {
                let owner = self.key.id(token);
                match self.roles.get(&owner) {
                    Some(&role) => Ok(Who::Token { owner, role }),
                    None => Err(Unknown),
                }
            }
            (None, Listener::Unix) => Ok(Who::Tokenless),
            (None, Listener::Http) => Err(Unknown),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, format!("Bearer {token}").parse().unwrap());
        h
    }

    #[test]
    fn tokens_are_tenants_or_operators_and_the_socket_may_go_without() {
        let key = OwnerKey::from_bytes([3; 32]);
        let tokens = Tokens::new(key.clone(), &["t".into()], &["op".into()]);
        let none = HeaderMap::new();
        assert_eq!(tokens.who(Listener::Http, &bearer("t")), Ok(Who::Token { owner: key.id("t"), role: Role::Tenant }));
        let op = tokens.who(Listener::Http, &bearer(" op ")).unwrap();
        assert_eq!(op, Who::Token { owner: key.id("op"), role: Role::Operator });
        assert!(op.is_operator() && op.owner() != Some(key.id("t").as_str()));
        assert!(!tokens.who(Listener::Unix, &bearer("t")).unwrap().is_operator());
        assert_eq!(tokens.who(Listener::Http, &none), Err(Unknown));
        assert_eq!(tokens.who(Listener::Http, &bearer("nope")), Err(Unknown));
        assert_eq!(tokens.who(Listener::Unix, &bearer("nope")), Err(Unknown));
        assert_eq!(tokens.who(Listener::Unix, &none), Ok(Who::Tokenless));
        // The owner id is keyed: not the token, not its plain hash.
        assert_ne!(key.id("t"), crate::owner::legacy_id("t"));
        // No tokens: everyone is the tokenless caller, whatever they send.
        let open = Tokens::new(key, &[], &[]);
        assert!(!open.required());
        assert_eq!(open.who(Listener::Http, &bearer("x")), Ok(Who::Tokenless));
    }
}
