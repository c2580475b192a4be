//! Every type that crosses the daemon's surfaces (the HTTP API, MCP, `sandboxctl`):
//! requests and answers, as their JSON is written and read, and their OpenAPI
//! schemas (the `utoipa` derives live here only). A file per area.
//!
//! Plain data, with the few methods that say how a value is written: nothing here
//! imports the rest of the crate, so every module may import it, and the domain
//! modules ([`crate::run`], [`crate::session`], [`crate::records`],
//! [`crate::service`], ...) and [`crate::client`] share these types rather than
//! each other's. What a domain keeps for itself (persisted state, leases, plans)
//! stays in that domain.

pub mod chat;
pub mod check;
pub mod error;
pub mod files;
pub mod health;
pub mod packages;
pub mod policy;
pub mod records;
pub mod run;
pub mod secrets;
pub mod session;
pub mod tools;
