//! The lab: network namespaces, real traffic and an observer on the public link, built by the
//! program itself. `mt6d demo` and the end-to-end tests use it; it is never part of a gateway.

#![forbid(unsafe_code)]

pub mod clients;
pub mod config_file;
pub mod daemon;
pub mod demo;
pub mod demo_args;
pub mod handshake_clients;
pub mod kernel_counters;
pub mod link_sweep;
pub mod linker;
pub mod observer;
pub mod ping;
pub mod relays;
pub mod server_lab;
pub mod topology;
pub mod transfer;
pub mod unlinkability;

/// Whether we may create network namespaces and raw sockets.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Runs `promtool check metrics` (Debian's prometheus package) on a metrics page: Ok when it
/// accepts the page without a remark, else what it said. Test support for the metrics endpoint.
pub fn promtool_check(page: &str) -> Result<(), String> {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("promtool (scripts/install-deps.sh installs it): {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(page.as_bytes())
            .map_err(|e| format!("promtool stdin: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("promtool: {e}"))?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(format!("promtool: {said}"))
    }
}
