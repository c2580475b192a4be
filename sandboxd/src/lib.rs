//! sandboxd: runs untrusted, LLM-generated Python natively on Linux, in fresh
//! namespaces under cgroup limits, Landlock and seccomp, and serves the results.
//!
//! Reading order for one request: [`api`] (routes, auth, errors, MCP) or [`tools`] (the tools a model calls) →
//! [`service`] (the typed operations) → [`run`] (one run from request to result) → [`isolate`] (the sandbox itself) → back through
//! [`artifacts`] to the result. [`daemon`] starts and stops it all.
//! What crosses the API, MCP and the CLI (requests, answers, their schemas) is
//! [`model`]'s, below everything else.

pub mod api;
pub mod artifacts;
pub mod bridge;
pub mod chat;
pub mod check;
pub mod client;
pub mod config;
pub mod conversations;
pub mod daemon;
pub mod download;
pub mod egress;
pub mod health;
pub mod isolate;
pub mod kept;
pub mod kernel;
pub mod listing;
pub mod metrics;
pub mod model;
pub mod mountinfo;
pub mod names;
pub mod owner;
pub mod packages;
pub mod plan;
pub mod policy;
pub mod pool;
pub mod records;
pub mod rootfs;
pub mod run;
pub mod serve;
pub mod service;
pub mod session;
pub mod storage;
pub mod tools;
pub mod uids;
pub mod workspace;
