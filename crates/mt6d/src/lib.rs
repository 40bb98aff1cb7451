//! The `mt6d` gateway as a library: the daemon, its configuration and control socket, and the
//! lab that `mt6d demo`, the end-to-end tests and `mt6d-bench` build their networks with.
//! The binary (`src/main.rs`) is a thin command-line layer over these modules.

#![forbid(unsafe_code)]

pub mod config;
pub mod control;
pub mod daemon;
pub mod gateway;
pub mod keys;
pub mod lab;
pub mod metrics;
pub mod relay;
pub mod server;
pub mod status;
