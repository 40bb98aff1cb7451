//! The control socket: how `mt6d status`, `mt6d reload` and `mt6d peer add|remove|set` (and
//! the demo) talk to a running daemon.
//!
//! Protocol: a client connects to the daemon's unix stream socket, writes one request line,
//! and reads one JSON document until end of file. The request is `status` (the answer is a
//! [`Status`]) or a [`Request`] as one line of JSON (the answer is a [`ChangeAnswer`]).
//!
//! Only root and the daemon's own user may ask anything: the socket is created mode 0600 (status
//! shows addresses and counters; the other requests change the running peers), and every
//! connection's `SO_PEERCRED` is checked as well, so a socket left with wider permissions (a
//! bind under a lax umask, a changed mode) still answers no one else.
//!
//! Requests are served by the daemon's main thread, one at a time, between its housekeeping
//! steps: a change is applied by the same code as SIGHUP (`gateway::reload`), never while
//! another runs. That thread never waits on a client: connections are non-blocking, their
//! credentials are checked when they are accepted, and each housekeeping step reads what has
//! arrived and moves on. The listener and every connection being read are in the server's own
//! epoll set, whose descriptor ([`ControlServer::readiness_fd`]) the main thread sleeps on
//! (`daemon::wakeup`): a new connection, or the next bytes of a request, wake it at once. A request must be whole within [`REQUEST_TIME`] and [`MAX_REQUEST`]
//! bytes, and at most [`MAX_CLIENTS`] are read at once, so a client that trickles its request
//! (or never sends it) costs a slot for a few seconds, never the daemon's rotations or another
//! client's answer.

use std::cell::RefCell;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::status::Status;

/// Longest request line read: a batch of peer changes fits many times over.
pub const MAX_REQUEST: usize = 1 << 20;

/// How long a client has, from its connection, to send its whole request line. Every client
/// writes its line as soon as it is connected; this only bounds what a stalled or hostile one
/// holds.
pub const REQUEST_TIME: Duration = Duration::from_secs(5);

/// Connections whose request is being read at once. A new one beyond that first evicts the
/// oldest refused one (a client that may not ask); if every slot is a permitted client's, the
/// new connection is closed.
pub const MAX_CLIENTS: usize = 16;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    #[error(
        "cannot connect to {path}: {source} (is `mt6d run` running with this control socket?)"
    )]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("control socket {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("control socket {path}: daemon sent an unreadable answer: {source}")]
    Decode {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("control socket {path}: {message}")]
    Bind { path: PathBuf, message: String },
    /// The daemon refused the request; `message` says why, and nothing was changed.
    #[error("{message}")]
    Refused { path: PathBuf, message: String },
}

/// A request that is not `status`, sent as one line of JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Request {
    /// Re-read the configuration file, as SIGHUP does, and answer what changed.
    Reload,
    /// Change the running peers: every edit applies, or none does.
    Peers { edits: Vec<Edit> },
}

/// One change to the running peers. Fields are the `[[peer]]` keys of the configuration file
/// (docs/CONFIG.md), with the values a file would hold; relative paths are resolved by the
/// client, so they mean what they meant where the command was typed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Edit {
    /// A new peer: a whole `[[peer]]` table, `name` included.
    Add { peer: toml::Table },
    /// Peer `name`: the keys in `unset` are removed, then those of `fields` set.
    Set {
        name: String,
        #[serde(default)]
        fields: toml::Table,
        #[serde(default)]
        unset: Vec<String>,
    },
    /// Peer `name` goes.
    Remove { name: String },
}

/// The daemon's answer to a [`Request`]: what changed, or why nothing did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeAnswer {
    #[serde(default)]
    pub added: Vec<String>,
    #[serde(default)]
    pub removed: Vec<String>,
    #[serde(default)]
    pub changed: Vec<String>,
    /// Set when the request was refused; then nothing changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Asks the daemon at `path` for its status.
pub fn query_status(path: &Path) -> Result<Status, ControlError> {
    let body = query_status_body(path)?;
    serde_json::from_slice(&body).map_err(|source| ControlError::Decode {
        path: path.to_path_buf(),
        source,
    })
}

pub use crate::status::AnyStatus;

