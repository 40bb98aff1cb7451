//! The daemon kit: what every role (gateway and host, server, relay) runs on, and nothing that
//! knows a role. The wall clock and the OS's randomness, signals, how a main thread sleeps
//! until its next deadline or event ([`wakeup`]), the packet workers' shared rules, priming
//! neighbours, the AnyIP prefix with its NDP responder, private files and the machine's
//! counter reservation for pre-shared keys, and dropping privileges. A role imports the kit;
//! the kit never imports a role, and roles never import each other (`scripts/check-layout.sh`
//! checks both).

pub mod anyip;
pub mod clock;
pub mod entropy;
pub mod files;
pub mod neighbor;
pub mod privilege;
pub mod psk_counters;
pub mod signals;
pub mod wakeup;
pub mod worker;

use std::path::Path;

/// A system call of the kit that failed while a role was setting up, and what it was for.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct SetupError {
    pub what: String,
    #[source]
    pub source: mt6d_os::OsError,
}

/// One role of the daemon, as the command line drives it: `mt6d check`, `mt6d run` and
/// `mt6d down` of a configuration file. `main.rs` picks the role once, from the file.
pub trait Role {
    /// Validates the file and every file it names as `run` would, and describes what would
    /// run, for people.
    fn check(&self, config: &Path) -> Result<String, Box<dyn std::error::Error>>;
    /// Runs the role until a signal stops it.
    fn run(&self, config: &Path) -> Result<(), Box<dyn std::error::Error>>;
    /// Removes what a stopped instance left in the kernel (guards, tables, routes).
    fn down(&self, config: &Path) -> Result<(), Box<dyn std::error::Error>>;
}
