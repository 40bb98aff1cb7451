//! The lab: network namespaces, real traffic and an observer on the public link, built by the
//! program itself. `mt6d demo` and the end-to-end tests use it; it is never part of a gateway.

pub mod config_file;
pub mod daemon;
pub mod demo;
pub mod linker;
pub mod observer;
pub mod ping;
pub mod topology;
pub mod transfer;
pub mod unlinkability;

/// Whether we may create network namespaces and raw sockets.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}