/// Asks the daemon at `path` for its status, a gateway's or a server's.
pub fn query_any_status(path: &Path) -> Result<AnyStatus, ControlError> {
    let body = query_status_body(path)?;
    let decode = |source| ControlError::Decode {
        path: path.to_path_buf(),
        source,
    };
    let v: serde_json::Value = serde_json::from_slice(&body).map_err(decode)?;
    let role = v.get("role").and_then(serde_json::Value::as_str);
    if role == Some("server") {
        serde_json::from_value(v)
            .map(AnyStatus::Server)
            .map_err(decode)
    } else if role == Some("relay") {
        serde_json::from_value(v)
            .map(AnyStatus::Relay)
            .map_err(decode)
    } else {
        serde_json::from_value(v)
            .map(|s| AnyStatus::Gateway(Box::new(s)))
            .map_err(decode)
    }
}

/// The raw answer to `status` (refusals turned into [`ControlError::Refused`]).
fn query_status_body(path: &Path) -> Result<Vec<u8>, ControlError> {
    let mut stream = UnixStream::connect(path).map_err(|source| ControlError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    let io = |source| ControlError::Io {
        path: path.to_path_buf(),
        source,
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(io)?;
    stream.write_all(b"status\n").map_err(io)?;
    let mut body = Vec::new();
    stream.read_to_end(&mut body).map_err(io)?;
    // A refusal (not allowed, unknown request) is `{"error": ...}` instead of a status.
    if let Ok(ChangeAnswer {
        error: Some(message),
        ..
    }) = serde_json::from_slice::<ChangeAnswer>(&body)
    {
        return Err(ControlError::Refused {
            path: path.to_path_buf(),
            message,
        });
    }
    Ok(body)
}

/// Sends `request` to the daemon at `path` and waits for its answer (a change binds addresses
/// and may re-validate many peers: up to 60 s). A refusal is [`ControlError::Refused`].
pub fn send(path: &Path, request: &Request) -> Result<ChangeAnswer, ControlError> {
    let mut stream = UnixStream::connect(path).map_err(|source| ControlError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    let io = |source| ControlError::Io {
        path: path.to_path_buf(),
        source,
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(io)?;
    // serde_json writes no newline inside a document: the request stays one line.
    let mut line = serde_json::to_vec(request).map_err(|source| ControlError::Decode {
        path: path.to_path_buf(),
        source,
    })?;
    line.push(b'\n');
    stream.write_all(&line).map_err(io)?;
    let mut body = Vec::new();
    stream.read_to_end(&mut body).map_err(io)?;
    let answer: ChangeAnswer =
        serde_json::from_slice(&body).map_err(|source| ControlError::Decode {
            path: path.to_path_buf(),
            source,
        })?;
    match answer.error {
        Some(message) => Err(ControlError::Refused {
            path: path.to_path_buf(),
            message,
        }),
        None => Ok(answer),
    }
}

/// The listening side, owned by the daemon. Removes its socket file when dropped.
#[derive(Debug)]
pub struct ControlServer {
    listener: UnixListener,
    path: PathBuf,
    /// The inode of the socket we bound: on exit only that file is removed, never one that
    /// replaced it.
    inode: u64,
    /// Accepted connections whose request line is not whole yet, oldest first. Only the
    /// daemon's main thread calls [`ControlServer::next_request`]; the cell keeps its
    /// signature `&self`.
    reading: RefCell<Vec<Reading>>,
    /// The listener and the connections in `reading`, level-triggered: readable while a
    /// connection waits to be accepted or bytes wait to be read.
    ready: mt6d_os::Epoll,
}

/// A connection whose request is being read.
#[derive(Debug)]
struct Reading {
    stream: UnixStream,
    /// What arrived so far (at most [`MAX_REQUEST`] bytes).
    line: Vec<u8>,
    /// When it is given up.
    deadline: Instant,
    /// A client that may not ask: it was answered with the refusal when accepted, and its
    /// request is read only so that closing does not reset the connection before the client
    /// read why (closing a socket with unread data does).
    refused: bool,
}

/// What one read step found on a connection.
enum Step {
    /// Not whole yet: keep it.
    Waiting,
    /// The request line (without its newline), or what came before end of file.
    Line(Vec<u8>),
    /// Closed, failed, too long or too late: drop it (the reason, for the log).
    Gone(String),
}

/// What is at a control socket path, for the daemon's bind and `mt6d check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketPath {
    /// Nothing there.
    Absent,
    /// A socket a daemon answers on.
    Live,
    /// A socket nobody answers on: what a crashed daemon leaves; safe to replace.
    Stale,
    /// Something else (a regular file, a directory, a symbolic link...): never removed.
    NotASocket(&'static str),
}

/// Looks at `path` without following a symbolic link (a link to a key file must not be
/// taken for the file, nor removed).
pub fn inspect_socket_path(path: &Path) -> std::io::Result<SocketPath> {
    Ok(match crate::daemon::files::file_kind(path)? {
        None => SocketPath::Absent,
        Some(Ok(())) if UnixStream::connect(path).is_ok() => SocketPath::Live,
        Some(Ok(())) => SocketPath::Stale,
        Some(Err(kind)) => SocketPath::NotASocket(kind),
    })
}

/// Removes the socket at `path` if nobody answers on it, and nothing else; returns whether one
/// was removed. The path may come from an instance record written long before: its directory
/// is opened once (its last component not through a symbolic link), and the file is looked
/// at, connected to and unlinked relative to that descriptor, so a directory of the path
/// replaced since (by a link to somewhere else) cannot redirect the removal. Only a process
/// that may write that very directory could still swap the socket between the look and the
/// unlink, and it could remove the file itself anyway.
pub fn remove_stale_socket(path: &Path) -> std::io::Result<bool> {
    use nix::fcntl::{open, OFlag};
    use nix::sys::stat::{fstatat, Mode, SFlag};
    use nix::unistd::{unlinkat, UnlinkatFlags};
    use std::os::fd::AsRawFd;
    let Some(name) = path.file_name() else {
        return Ok(false);
    };
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = match open(
        parent,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    let stat = match fstatat(&dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(s) => s,
        Err(nix::errno::Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFSOCK {
        return Ok(false);
    }
    // Connected through the descriptor (procfs resolves it to that directory): only a refusal
    // means nobody answers; any other failure (a name too long for an address) keeps it.
    let mut through = std::path::PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    through.push(name);
    match UnixStream::connect(&through) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
        _ => return Ok(false),
    }
    unlinkat(&dir, name, UnlinkatFlags::NoRemoveDir)?;
    Ok(true)
}

impl ControlServer {
    /// Binds the socket. A stale socket from a crashed daemon is replaced; a socket that a live
    /// daemon still answers on is not stolen; anything that is not a socket is left alone and
    /// refused (a control_socket naming the config file must not delete it).
    pub fn bind(path: &Path) -> Result<ControlServer, ControlError> {
        let bind_err = |message: String| ControlError::Bind {
            path: path.to_path_buf(),
            message,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // Created 0700 if missing (an existing directory is the operator's choice).
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(crate::daemon::files::DIR_MODE)
                .create(dir)
                .map_err(|e| bind_err(format!("cannot create {}: {e}", dir.display())))?;
        }
        match inspect_socket_path(path).map_err(|e| bind_err(e.to_string()))? {
            SocketPath::Absent => {}
            SocketPath::Live => {
                return Err(bind_err(
                    "another mt6d daemon is running with this control socket; stop it or set gateway.control_socket".into(),
                ))
            }
            SocketPath::Stale => {
                remove_stale_socket(path)
                    .map_err(|e| bind_err(format!("cannot remove stale socket: {e}")))?;
            }
            SocketPath::NotASocket(kind) => {
                return Err(bind_err(format!(
                    "exists and is {kind}; only a socket nobody answers on is replaced: choose another control_socket"
                )))
            }
        }
        let listener = UnixListener::bind(path).map_err(|e| bind_err(e.to_string()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| bind_err(format!("chmod 600: {e}")))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| bind_err(e.to_string()))?;
        let inode = std::fs::symlink_metadata(path)
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .unwrap_or(0);
        let ready = mt6d_os::Epoll::new().map_err(|e| bind_err(e.to_string()))?;
        ready
            .add(listener.as_raw_fd(), 0)
            .map_err(|e| bind_err(e.to_string()))?;
        Ok(ControlServer {
            listener,
            path: path.to_path_buf(),
            inode,
            reading: RefCell::new(Vec::new()),
            ready,
        })
    }

    /// A descriptor that is readable while a client waits: a connection to accept, or bytes
    /// of a request to read. The daemon's main thread sleeps on it.
    pub fn readiness_fd(&self) -> std::os::fd::RawFd {
        self.ready.as_raw_fd()
    }

    /// When the oldest request being read is given up ([`REQUEST_TIME`] after its
    /// connection), if one is being read: a deadline of the main thread's wait.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.reading.borrow().iter().map(|r| r.deadline).min()
    }

    /// Stops watching a connection that leaves `reading`.
    fn forget(&self, r: &Reading) {
        if let Err(e) = self.ready.delete(r.stream.as_raw_fd()) {
            log::debug!("control socket {}: {e}", self.path.display());
        }
    }

    /// The next request a client is waiting on, or `None` at once when no client is. The
    /// daemon calls this from its housekeeping loop; it never blocks: it accepts waiting
    /// connections (a client that is neither root nor the daemon's user is answered with a
    /// refusal there and never reaches the caller), reads what has arrived on each, and
    /// returns the first whole request. A request still incomplete after [`REQUEST_TIME`], or
    /// longer than [`MAX_REQUEST`], is dropped.
    pub fn next_request(&self) -> Option<Pending> {
        let now = Instant::now();
        let mut reading = self.reading.borrow_mut();
        self.accept_waiting(&mut reading, now);
        let mut i = 0;
        while i < reading.len() {
            match read_step(&mut reading[i], now) {
                Step::Waiting => i += 1,
                Step::Gone(why) => {
                    let r = reading.remove(i);
                    self.forget(&r);
                    if !r.refused {
                        log::debug!("control client on {}: {why}", self.path.display());
                    }
                }
                Step::Line(line) => {
                    let r = reading.remove(i);
                    self.forget(&r);
                    if r.refused {
                        continue;
                    }
                    match answerable(r.stream) {
                        Ok(stream) => {
                            return Some(Pending {
                                stream,
                                request: parse_request(&line),
                            })
                        }
                        Err(e) => log::debug!("control client on {}: {e}", self.path.display()),
                    }
                }
            }
        }
        None
    }

    /// Accepts every connection waiting, checking its credentials at once.
    fn accept_waiting(&self, reading: &mut Vec<Reading>, now: Instant) {
        loop {
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    log::warn!("control socket {}: accept failed: {e}", self.path.display());
                    return;
                }
            };
            match admit(stream, now) {
                Ok(r) => {
                    if reading.len() >= MAX_CLIENTS {
                        match reading.iter().position(|r| r.refused) {
                            Some(oldest) => self.forget(&reading.remove(oldest)),
                            None => {
                                log::debug!(
                                    "control socket {}: {MAX_CLIENTS} requests already being read; a new connection is closed",
                                    self.path.display()
                                );
                                continue;
                            }
                        }
                    }
                    // Level-triggered: bytes that arrived before this are seen at once.
                    if let Err(e) = self.ready.add(r.stream.as_raw_fd(), 0) {
                        log::warn!(
                            "control socket {}: a connection is read only when another wakes the daemon: {e}",
                            self.path.display()
                        );
                    }
                    reading.push(r);
                }
                Err(e) => log::debug!("control client on {}: {e}", self.path.display()),
            }
        }
    }
}

/// What a client asked.
#[derive(Debug, Clone, PartialEq)]
pub enum Asked {
    Status,
    Change(Request),
    /// A line that is no request: answered with this error.
    Unknown(String),
}

/// A client waiting for its answer.
#[derive(Debug)]
pub struct Pending {
    stream: UnixStream,
    pub request: Asked,
}

impl Pending {
    /// Answers with `body` (JSON) and closes the connection.
    pub fn reply(self, body: &impl Serialize) {
        let mut out = &self.stream;
        let sent = serde_json::to_vec(body)
            .map_err(std::io::Error::other)
            .and_then(|b| out.write_all(&b));
        if let Err(e) = sent {
            log::debug!("control client: answer not delivered: {e}");
        }
    }
}

/// Who may ask: root, and the user the daemon runs as (a systemd `User=`).
fn allowed(uid: u32) -> bool {
    uid == 0 || uid == mt6d_os::effective_uid()
}

/// A new connection: non-blocking from now on, its credentials checked. A client that may not
/// ask is answered with the refusal here (a few dozen bytes: an empty socket buffer takes them
/// without blocking) and kept only while its request is drained.
fn admit(stream: UnixStream, now: Instant) -> std::io::Result<Reading> {
    stream.set_nonblocking(true)?;
    let cred = mt6d_os::peer_credentials(stream.as_fd())?;
    let refused = !allowed(cred.uid);
    if refused {
        log::warn!(
            "control socket: refused a request of pid {} uid {}: only root and uid {} may use it",
            cred.pid,
            cred.uid,
            mt6d_os::effective_uid()
        );
        let refusal = ChangeAnswer {
            error: Some(format!(
                "permission denied: uid {} is neither root nor the daemon's user",
                cred.uid
            )),
            ..ChangeAnswer::default()
        };
        let mut out = &stream;
        out.write_all(&serde_json::to_vec(&refusal).map_err(std::io::Error::other)?)?;
        // End of file after the refusal: the client's read ends there.
        stream.shutdown(std::net::Shutdown::Write)?;
    }
    Ok(Reading {
        stream,
        line: Vec::new(),
        deadline: now + REQUEST_TIME,
        refused,
    })
}

/// Reads what has arrived on `r`, without waiting.
fn read_step(r: &mut Reading, now: Instant) -> Step {
    let mut buf = [0u8; 4096];
    loop {
        match (&r.stream).read(&mut buf) {
            // End of file: what came is the request (a client may close its writing side
            // instead of sending the newline).
            Ok(0) if r.line.is_empty() => return Step::Gone("closed before a request".into()),
            Ok(0) => return Step::Line(std::mem::take(&mut r.line)),
            Ok(n) => {
                let got = &buf[..n];
                if let Some(end) = got.iter().position(|&b| b == b'\n') {
                    if r.line.len() + end <= MAX_REQUEST {
                        r.line.extend_from_slice(&got[..end]);
                        return Step::Line(std::mem::take(&mut r.line));
                    }
                }
                if r.line.len() + n > MAX_REQUEST {
                    return Step::Gone(format!("request longer than {MAX_REQUEST} bytes"));
                }
                r.line.extend_from_slice(got);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Step::Gone(e.to_string()),
        }
    }
    if now >= r.deadline {
        return Step::Gone(format!(
            "request not whole after {} s: connection closed",
            REQUEST_TIME.as_secs()
        ));
    }
    Step::Waiting
}

/// A permitted client's connection made ready for its answer: blocking again, writes bounded
/// (only root and the daemon's user get here, and an answer fits the socket buffer unless the
/// client stops reading).
fn answerable(stream: UnixStream) -> std::io::Result<UnixStream> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(Duration::from_millis(500)))?;
    Ok(stream)
}

/// What a request line asks.
fn parse_request(line: &[u8]) -> Asked {
    let line = String::from_utf8_lossy(line);
    let line = line.trim();
    if line == "status" {
        Asked::Status
    } else {
        match serde_json::from_str::<Request>(line) {
            Ok(r) => Asked::Change(r),
            Err(e) => Asked::Unknown(format!(
                "unknown request {:?} ({e}); known: status, or a reload or peers request as JSON",
                line.chars().take(80).collect::<String>()
            )),
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.file_type().is_socket() && m.ino() == self.inode);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{
        CollisionWatchStatus, CounterSnapshot, HandshakeStatus, MoveStatus, PathStatus, PeerStatus,
        RouteStatus,
    };

    fn sample() -> Status {
        Status {
            version: "0.1.0".into(),
            pid: 42,
            uptime_secs: 7,
            tun: "mt6d0".into(),
            role: "gateway".into(),
            internal_interface: "eth1".into(),
            external_interface: "eth0".into(),
            peers: vec![],
            path: PathStatus::default(),
            collision_watch: CollisionWatchStatus::default(),
            interfaces: Vec::new(),
            kernel_drops: crate::status::KernelDrops {
                socket_queue: 4,
                tun_queue: 5,
                tun_write: 0,
            },
            workers: vec![
                crate::status::WorkerStatus {
                    sealed: 10,
                    opened: 20,
                    wakeups: 5,
                    placement: crate::status::Placement::Light { cpu: 0 },
                },
                crate::status::WorkerStatus::default(),
            ],
        }
    }

    /// One owner per object: only a socket nobody answers on is replaced; a regular file, a
    /// directory or a symbolic link to a file is refused and left intact.
    #[test]
    fn bind_replaces_only_a_dead_socket() {
        let dir = std::env::temp_dir().join(format!("mt6d-ctl-refuse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("gateway.toml");
        std::fs::write(&file, "precious").expect("write");
        let link = dir.join("link.sock");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&file, &link).expect("symlink");
        let subdir = dir.join("d.sock");
        std::fs::create_dir_all(&subdir).expect("subdir");
        for (path, kind) in [
            (&file, "a regular file"),
            (&link, "a symbolic link"),
            (&subdir, "a directory"),
        ] {
            assert_eq!(
                inspect_socket_path(path).expect("inspect"),
                SocketPath::NotASocket(kind)
            );
            let e = ControlServer::bind(path).expect_err("refused");
            assert!(e.to_string().contains(kind), "{e}");
            assert!(crate::daemon::files::refuse_non_socket(path).is_err());
        }
        assert_eq!(std::fs::read_to_string(&file).expect("intact"), "precious");
        assert!(subdir.is_dir());
        // A dead socket (bound, then its listener closed) is replaced; a live one is not.
        let sock = dir.join("ctl.sock");
        drop(std::os::unix::net::UnixListener::bind(&sock).expect("bind raw"));
        assert_eq!(
            inspect_socket_path(&sock).expect("inspect"),
            SocketPath::Stale
        );
        let live = ControlServer::bind(&sock).expect("replaces the dead socket");
        assert_eq!(
            inspect_socket_path(&sock).expect("inspect"),
            SocketPath::Live
        );
        assert!(
            ControlServer::bind(&sock).is_err(),
            "a live socket is not stolen"
        );
        drop(live);
        assert_eq!(
            inspect_socket_path(&sock).expect("inspect"),
            SocketPath::Absent
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn status_roundtrips_over_a_real_unix_socket() {
        let path = std::env::temp_dir().join(format!("mt6d-ctl-{}.sock", std::process::id()));
        let server = ControlServer::bind(&path).expect("bind");
        let mode = std::fs::metadata(&path)
            .expect("socket exists")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        let client = std::thread::spawn({
            let path = path.clone();
            move || query_status(&path)
        });
        // Serve until the client got its answer; bounded so a bug cannot hang the test.
        for _ in 0..200 {
            if let Some(p) = server.next_request() {
                assert_eq!(p.request, Asked::Status);
                p.reply(&sample());
            }
            if client.is_finished() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let got = client
            .join()
            .expect("client thread")
            .expect("status answer");
        assert_eq!(got.pid, 42);
        assert!(
            ControlServer::bind(&path).is_err(),
            "a live socket must not be stolen"
        );
        drop(server);
        assert!(!path.exists(), "socket file removed on drop");
    }

    /// A change request crosses the socket as one JSON line and comes back as the daemon's
    /// answer; a refusal reaches the client as an error with the daemon's words.
    #[test]
    fn change_requests_and_refusals_roundtrip() {
        let path = std::env::temp_dir().join(format!("mt6d-ctl-chg-{}.sock", std::process::id()));
        let server = ControlServer::bind(&path).expect("bind");
        let peer: toml::Table =
            "name = \"c\"\nremote_host = \"2001:db8:1::c\"\nport = 4500\nrotation_secs = 1.5\n"
                .parse()
                .expect("table");
        let edits = vec![Edit::Add { peer }, Edit::Remove { name: "b".into() }];
        let serve = |answer: ChangeAnswer, want: Request| {
            let client = std::thread::spawn({
                let path = path.clone();
                let want = want.clone();
                move || send(&path, &want)
            });
            for _ in 0..200 {
                if let Some(p) = server.next_request() {
                    assert_eq!(p.request, Asked::Change(want.clone()));
                    p.reply(&answer);
                }
                if client.is_finished() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            client.join().expect("client thread")
        };
        let got = serve(
            ChangeAnswer {
                added: vec!["c".into()],
                removed: vec!["b".into()],
                ..ChangeAnswer::default()
            },
            Request::Peers { edits },
        )
        .expect("applied");
        assert_eq!(
            (got.added, got.removed),
            (vec!["c".to_string()], vec!["b".to_string()])
        );
        let refused = serve(
            ChangeAnswer {
                error: Some("refused, nothing changed: peer \"c\": bad".into()),
                ..ChangeAnswer::default()
            },
            Request::Reload,
        )
        .expect_err("refused");
        assert!(
            matches!(&refused, ControlError::Refused { .. }),
            "{refused:?}"
        );
        assert!(refused.to_string().contains("peer \"c\": bad"), "{refused}");
    }

    /// A client that trickles its request a byte at a time, as a slow or hostile local client
    /// can, holds up neither the daemon's loop nor another client's answer. It used to: the
    /// request was read whole on the main loop, 500 ms allowed per read, so a byte every
    /// 100 ms kept the loop (and with it the rotations) waiting until the line ended.
    #[test]
    fn a_trickling_client_holds_up_no_one() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let path = std::env::temp_dir().join(format!("mt6d-ctl-slow-{}.sock", std::process::id()));
        let server = ControlServer::bind(&path).expect("bind");
        let answered = Arc::new(AtomicBool::new(false));
        // Connected and mid-line before the other client arrives, so that it is accepted first.
        let mut slow = UnixStream::connect(&path).expect("connect");
        slow.write_all(b"s").expect("first byte");
        let trickler = std::thread::spawn({
            let answered = answered.clone();
            move || {
                let start = Instant::now();
                for b in b"tatus".iter().cycle() {
                    if answered.load(Ordering::SeqCst) || start.elapsed() > Duration::from_secs(10)
                    {
                        break;
                    }
                    if slow.write_all(&[*b]).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                // Whether the line was still unfinished when the other client had its answer.
                let overtaken = answered.load(Ordering::SeqCst);
                let _ = slow.write_all(b"\n");
                overtaken
            }
        });
        std::thread::sleep(Duration::from_millis(50));
        let client = std::thread::spawn({
            let path = path.clone();
            move || query_status(&path)
        });
        let mut longest = Duration::ZERO;
        let begun = Instant::now();
        while begun.elapsed() < Duration::from_secs(20) {
            let t = Instant::now();
            if let Some(p) = server.next_request() {
                p.reply(&sample());
            }
            longest = longest.max(t.elapsed());
            if client.is_finished() {
                answered.store(true, Ordering::SeqCst);
            }
            if client.is_finished() && trickler.is_finished() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let waited = begun.elapsed();
        println!("longest next_request call {longest:?}; the trickler ran {waited:?}");
        let got = client.join().expect("client").expect("status answer");
        assert_eq!(got.pid, 42);
        assert!(
            trickler.join().expect("trickler"),
            "the other client was answered only after the trickled line ended"
        );
    }

    /// A request longer than MAX_REQUEST is dropped unread, and a connection that sends nothing
    /// is closed after REQUEST_TIME, without the daemon waiting on either.
    #[test]
    fn oversized_and_silent_requests_are_dropped() {
        let path = std::env::temp_dir().join(format!("mt6d-ctl-big-{}.sock", std::process::id()));
        let server = ControlServer::bind(&path).expect("bind");
        let mut silent = UnixStream::connect(&path).expect("connect");
        let big = std::thread::spawn({
            let path = path.clone();
            move || {
                let mut s = UnixStream::connect(&path).expect("connect");
                let chunk = vec![b'x'; 64 * 1024];
                // Refused part-way once the daemon drops the connection.
                let sent = (0..MAX_REQUEST / chunk.len() + 2).all(|_| s.write_all(&chunk).is_ok());
                let mut rest = Vec::new();
                let _ = s.read_to_end(&mut rest);
                (sent, rest)
            }
        });
        let begun = Instant::now();
        while !big.is_finished() && begun.elapsed() < Duration::from_secs(20) {
            assert!(server.next_request().is_none(), "no request was whole");
            std::thread::sleep(Duration::from_millis(5));
        }
        let (_, rest) = big.join().expect("big client");
        assert!(rest.is_empty(), "dropped without an answer");
        // The silent one is still held; after REQUEST_TIME it is closed (read gives 0).
        assert_eq!(server.reading.borrow().len(), 1);
        std::thread::sleep(REQUEST_TIME.saturating_sub(begun.elapsed()));
        let begun = Instant::now();
        while !server.reading.borrow().is_empty() && begun.elapsed() < Duration::from_secs(5) {
            assert!(server.next_request().is_none());
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            server.reading.borrow().is_empty(),
            "the silent client is given up"
        );
        silent
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut rest = Vec::new();
        assert_eq!(silent.read_to_end(&mut rest).expect("end of file"), 0);
    }

    /// The clean-up of a dead daemon's socket, whose path comes from its record, removes only
    /// a socket nobody answers on, and does not follow a directory of the path that was
    /// replaced by a symbolic link since: the socket the link leads to stays.
    #[test]
    fn stale_socket_clean_up_does_not_follow_a_replaced_path() {
        let dir = std::env::temp_dir().join(format!("mt6d-ctl-stale-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (run, elsewhere) = (dir.join("run"), dir.join("elsewhere"));
        std::fs::create_dir_all(&run).expect("dir");
        std::fs::create_dir_all(&elsewhere).expect("dir");
        let dead = |p: &Path| drop(UnixListener::bind(p).expect("bind"));
        // A stale socket is removed; a live one, a regular file and a link are not.
        let sock = run.join("ctl.sock");
        dead(&sock);
        assert!(remove_stale_socket(&sock).expect("clean-up"));
        assert!(!sock.exists());
        let live = UnixListener::bind(&sock).expect("bind");
        assert!(!remove_stale_socket(&sock).expect("clean-up"));
        assert!(sock.exists(), "a live socket stays");
        drop(live);
        std::fs::remove_file(&sock).expect("rm");
        std::fs::write(&sock, "not a socket").expect("write");
        assert!(!remove_stale_socket(&sock).expect("clean-up"));
        assert!(sock.exists(), "a regular file stays");
        std::fs::remove_file(&sock).expect("rm");
        // The record named run/ctl.sock; run was since replaced by a link to a directory with
        // another dead daemon's socket of that name.
        let victim = elsewhere.join("ctl.sock");
        dead(&victim);
        std::fs::remove_dir(&run).expect("rmdir");
        std::os::unix::fs::symlink(&elsewhere, &run).expect("symlink");
        let _ = remove_stale_socket(&sock);
        assert!(
            std::fs::symlink_metadata(&victim).is_ok(),
            "the socket behind the replaced directory was removed"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn connecting_to_no_daemon_says_so() {
        let err = query_status(Path::new("/nonexistent/mt6d.sock")).expect_err("no daemon");
        assert!(err.to_string().contains("is `mt6d run` running"), "{err}");
    }

    #[test]
    fn render_shows_drop_reasons_that_happened() {
        let mut st = sample();
        let mut counters = CounterSnapshot::default();
        counters.drops.insert("bad_tag".into(), 3);
        counters.drops.insert("replay".into(), 0);
        st.peers.push(PeerStatus {
            name: "b".into(),
            mode: "encrypt".into(),
            local_host: "2001:db8::a".into(),
            remote_host: "2001:db8::b".into(),
            epoch: 9,
            next_change_ms: 1500,
            last_rx_ms_ago: Some(1200),
            send: RouteStatus {
                epoch: 9,
                local: "[2001:db8::1]:1".into(),
                remote: "[2001:db8::2]:2".into(),
            },
            accept: vec![],
            route_sets: vec![],
            counters,
            keying: "handshake".into(),
            handshake: Some(HandshakeStatus {
                has_keys: true,
                last_handshake_ms_ago: Some(2500),
                handshakes: 3,
                rekeys: 2,
                failures: [("hs_bad_mac".to_string(), 7)].into(),
                ..HandshakeStatus::default()
            }),
            moves: MoveStatus {
                collisions_detected: 1,
                routes_moved: 1,
                ..MoveStatus::default()
            },
            tcp: vec![crate::status::TcpPolicyStatus {
                direction: "out".into(),
                events: [("stripped".to_string(), 2), ("dropped".to_string(), 0)].into(),
                rules: vec![crate::status::RuleStatus {
                    rule: "wing 0x1234 drop".into(),
                    hits: 1,
                }],
            }],
        });
        let text = crate::status::text::render(&st);
        assert!(
            text.contains("tcp out stripped 2; rules #1 wing 0x1234 drop: 1"),
            "{text}"
        );
        assert!(
            text.contains("address collisions 1 (unresolved 0)  routes moved 1"),
            "{text}"
        );
        assert!(text.contains("handshake up  last 2.5s ago"), "{text}");
        assert!(text.contains("handshake failures hs_bad_mac 7"), "{text}");
        assert!(text.contains("drops bad_tag 3"), "{text}");
        assert!(
            text.contains(
                "kernel queue drops: socket receive queues 4, TUN transmit queue 5, refused TUN writes 0"
            ),
            "{text}"
        );
        assert!(text.contains("last packet received 1.2s ago"), "{text}");
        assert!(
            text.contains(
                "data-plane workers 2: #0 sealed 10 opened 20 (light, on CPU 0), \
                 #1 sealed 0 opened 0 (not placed)"
            ),
            "{text}"
        );
        assert!(!text.contains("replay 0"), "{text}");
    }
}
