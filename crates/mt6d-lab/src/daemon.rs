//! A gateway daemon started by the lab: `mt6d run -c FILE` as a child process inside a gateway
//! namespace, its stderr kept in a log file, stopped with SIGTERM like an operator would.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use mt6d_os::Netns;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use mt6d::control::query_status;
use mt6d::status::Status;

#[derive(Debug)]
pub struct DaemonProcess {
    pub label: String,
    child: Option<Child>,
    pub log: PathBuf,
    pub socket: PathBuf,
}

impl DaemonProcess {
    /// Starts this same executable as `mt6d run -c config` inside `ns`.
    pub fn start(
        label: &str,
        ns: &Netns,
        config: &Path,
        socket: &Path,
        log: &Path,
    ) -> Result<DaemonProcess, String> {
        let exe =
            std::env::current_exe().map_err(|e| format!("cannot find our own executable: {e}"))?;
        let mut cmd = ns.command(&exe).map_err(|e| e.to_string())?;
        cmd.arg("run").arg("-c").arg(config);
        DaemonProcess::spawn(label, cmd, socket, log)
    }

    /// Starts a prepared `mt6d run` command (e.g. a test's own build of the binary), stderr to
    /// `log`, answering on `socket`.
    pub fn spawn(
        label: &str,
        mut cmd: std::process::Command,
        socket: &Path,
        log: &Path,
    ) -> Result<DaemonProcess, String> {
        let log_file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let child = cmd
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("start gateway {label}: {e}"))?;
        Ok(DaemonProcess {
            label: label.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
            socket: socket.to_path_buf(),
        })
    }

    /// Waits until the daemon answers on its control socket, or fails with its log.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<Status, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!(
                        "gateway {} exited during start-up ({status}):\n{}",
                        self.label,
                        self.log_tail(20)
                    ));
                }
            }
            if let Ok(st) = query_status(&self.socket) {
                return Ok(st);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "gateway {} did not answer on {} within {timeout:?}:\n{}",
                    self.label,
                    self.socket.display(),
                    self.log_tail(20)
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn status(&self) -> Result<Status, String> {
        query_status(&self.socket).map_err(|e| e.to_string())
    }

    /// SIGTERM, then wait up to `timeout`; SIGKILL after that. Returns whether it exited cleanly.
    pub fn stop(&mut self, timeout: Duration) -> Result<(), String> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let pid = Pid::from_raw(child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + timeout;
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => {
                    return Err(format!(
                        "gateway {} exited with {status}:\n{}",
                        self.label,
                        self.log_tail(20)
                    ))
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "gateway {} did not stop within {timeout:?} of SIGTERM; killed",
                        self.label
                    ));
                }
            }
        }
    }

    /// The process id while it runs (for signals such as SIGHUP).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, as a crash or power cut would end it: nothing gets cleaned up.
    pub fn kill_hard(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        let _ = self.stop(Duration::from_secs(5));
    }
}
