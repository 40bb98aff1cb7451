//! `Netns`: named network namespaces, compatible with iproute2's `ip netns`.
//!
//! A namespace NAME is a bind mount of a namespace file onto `/run/netns/NAME`, created the way
//! `ip netns add` does (iproute2 `ip/ipnetns.c`): `/run/netns` is made a shared mount point
//! (bind-mounted onto itself first if it is not a mount point yet) so the mounts propagate to
//! other mount namespaces, then a fresh thread calls `unshare(CLONE_NEWNET)` and its
//! `/proc/thread-self/ns/net` is bind-mounted onto the file. `ip netns exec NAME ...` works on
//! the result and the other way round.
//!
//! Entering is per thread (`setns(2)` changes only the calling thread), so [`Netns::run`] runs a
//! closure on a scoped thread and never changes the caller's namespace. Sockets, TUN devices and
//! netlink sockets stay in the namespace they were created in, whichever thread uses them later.
//!
//! This module does nothing beyond namespaces: links and addresses inside one are made with
//! [`crate::netlink::Netlink`] opened inside it.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::error::{OsError, Result};
use crate::sys::cvt;

const NETNS_RUN_DIR: &str = "/run/netns";

/// A named network namespace. Created ones are deleted on drop; opened ones are not.
#[derive(Debug)]
pub struct Netns {
    name: String,
    path: PathBuf,
    file: File,
    owned: bool,
}

fn cstr(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

fn mount(src: &Path, target: &Path, flags: libc::c_ulong) -> io::Result<()> {
    let src = cstr(src)?;
    let target = cstr(target)?;
    // SAFETY: all pointers are NUL-terminated strings alive for the call; data is null.
    cvt(unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            c"none".as_ptr(),
            flags,
            std::ptr::null(),
        )
    })
    .map(drop)
}

fn setns(fd: RawFd) -> io::Result<()> {
    // SAFETY: setns takes a descriptor and a flag; an invalid descriptor is reported as EBADF.
    cvt(unsafe { libc::setns(fd, libc::CLONE_NEWNET) }).map(drop)
}

/// Makes `/run/netns` a shared mount point, as iproute2 does before its first `netns add`.
fn prepare_run_dir() -> io::Result<()> {
    // Two threads racing here would both bind-mount /run/netns onto itself.
    static PREPARE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _serial = PREPARE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = Path::new(NETNS_RUN_DIR);
    std::fs::create_dir_all(dir)?;
    let empty = Path::new("");
    match mount(empty, dir, libc::MS_SHARED | libc::MS_REC) {
        Ok(()) => Ok(()),
        // EINVAL: not a mount point yet. Bind it onto itself, then retry.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            mount(dir, dir, libc::MS_BIND | libc::MS_REC)?;
            mount(empty, dir, libc::MS_SHARED | libc::MS_REC)
        }
        Err(e) => Err(e),
    }
}

/// The cookie of the calling thread's network namespace (`SO_NETNS_COOKIE`, Linux 5.14): a
/// number the kernel never gives to another namespace until reboot, unlike the namespace's inode
/// number, which a new namespace may reuse once the old one is gone. mt6d names its per-instance
/// state files with it, so that a record left by a daemon in a namespace that no longer exists
/// can never be taken for one of a namespace created later.
pub fn current_cookie() -> Result<u64> {
    let ctx = |source| OsError::Netlink {
        op: "read the network namespace cookie (SO_NETNS_COOKIE)",
        source,
    };
    let fd = crate::sys::socket(libc::AF_INET6, libc::SOCK_DGRAM, 0).map_err(ctx)?;
    // SO_NETNS_COOKIE is 71 on every Linux architecture (asm-generic/socket.h).
    crate::sys::getsockopt_u64(fd.as_fd(), libc::SOL_SOCKET, 71).map_err(ctx)
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 64
        || name.contains(['/', '\0'])
        || name == "."
        || name == ".."
    {
        return Err(OsError::InvalidArgument(format!(
            "network namespace name {name:?}"
        )));
    }
    Ok(())
}

impl Netns {
    /// Creates the network namespace `name` (fails with EEXIST if it exists).
    pub fn create(name: &str) -> Result<Netns> {
        check_name(name)?;
        let ctx = |op| {
            move |source| OsError::Netns {
                name: name.to_owned(),
                op,
                source,
            }
        };
        prepare_run_dir().map_err(ctx("make /run/netns a shared mount point"))?;
        let path = Path::new(NETNS_RUN_DIR).join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(ctx("create mount point file"))?;
        // unshare(CLONE_NEWNET) changes only the calling thread; a throwaway thread keeps the
        // caller's namespace untouched. The bind mount keeps the namespace alive after it exits.
        let mounted = std::thread::scope(|s| {
            s.spawn(|| -> io::Result<()> {
                // SAFETY: unshare takes only a flag and affects only this thread.
                cvt(unsafe { libc::unshare(libc::CLONE_NEWNET) })?;
                mount(Path::new("/proc/thread-self/ns/net"), &path, libc::MS_BIND)
            })
            .join()
        })
        .unwrap_or_else(|_| Err(io::Error::other("namespace creation thread panicked")));
        if let Err(e) = mounted {
            let _ = std::fs::remove_file(&path);
            return Err(ctx("unshare and bind-mount")(e));
        }
        match File::open(&path) {
            Ok(file) => Ok(Netns {
                name: name.to_owned(),
                path,
                file,
                owned: true,
            }),
            Err(e) => {
                remove(&path);
                Err(ctx("open")(e))
            }
        }
    }

