//! What each signal does to the daemon. A signal whose default action would end the process
//! without clean-up either stops it cleanly or is ignored, so that a stray `kill -USR1` or
//! `systemctl reload` never leaves the kernel state of a dead daemon behind (SIGHUP used
//! to kill it, leaving routes, proxy entries and `forwarding=1`).
//!
//! | signals | action |
//! |---|---|
//! | SIGTERM, SIGINT, SIGQUIT, SIGXCPU, SIGPWR | clean stop: everything removed, sysctls restored |
//! | SIGHUP | re-read the config (`reload.rs`): an invalid file is logged with file:line:column and changes nothing; a valid one's added, removed and changed peers are applied, all or nothing, the others untouched |
//! | SIGPIPE, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGXFSZ, SIGSTKFLT, SIGRTMIN..SIGRTMAX | ignored |
//! | SIGKILL, SIGSTOP; SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP, SIGSYS (faults) | cannot or must not be handled: the fail-closed guards hold, and `mt6d down` or the next start cleans up |
//!
//! The handlers set flags and, for the stop signals and SIGHUP, write one byte to a self-pipe
//! (both async-signal-safe, via signal-hook): the main thread sleeps in an epoll set that holds
//! the pipe's other end ([`super::wakeup::MainWait`]), wakes at once and reads the flags.

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// Signals that stop the daemon through its clean-up.
const STOP: [libc::c_int; 5] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGXCPU,
    libc::SIGPWR,
];

/// Signals whose default action terminates and that mean nothing to mt6d. SIGXFSZ ignored
/// makes an oversized write fail with EFBIG instead of killing the process.
const IGNORED: [libc::c_int; 9] = [
    libc::SIGPIPE,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGVTALRM,
    libc::SIGPROF,
    libc::SIGIO,
    libc::SIGXFSZ,
    libc::SIGSTKFLT,
];

/// The flags the handlers set, and the self-pipe they wake the main thread with.
#[derive(Debug)]
pub struct Signals {
    stop: Arc<AtomicUsize>,
    reload: Arc<AtomicBool>,
    /// The pipe's reading end (non-blocking): readable after a stop signal or SIGHUP.
    woken: UnixStream,
    /// The handlers that write the pipe, removed on drop (a flag's handler stays: a signal
    /// after the daemon's run must still not kill it half way through its clean-up).
    wakers: Vec<signal_hook::SigId>,
}

impl Signals {
    /// Installs every handler of the table above.
    pub fn install() -> std::io::Result<Signals> {
        let stop = Arc::new(AtomicUsize::new(0));
        let reload = Arc::new(AtomicBool::new(false));
        for sig in STOP {
            signal_hook::flag::register_usize(sig, stop.clone(), sig as usize)?;
        }
        let ignored = Arc::new(AtomicBool::new(false));
        let realtime = libc::SIGRTMIN()..=libc::SIGRTMAX();
        for sig in IGNORED.into_iter().chain(realtime) {
            signal_hook::flag::register(sig, ignored.clone())?;
        }
        signal_hook::flag::register(libc::SIGHUP, reload.clone())?;
        // A socket pair: signal-hook sends with MSG_DONTWAIT, so a full pipe (the main thread
        // has not read it yet, and is awake anyway) never blocks a handler.
        let (woken, wake) = UnixStream::pair()?;
        woken.set_nonblocking(true)?;
        let mut wakers = Vec::with_capacity(STOP.len() + 1);
        for sig in STOP.into_iter().chain([libc::SIGHUP]) {
            // Registered after the flags: the main thread that wakes finds the flag set.
            wakers.push(signal_hook::low_level::pipe::register(
                sig,
                wake.try_clone()?,
            )?);
        }
        Ok(Signals {
            stop,
            reload,
            woken,
            wakers,
        })
    }

    /// A second handle on the self-pipe's reading end, for the main thread's epoll set.
    pub fn wake_source(&self) -> std::io::Result<UnixStream> {
        self.woken.try_clone()
    }

    /// Whether a stop signal arrived.
    pub fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Relaxed) != 0
    }

    /// The name of the signal that stopped the daemon, if one did.
    pub fn stopped_by(&self) -> Option<String> {
        let sig = self.stop.load(Ordering::Relaxed);
        (sig != 0).then(|| {
            nix::sys::signal::Signal::try_from(sig as libc::c_int)
                .map_or_else(|_| format!("signal {sig}"), |s| s.as_str().to_string())
        })
    }

    /// Whether SIGHUP arrived since the last call.
    pub fn take_reload(&self) -> bool {
        self.reload.swap(false, Ordering::Relaxed)
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        for id in self.wakers.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}
