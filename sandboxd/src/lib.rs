//! sandboxd: runs untrusted, LLM-generated Python natively on Linux, in fresh
//! namespaces under cgroup limits, Landlock and seccomp, and serves the results.
//!
//! Reading order for one request: [`api`] (routes, auth, errors) → [`run`] (one
//! run from request to result) → [`isolate`] (the sandbox itself) → back through
//! [`artifacts`] to the result. [`daemon`] starts and stops it all.

pub mod api;
pub mod artifacts;
pub mod check;
pub mod client;
pub mod config;
pub mod daemon;
pub mod isolate;
pub mod kernel;
pub mod mcp;
pub mod plan;
pub mod policy;
pub mod pool;
pub mod rootfs;
pub mod run;
pub mod session;
pub mod storage;
pub mod workspace;
