//! The interfaces the daemon uses, followed by name through link events
//! ([`mt6d_os::linkwatch`]): deleted, renamed, set down, recreated.
//!
//! Each change of state is logged once, with the interface's name and the kernel's answer, and
//! shown in `mt6d status`. An interface that comes back up with the same index is used again at
//! once (the hashed addresses the kernel flushed on the way down are bound again). One that is
//! missing or down for longer than `interface_down_exit_secs` makes the daemon exit non-zero
//! after its clean-up, and one recreated under a new index makes it exit at once: its routes,
//! neighbour entries and sockets name the old index, and a supervisor's restart (systemd
//! `Restart=on-failure`) rebuilds them all the same way a first start does. Never a zombie that
//! reports `handshake up` while it cannot carry a packet.

use std::time::{Duration, Instant};

use mt6d_os::linkwatch::LinkEvents;
use mt6d_os::Netlink;

use crate::status::InterfaceStatus;

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Up,
    Down,
    /// Gone (deleted or renamed); why, as the kernel said it.
    Missing(String),
    /// A new interface carries the name, with another index.
    Recreated(u32),
}

impl State {
    fn label(&self) -> &'static str {
        match self {
            State::Up => "up",
            State::Down => "down",
            State::Missing(_) | State::Recreated(_) => "missing",
        }
    }
}

#[derive(Debug)]
struct Tracked {
    role: &'static str,
    name: String,
    index: u32,
    state: State,
    since: Instant,
}

/// What the main loop must do after [`InterfaceWatch::tick`].
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Carry,
    /// An interface came back up: bind the hashed addresses again.
    Rebind,
    /// Stop with this reason (non-zero exit).
    Exit(String),
}

/// The watch over the daemon's interfaces.
#[derive(Debug)]
pub struct InterfaceWatch {
    events: Option<LinkEvents>,
    tracked: Vec<Tracked>,
    exit_after: Duration,
}

impl InterfaceWatch {
    /// Follows `interfaces` (role, name, index at start-up).
    pub fn new(interfaces: &[(&'static str, &str, u32)], exit_after: Duration) -> InterfaceWatch {
        let events = match LinkEvents::open() {
            Ok(e) => Some(e),
            Err(e) => {
                log::warn!("{e}; interfaces that disappear are noticed only when an operation on them fails");
                None
            }
        };
        let now = Instant::now();
        InterfaceWatch {
            events,
            tracked: interfaces
                .iter()
                .map(|(role, name, index)| Tracked {
                    role,
                    name: (*name).to_string(),
                    index: *index,
                    state: State::Up,
                    since: now,
                })
                .collect(),
            exit_after,
        }
    }

    /// Drains link events, re-resolves the interfaces they concern by name, logs changes.
    pub fn tick(&mut self, nl: &mut Netlink) -> Verdict {
        let mut concerned = vec![false; self.tracked.len()];
        let mut up_flag: Vec<Option<bool>> = vec![None; self.tracked.len()];
        match self.events.as_mut().map(LinkEvents::poll) {
            Some(Ok(events)) => {
                for ev in events {
                    for (i, t) in self.tracked.iter().enumerate() {
                        if ev.index == t.index || ev.name == t.name {
                            concerned[i] = true;
                            if ev.name == t.name && !ev.deleted {
                                up_flag[i] = Some(ev.up);
                            }
                        }
                    }
                }
            }
            // Events were lost (ENOBUFS): look at everything.
            Some(Err(e)) => {
                log::debug!("{e}");
                concerned.iter_mut().for_each(|c| *c = true);
            }
            None => {}
        }
        let mut verdict = Verdict::Carry;
        for (i, t) in self.tracked.iter_mut().enumerate() {
            if concerned[i] {
                let state = match nl.link_index(&t.name) {
                    Err(e) => State::Missing(e.to_string()),
                    Ok(index) if index != t.index => State::Recreated(index),
                    Ok(_) => match up_flag[i] {
                        Some(false) => State::Down,
                        _ => State::Up,
                    },
                };
                if state != t.state {
                    let was = std::mem::replace(&mut t.state, state);
                    t.since = Instant::now();
                    match &t.state {
                        State::Up => {
                            log::info!(
                                "{} interface {} (#{}) is up again after being {}",
                                t.role,
                                t.name,
                                t.index,
                                was.label()
                            );
                            verdict = Verdict::Rebind;
                        }
                        State::Down => log::warn!(
                            "{} interface {} (#{}) is down; exiting in {} s unless it comes back",
                            t.role,
                            t.name,
                            t.index,
                            self.exit_after.as_secs()
                        ),
                        State::Missing(why) => log::warn!(
                            "{} interface {} (#{}) is gone ({why}); exiting in {} s unless it comes back",
                            t.role,
                            t.name,
                            t.index,
                            self.exit_after.as_secs()
                        ),
                        State::Recreated(_) => {}
                    }
                }
            }
            match &t.state {
                State::Recreated(new) => {
                    return Verdict::Exit(format!(
                        "{} interface {} was recreated (index #{} is now #{new}); exiting so that a restart sets mt6d up on the new one",
                        t.role, t.name, t.index
                    ))
                }
                State::Down | State::Missing(_) if t.since.elapsed() >= self.exit_after => {
                    return Verdict::Exit(format!(
                        "{} interface {} (#{}) has been {} for {} s (interface_down_exit_secs); exiting so that a supervisor restarts mt6d",
                        t.role,
                        t.name,
                        t.index,
                        t.state.label(),
                        self.exit_after.as_secs()
                    ))
                }
                _ => {}
            }
        }
        verdict
    }

    /// The link event socket, readable when events arrived (None: events are not followed).
    pub fn events_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.events.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// When an interface down or missing since earlier reaches `interface_down_exit_secs`,
    /// if one is: a deadline of the main thread's wait.
    pub fn next_exit(&self) -> Option<Instant> {
        self.tracked
            .iter()
            .filter(|t| matches!(t.state, State::Down | State::Missing(_)))
            .map(|t| t.since + self.exit_after)
            .min()
    }

    /// One entry per interface for `mt6d status`.
    pub fn status(&self) -> Vec<InterfaceStatus> {
        self.tracked
            .iter()
            .map(|t| InterfaceStatus {
                role: t.role.to_string(),
                name: t.name.clone(),
                index: t.index,
                state: t.state.label().to_string(),
                since_secs: t.since.elapsed().as_secs(),
            })
            .collect()
    }
}
