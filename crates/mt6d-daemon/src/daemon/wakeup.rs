//! How a role's main thread sleeps: until its earliest deadline, or until something it serves
//! happens, whichever comes first, and never on a short polling tick.
//!
//! Everything that can give the main thread work is a descriptor in one epoll set
//! ([`MainWait`]):
//! - the signal handlers' self-pipe ([`super::signals::Signals`]): a stop or SIGHUP writes one
//!   byte to it from the handler (async-signal-safe `send`), besides setting its flag;
//! - one eventfd for the other threads ([`Nudge`]): a packet thread that flags work for the
//!   main thread (the gateway's attention queue, the server's re-index queue) signals it, and
//!   so does a packet thread that ends, however it ends ([`Nudge::on_drop`], a guard held by
//!   the thread's closure, so a panic wakes it too);
//! - the control socket ([`crate::control::ControlServer`]): its listener and the connections
//!   whose request is still being read, so a request wakes the loop and a partial request is
//!   continued when its next bytes arrive;
//! - whatever else the role reads on that thread (the link-watch netlink socket, a neighbour
//!   discovery capture), added with [`MainWait::watch`].
//!
//! A wait is `epoll_wait` until the earliest deadline the role computed ([`Deadlines`]), at most
//! [`SAFETY_CAP`]: every duty with a time (rotation, timers, periodic snapshots and reports)
//! has its own deadline, so the cap is a safety net, not a tick. What must not happen here: a
//! role's logic. The loop that calls [`MainWait::wait`] does every duty in its own order after
//! each wake-up, whatever woke it; the reasons ([`Woke`]) are for tests and logs.

use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mt6d_os::{Epoll, EpollEvents, OsError, Waker};
use mt6d_proto::UnixTime;

/// The longest a main thread sleeps when nothing is due: a safety net for a deadline a role
/// forgot, never the way a duty is reached.
pub const SAFETY_CAP: Duration = Duration::from_secs(1);

const SIGNAL: u64 = 0;
const THREAD: u64 = 1;
const CONTROL: u64 = 2;
const DESCRIPTOR: u64 = 3;

/// What ended one [`MainWait::wait`]; all false: the deadline (or the cap) passed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Woke {
    /// A stop signal or SIGHUP arrived.
    pub signal: bool,
    /// Another thread nudged: it flagged work, or it ended.
    pub thread: bool,
    /// The control socket: a new connection, or bytes of a request being read.
    pub control: bool,
    /// A descriptor the role watches is readable.
    pub descriptor: bool,
}

impl Woke {
    /// Whether the wait ended at its deadline, nothing having happened.
    pub fn timed_out(&self) -> bool {
        *self == Woke::default()
    }
}

/// The other threads' way to wake the main thread: cheap to clone, one `write` to an eventfd
/// per call (a thread calls it once per event it flags, never per packet).
#[derive(Debug, Clone)]
pub struct Nudge(Arc<Waker>);

impl Nudge {
    /// Wakes the main thread (if it is not waiting, its next wait returns at once).
    pub fn nudge(&self) {
        if let Err(e) = self.0.wake() {
            // An eventfd write fails only on a full counter, which a wake-up clears: the main
            // thread is then awake anyway.
            log::debug!("waking the main thread: {e}");
        }
    }

    /// A guard that nudges when dropped: held by a packet thread's closure, it wakes the main
    /// thread when the thread ends, whether it returned or panicked.
    pub fn on_drop(&self) -> NudgeOnDrop {
        NudgeOnDrop(self.clone())
    }
}

/// See [`Nudge::on_drop`].
#[derive(Debug)]
pub struct NudgeOnDrop(Nudge);

impl Drop for NudgeOnDrop {
    fn drop(&mut self) {
        self.0.nudge();
    }
}

/// The main thread's epoll set (see the module doc).
#[derive(Debug)]
pub struct MainWait {
    epoll: Epoll,
    events: EpollEvents,
    threads: Nudge,
    /// The reading end of the signal handlers' self-pipe (None: no handlers installed).
    signals: Option<UnixStream>,
    /// Waits so far (tests and measurements).
    waits: u64,
}

fn os(what: &'static str) -> impl FnOnce(OsError) -> super::SetupError {
    move |source| super::SetupError {
        what: what.into(),
        source,
    }
}

