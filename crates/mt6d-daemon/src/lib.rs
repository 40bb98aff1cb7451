//! The `mt6d` daemon as a library: the kit every role runs on (`daemon`), the gateway, server
//! and relay roles, their configuration, the control socket and the status it carries. The
//! binary (`crates/mt6d`) is a thin command-line layer over it; the lab that `mt6d demo`, the
//! end-to-end tests and `mt6d-bench` build their networks with is `crates/mt6d-lab`, which this
//! library never links (docs/ARCHITECTURE.md, "The map of the daemon crate").

#![forbid(unsafe_code)]

pub mod config;
pub mod control;
pub mod daemon;
pub mod gateway;
pub mod keys;
pub mod metrics;
pub mod relay;
pub mod server;
pub mod status;