    /// Opens the existing namespace `name`; dropping the result does not delete it.
    pub fn open(name: &str) -> Result<Netns> {
        check_name(name)?;
        let path = Path::new(NETNS_RUN_DIR).join(name);
        let file = File::open(&path).map_err(|source| OsError::Netns {
            name: name.to_owned(),
            op: "open",
            source,
        })?;
        Ok(Netns {
            name: name.to_owned(),
            path,
            file,
            owned: false,
        })
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A descriptor of the namespace, for `setns(2)` or [`crate::netlink::Netlink::move_link_to_netns`].
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Runs `f` on a new thread inside this namespace and returns its result. A panic in `f`
    /// is resumed on the caller.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        let fd = self.fd();
        let joined = std::thread::scope(|s| {
            s.spawn(|| -> io::Result<T> {
                setns(fd)?;
                Ok(f())
            })
            .join()
        });
        match joined {
            Ok(r) => r.map_err(|source| OsError::Netns {
                name: self.name.clone(),
                op: "enter (setns)",
                source,
            }),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// Moves the calling thread into this namespace for good (worker threads of the daemon).
    pub fn enter_current_thread(&self) -> Result<()> {
        setns(self.fd()).map_err(|source| OsError::Netns {
            name: self.name.clone(),
            op: "enter (setns)",
            source,
        })
    }

    /// A `Command` whose child enters this namespace before `exec`, like `ip netns exec`
    /// (without the /etc/netns bind mounts or the /sys remount).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Result<Command> {
        // The command may outlive `self`; it keeps its own descriptor.
        let fd: Arc<OwnedFd> = Arc::new(self.file.as_fd().try_clone_to_owned().map_err(
            |source| OsError::Netns {
                name: self.name.clone(),
                op: "duplicate descriptor",
                source,
            },
        )?);
        let mut cmd = Command::new(program);
        // SAFETY: the closure runs in the forked child before exec and only calls setns(2), which
        // is async-signal-safe; it allocates nothing and touches no lock.
        unsafe {
            cmd.pre_exec(move || setns(fd.as_raw_fd()));
        }
        Ok(cmd)
    }

    /// Deletes the namespace now (unmount and unlink); idempotent. Processes and sockets still
    /// inside keep it alive until they end, as with `ip netns del`.
    pub fn delete(mut self) {
        self.owned = true;
        // Drop does the work.
    }
}

fn remove(path: &Path) {
    if let Ok(c) = cstr(path) {
        // SAFETY: `c` is a NUL-terminated path alive for the call. Errors (EINVAL: not mounted,
        // ENOENT: gone) mean there is nothing left to unmount.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
    let _ = std::fs::remove_file(path);
}

impl Drop for Netns {
    fn drop(&mut self) {
        if self.owned {
            remove(&self.path);
        }
    }
}

/// A name unique to this process and call: `prefix` + pid + counter in hex, at most 15 bytes so
/// it is also a valid interface name. `prefix` is cut to fit.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tail = format!("{:x}x{n:x}", std::process::id());
    let keep = 15usize.saturating_sub(tail.len());
    let prefix: String = prefix
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(keep)
        .collect();
    let mut name = prefix + &tail;
    name.truncate(15);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exists(name: &str) -> bool {
        Path::new(NETNS_RUN_DIR).join(name).exists()
    }

    fn own_netns_inode() -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/thread-self/ns/net")
            .expect("own netns")
            .ino()
    }

    #[test]
    fn unique_names_fit_interface_names() {
        let a = unique_name("mt6dtest");
        let b = unique_name("mt6dtest");
        assert_ne!(a, b);
        assert!(a.len() <= 15 && b.len() <= 15);
        assert!(unique_name("a-very-long-prefix-indeed").len() <= 15);
    }

    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn create_enter_delete() {
        let name = unique_name("nst");
        let outside = own_netns_inode();
        {
            let ns = Netns::create(&name).expect("create");
            assert!(exists(&name));
            assert!(Netns::create(&name).is_err(), "second create must fail");
            let inside = ns.run(own_netns_inode).expect("run");
            assert_ne!(inside, outside);
            assert_eq!(own_netns_inode(), outside, "caller thread must not move");
            let opened = Netns::open(&name).expect("open");
            assert_eq!(opened.run(own_netns_inode).expect("run"), inside);
            drop(opened);
            assert!(
                exists(&name),
                "dropping an opened namespace must not delete it"
            );

            // A child process launched with command() sees the namespace: its loopback is down
            // and it has no other links. Read its netns inode through /proc/self.
            let out = ns
                .command("stat")
                .expect("command")
                .args(["-L", "-c", "%i", "/proc/self/ns/net"])
                .output()
                .expect("run stat");
            assert!(out.status.success());
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                inside.to_string()
            );

            std::thread::scope(|s| {
                s.spawn(|| {
                    ns.enter_current_thread().expect("enter");
                    assert_eq!(own_netns_inode(), inside);
                });
            });
        }
        assert!(!exists(&name), "drop must delete the namespace");
    }

    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn panic_inside_run_still_cleans_up() {
        let name = unique_name("nsp");
        let r = std::panic::catch_unwind(|| {
            let ns = Netns::create(&name).expect("create");
            ns.run(|| panic!("boom")).expect("run");
        });
        assert!(r.is_err());
        assert!(!exists(&name));
    }
}