impl MainWait {
    /// A wait set that `signals`' handlers and every [`MainWait::nudge`] wake.
    pub fn new(signals: &super::signals::Signals) -> Result<MainWait, super::SetupError> {
        let mut wait = MainWait::without_signals()?;
        let pipe = signals.wake_source().map_err(|e| super::SetupError {
            what: "duplicate the signal handlers' self-pipe".into(),
            source: OsError::Epoll {
                op: "dup",
                source: e,
            },
        })?;
        wait.epoll
            .add(pipe.as_raw_fd(), SIGNAL)
            .map_err(os("watch the signal handlers' self-pipe"))?;
        wait.signals = Some(pipe);
        Ok(wait)
    }

    /// A wait set no signal wakes (tests, and a role's helper that has no handlers).
    pub fn without_signals() -> Result<MainWait, super::SetupError> {
        let epoll = Epoll::new().map_err(os("create the main thread's epoll"))?;
        let waker = Waker::new().map_err(os("create the main thread's eventfd"))?;
        epoll
            .add(waker.as_raw_fd(), THREAD)
            .map_err(os("watch the main thread's eventfd"))?;
        Ok(MainWait {
            epoll,
            events: EpollEvents::with_capacity(8),
            threads: Nudge(Arc::new(waker)),
            signals: None,
            waits: 0,
        })
    }

    /// The handle other threads wake this one with.
    pub fn nudge(&self) -> Nudge {
        self.threads.clone()
    }

    /// Wakes on control requests: the socket's listener and every connection it reads.
    pub fn watch_control(
        &mut self,
        control: &crate::control::ControlServer,
    ) -> Result<(), super::SetupError> {
        self.epoll
            .add(control.readiness_fd(), CONTROL)
            .map_err(os("watch the control socket"))
    }

    /// Wakes when `fd` is readable (it must stay open while watched; closing it removes it).
    pub fn watch(&mut self, fd: RawFd) -> Result<(), super::SetupError> {
        self.epoll
            .add(fd, DESCRIPTOR)
            .map_err(os("watch a descriptor of the main thread"))
    }

    /// Sleeps until something happens or `timeout` (at most [`SAFETY_CAP`]) passes, and says
    /// what happened. The eventfd and the self-pipe are cleared; the other descriptors are
    /// level-triggered and stay ready until the role reads them.
    pub fn wait(&mut self, timeout: Duration) -> Result<Woke, OsError> {
        self.waits += 1;
        self.epoll
            .wait(&mut self.events, Some(timeout.min(SAFETY_CAP)))?;
        let mut woke = Woke::default();
        for token in self.events.tokens() {
            match token {
                SIGNAL => woke.signal = true,
                THREAD => woke.thread = true,
                CONTROL => woke.control = true,
                _ => woke.descriptor = true,
            }
        }
        if woke.thread {
            self.threads.0.reset();
        }
        if woke.signal {
            if let Some(pipe) = &self.signals {
                // Non-blocking: read until empty (the flags, not the bytes, say which signal).
                let mut buf = [0u8; 64];
                while matches!((&*pipe).read(&mut buf), Ok(n) if n > 0) {}
            }
        }
        Ok(woke)
    }

    /// How many times [`MainWait::wait`] was called.
    pub fn waits(&self) -> u64 {
        self.waits
    }
}

impl AsRawFd for MainWait {
    /// The epoll descriptor itself, readable when one of its descriptors is: a role whose main
    /// duties run inside another epoll loop (the relay's worker 0) watches it there.
    fn as_raw_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }
}

/// The earliest of a loop's deadlines, as the time to wait from now; [`SAFETY_CAP`] if none
/// is sooner.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    now: UnixTime,
    instant: Instant,
    wait: Duration,
}

impl Deadlines {
    /// Deadlines measured from the wall clock's `now` (and, for [`Instant`] ones, from the
    /// monotonic clock read here).
    pub fn from(now: UnixTime) -> Deadlines {
        Deadlines {
            now,
            instant: Instant::now(),
            wait: SAFETY_CAP,
        }
    }

    /// A deadline on the wall clock (None: none).
    pub fn at(&mut self, t: Option<UnixTime>) -> &mut Deadlines {
        if let Some(t) = t {
            let d = Duration::from_nanos(t.as_nanos().saturating_sub(self.now.as_nanos()));
            self.wait = self.wait.min(d);
        }
        self
    }

    /// A deadline on the monotonic clock (None: none).
    pub fn instant(&mut self, t: Option<Instant>) -> &mut Deadlines {
        if let Some(t) = t {
            self.wait = self.wait.min(t.saturating_duration_since(self.instant));
        }
        self
    }

