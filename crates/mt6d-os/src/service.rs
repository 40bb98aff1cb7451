//! Telling a service manager what the daemon is doing (systemd's `sd_notify` protocol: a
//! datagram to the `NOTIFY_SOCKET` it passes in the environment). Without that variable (run by
//! hand, or under another supervisor) every call does nothing and succeeds.
//!
//! Used with `Type=notify` in `packaging/systemd/mt6d@.service`: `ready` once the first
//! rotation has bound the current epoch's addresses (the tunnel can carry packets), so units
//! ordered after `mt6d@NAME` start when the tunnel exists, not when the process does.

use crate::OsError;

fn send(what: &'static str, state: &[sd_notify::NotifyState<'_>]) -> Result<(), OsError> {
    sd_notify::notify(state).map_err(|source| OsError::ServiceManager {
        op: what,
        socket: std::env::var("NOTIFY_SOCKET").unwrap_or_default(),
        source,
    })
}

/// Start-up is finished; `status` is shown by `systemctl status`.
pub fn ready(status: &str) -> Result<(), OsError> {
    send(
        "notify the service manager: ready",
        &[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status(status),
        ],
    )
}

/// The daemon is stopping (cleaning up).
pub fn stopping() -> Result<(), OsError> {
    send(
        "notify the service manager: stopping",
        &[sd_notify::NotifyState::Stopping],
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    #[test]
    fn messages_reach_the_notify_socket_and_nothing_is_sent_without_one() {
        let dir = std::env::temp_dir().join(format!("mt6d-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let manager = UnixDatagram::bind(&path).unwrap();
        manager
            .set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .unwrap();
        // The environment is process-wide: this is the only test in the crate that sets it.
        std::env::set_var("NOTIFY_SOCKET", &path);
        ready("tunnel up: 1 peer").unwrap();
        stopping().unwrap();
        std::env::remove_var("NOTIFY_SOCKET");
        let mut buf = [0u8; 256];
        let n = manager.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=tunnel up: 1 peer\n");
        let n = manager.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1\n");
        // Without the variable: nothing sent, no error.
        ready("x").unwrap();
        manager.set_nonblocking(true).unwrap();
        assert!(manager.recv(&mut buf).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