    /// The time to wait.
    pub fn wait(&self) -> Duration {
        self.wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Far beyond the safety cap: a wait that returns with a reason returned because of it.
    const LONG: Duration = Duration::from_secs(60);

    #[test]
    fn a_nudge_from_another_thread_wakes_the_wait_with_its_reason() {
        let mut w = MainWait::without_signals().expect("wait set");
        let n = w.nudge();
        let t = std::thread::spawn(move || n.nudge());
        let woke = w.wait(LONG).expect("wait");
        t.join().expect("thread");
        assert!(woke.thread, "{woke:?}");
        // Cleared: the next wait times out.
        assert!(w.wait(Duration::from_millis(1)).expect("wait").timed_out());
    }

    #[test]
    fn a_thread_that_panics_wakes_the_wait_through_its_guard() {
        let mut w = MainWait::without_signals().expect("wait set");
        let guard = w.nudge().on_drop();
        let t = std::thread::spawn(move || {
            let _guard = guard;
            panic!("a packet thread's panic (expected by this test)");
        });
        assert!(t.join().is_err());
        let woke = w.wait(LONG).expect("wait");
        assert!(woke.thread, "{woke:?}");
    }

    #[test]
    fn a_signal_wakes_the_wait_and_sets_its_flag() {
        let signals = crate::daemon::signals::Signals::install().expect("install");
        let mut w = MainWait::new(&signals).expect("wait set");
        // SIGHUP is the reload signal: its handler sets the flag and writes the self-pipe.
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGHUP).expect("raise");
        let woke = w.wait(LONG).expect("wait");
        assert!(woke.signal, "{woke:?}");
        assert!(signals.take_reload());
        assert!(w.wait(Duration::from_millis(1)).expect("wait").timed_out());
    }

    #[test]
    fn a_control_request_wakes_the_wait_and_a_partial_one_is_continued() {
        let path = std::env::temp_dir().join(format!("mt6d-wakeup-{}.sock", std::process::id()));
        let ctl = crate::control::ControlServer::bind(&path).expect("bind");
        let mut w = MainWait::without_signals().expect("wait set");
        w.watch_control(&ctl).expect("watch");
        let mut client = UnixStream::connect(&path).expect("connect");
        // The connection alone wakes the loop; half a request is read and kept.
        client.write_all(b"sta").expect("write");
        let woke = w.wait(LONG).expect("wait");
        assert!(woke.control, "{woke:?}");
        assert!(ctl.next_request().is_none());
        assert!(
            w.wait(Duration::from_millis(1)).expect("wait").timed_out(),
            "nothing new arrived: the partial request does not keep the loop awake"
        );
        client.write_all(b"tus\n").expect("write");
        let woke = w.wait(LONG).expect("wait");
        assert!(woke.control, "{woke:?}");
        let pending = ctl.next_request().expect("the whole request");
        assert_eq!(pending.request, crate::control::Asked::Status);
        pending.reply(&"ok");
        let mut answer = String::new();
        client.read_to_string(&mut answer).expect("answer");
        assert_eq!(answer, "\"ok\"");
    }

    #[test]
    fn a_watched_descriptor_wakes_the_wait() {
        let mut w = MainWait::without_signals().expect("wait set");
        let (mut a, b) = UnixStream::pair().expect("pair");
        w.watch(b.as_raw_fd()).expect("watch");
        a.write_all(b"x").expect("write");
        let woke = w.wait(LONG).expect("wait");
        assert!(woke.descriptor && !woke.thread, "{woke:?}");
    }

    #[test]
    fn deadlines_take_the_earliest_and_never_exceed_the_cap() {
        let now = UnixTime::from_millis(10_000);
        let mut d = Deadlines::from(now);
        assert_eq!(d.wait(), SAFETY_CAP);
        d.at(Some(UnixTime::from_millis(10_300)))
            .at(None)
            .at(Some(UnixTime::from_millis(10_700)));
        assert_eq!(d.wait(), Duration::from_millis(300));
        d.at(Some(UnixTime::from_millis(9_000)));
        assert_eq!(d.wait(), Duration::ZERO, "a deadline passed is due now");
        let mut d = Deadlines::from(now);
        d.at(Some(UnixTime::from_millis(60_000)));
        assert_eq!(d.wait(), SAFETY_CAP);
    }
}
