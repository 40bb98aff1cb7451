//! The gateway's main thread once the packet threads run: it sleeps until its earliest
//! deadline (the rotation's boundary, a drawn priming, announcement or duplicate address probe
//! instant, a peer's link timer, the next liveness look, the next metrics snapshot, a control
//! request's time limit, an interface's exit delay) or until something happens: a signal, a
//! control request or its next bytes, a link event, a neighbour discovery frame, a worker's
//! [`super::link_timers::Attention`] flag, a packet thread's end (`daemon::wakeup`). Then it
//! does one turn: it reads the signals and the control socket (one request at a time, a change
//! applied before the next is read), follows the interfaces, rotates when the boundary passed,
//! sends the control messages that are due, visits the links that are due or flagged by a
//! worker, notes liveness, publishes the metrics snapshot and checks that no packet thread
//! stopped. Every duty runs at every turn, whatever woke it, in that order.

use std::time::{Duration, Instant};

use mt6d_proto::UnixTime;

use super::link_timers::LinkTimers;
use super::liveness::Liveness;
use super::path::PathState;
use super::polls::Polls;
use super::rotation::Rotator;
use super::shared::Shared;
use super::system::System;
use super::{collision, kernel_drops, links, reload, session, DropReport, GatewayError};
use crate::control::{Asked, ChangeAnswer, ControlServer, Request};
use crate::daemon::wakeup::{Deadlines, MainWait};
use crate::daemon::{clock, signals};

/// How often the metrics thread's snapshot is refreshed: fresh enough for any scrape interval,
/// and nothing measurable for the main thread.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// What the main thread serves with, borrowed for the whole run.
pub struct Env<'a> {
    pub control: &'a ControlServer,
    pub signals: &'a signals::Signals,
    pub polls: &'a Polls,
    pub shared: &'a Shared,
    pub path: &'a PathState,
    pub started: Instant,
    pub metrics: Option<&'a crate::metrics::MetricsServer>,
    pub published: &'a crate::metrics::Published,
    pub tun_index: u32,
}

/// The packet threads the main thread watches: if one ends, the daemon stops (each holds a
/// guard that wakes the main thread when it ends, `daemon::wakeup::Nudge::on_drop`).
pub struct Threads<'a, 'scope> {
    pub workers: &'a [std::thread::ScopedJoinHandle<'scope, ()>],
    pub icmp: &'a std::thread::ScopedJoinHandle<'scope, ()>,
    pub router: Option<&'a std::thread::ScopedJoinHandle<'scope, ()>>,
}

impl Threads<'_, '_> {
    /// Why the daemon must stop, if a packet thread ended.
    fn stopped(&self) -> Option<GatewayError> {
        if let Some(i) = self
            .workers
            .iter()
            .position(std::thread::ScopedJoinHandle::is_finished)
        {
            return Some(GatewayError::Setup(format!(
                "data-plane worker {i} stopped; see the error above"
            )));
        }
        if self.icmp.is_finished() || self.router.is_some_and(|r| r.is_finished()) {
            return Some(GatewayError::Setup(
                "a packet thread stopped; see the error above".into(),
            ));
        }
        None
    }
}

/// The main thread's state between turns.
pub struct Housekeeping<'a> {
    /// The running configuration: SIGHUP and the control socket replace its peers (never its
    /// [gateway] section).
    live: reload::Live,
    env: Env<'a>,
    sys: &'a mut System,
    published_at: Option<Instant>,
    link_timers: LinkTimers,
    due: Vec<usize>,
    next_rotation: UnixTime,
    drops: DropReport,
    kernel_report: kernel_drops::KernelDropReport,
    liveness: Liveness,
    links: links::InterfaceWatch,
    own_key: Option<String>,
    /// What the main thread sleeps on between turns.
    wait: MainWait,
}

impl<'a> Housekeeping<'a> {
    pub fn new(
        live: reload::Live,
        env: Env<'a>,
        sys: &'a mut System,
        wait: MainWait,
    ) -> Housekeeping<'a> {
        let gw = &live.cfg.gateway;
        let mut watched = vec![(
            "external",
            gw.external_interface.as_str(),
            sys.external_index,
        )];
        if let Some(internal) = gw.internal_interface() {
            watched.push(("internal", internal, sys.internal_index));
        }
        let links = links::InterfaceWatch::new(&watched, gw.interface_down_exit);
        let own_key = super::own_public_key(&live.cfg);
        Housekeeping {
            live,
            env,
            sys,
            published_at: None,
            link_timers: LinkTimers::default(),
            due: Vec::new(),
            next_rotation: UnixTime::from_nanos(0),
            drops: DropReport::default(),
            kernel_report: kernel_drops::KernelDropReport::default(),
            liveness: Liveness::default(),
            links,
            own_key,
            wait,
        }
    }

    /// Turns until a stop signal, a packet thread's end or an interface's exit verdict.
    pub fn run(
        mut self,
        rotator: &mut Rotator,
        threads: &Threads<'_, '_>,
    ) -> Result<(), GatewayError> {
        self.next_rotation = rotator.next_change();
        // The link events and the neighbour discovery capture are read on this thread.
        for fd in [self.links.events_fd(), rotator.watch_fd()]
            .into_iter()
            .flatten()
        {
            self.wait
                .watch(fd)
                .map_err(|e| GatewayError::Setup(e.to_string()))?;
        }
        let shared = self.env.shared;
        while !self.env.signals.stop_requested()
            && !shared.shutdown.load(std::sync::atomic::Ordering::Relaxed)
        {
            self.turn(rotator)?;
            if let Some(e) = threads.stopped() {
                return Err(e);
            }
            let timeout = self.deadlines(rotator);
            self.wait.wait(timeout).map_err(|source| GatewayError::Os {
                what: "wait for the main thread's next deadline".into(),
                source,
            })?;
        }
        Ok(())
    }

    /// How long to sleep: until the earliest deadline of any duty of [`Housekeeping::turn`]
    /// (at most `daemon::wakeup::SAFETY_CAP`); what has none (signals, control requests, link
    /// events, frames, the workers' flags) wakes the wait by itself.
    fn deadlines(&self, rotator: &Rotator) -> Duration {
        let mut d = Deadlines::from(clock::now());
        d.at(Some(self.next_rotation))
            .at(self.link_timers.next_due())
            .at(rotator.next_control_due())
            .at(rotator.next_watch_due())
            .at(self.liveness.next_look())
            .instant(self.links.next_exit())
            .instant(self.env.control.next_deadline());
        if self.env.metrics.is_some() {
            d.instant(self.published_at.map(|t| t + PUBLISH_EVERY));
        }
        d.wait()
    }

    /// One turn of the main thread.
    fn turn(&mut self, rotator: &mut Rotator) -> Result<(), GatewayError> {
        if self.requests(rotator) {
            self.own_key = super::own_public_key(&self.live.cfg);
            // The new set's next boundary may come before the old set's.
            self.next_rotation = rotator.next_change();
        }
        let now = clock::now();
        self.follow_interfaces(rotator, now)?;
        self.rotate_if_due(rotator, now);
        let shared = self.env.shared;
        // Priming solicitations and link-layer announcements, each at its drawn instant
        // (docs/PROTOCOL.md §5.6).
        rotator.prime_due(&mut self.sys.netlink, now);
        rotator.announce_due(&shared.table.load(), now);
        // Address collisions (docs/PROTOCOL.md §5.2): ours seen on the link, and moves the
        // peer announced; either rebuilds the table at once, well within the interval.
        let found = rotator.poll_collisions(now);
        collision::apply_collisions(shared, &found, now);
        // A route moved (a collision here or the peer's notice), a handshake bound a new
        // session route set, a parent set was released (docs/PROTOCOL.md §5.2, §9.8): bind and
        // publish now, well within the interval and before any activation epoch.
        if self.visit_links(rotator, now) {
            if let Err(e) = rotator.step(&mut self.sys.netlink, self.env.polls, shared, now) {
                log::error!("rebinding after a route change: {e}");
            }
        }
        self.liveness.tick(shared, self.own_key.as_deref(), now);
        self.publish_metrics(rotator);
        Ok(())
    }

    /// SIGHUP, then the control requests, one at a time: a change is applied before the next
    /// is read. Whether the peer set changed.
    fn requests(&mut self, rotator: &mut Rotator) -> bool {
        let mut changed = false;
        if self.env.signals.take_reload() {
            changed |=
                reload::reload_file(self.running(rotator), "SIGHUP").is_ok_and(|p| !p.is_empty());
        }
        while let Some(pending) = self.env.control.next_request() {
            let outcome = match &pending.request {
                Asked::Status => {
                    let st = self.full_status(rotator);
                    pending.reply(&st);
                    continue;
                }
                Asked::Unknown(why) => Err(why.clone()),
                Asked::Change(Request::Reload) => {
                    reload::reload_file(self.running(rotator), "reload (control socket)")
                        .map_err(|e| e.to_string())
                }
                Asked::Change(Request::Peers { edits }) => {
                    reload::edit(self.running(rotator), edits, "peer change (control socket)")
                        .map_err(|e| e.to_string())
                }
            };
            let answer = match outcome {
                Ok(plan) => {
                    changed |= !plan.is_empty();
                    ChangeAnswer {
                        added: plan.added,
                        removed: plan.removed,
                        changed: plan.changed,
                        error: None,
                    }
                }
                Err(e) => ChangeAnswer {
                    error: Some(format!("refused, nothing changed: {e}")),
                    ..ChangeAnswer::default()
                },
            };
            pending.reply(&answer);
        }
        changed
    }

    fn running<'r>(&'r mut self, rotator: &'r mut Rotator) -> reload::Running<'r> {
        reload::Running {
            live: &mut self.live,
            sys: &mut *self.sys,
            rotator,
            polls: self.env.polls,
            shared: self.env.shared,
        }
    }

    /// The status `mt6d status` and the metrics show, with the kernel's queue drops now.
    fn full_status(&mut self, rotator: &Rotator) -> crate::status::Status {
        let env = &self.env;
        let kernel = kernel_drops::read(env.shared, &mut self.sys.netlink, env.tun_index);
        super::full_status(
            &self.live.cfg,
            env.shared,
            env.path,
            env.started,
            rotator,
            &self.links,
            &self.liveness,
            kernel,
        )
    }

    /// The interfaces' link events: an interface back up is used again at once, one gone for
    /// too long (or recreated) stops the daemon.
    fn follow_interfaces(
        &mut self,
        rotator: &mut Rotator,
        now: UnixTime,
    ) -> Result<(), GatewayError> {
        match self.links.tick(&mut self.sys.netlink) {
            links::Verdict::Carry => Ok(()),
            links::Verdict::Rebind => {
                // Down flushed the hashed addresses and the routes on the interface.
                if let Err(e) = self.sys.reroute_external(&self.live.cfg) {
                    log::error!("after the interface came back: {e}");
                }
                rotator.forget_addresses();
                self.next_rotation = now;
                Ok(())
            }
            links::Verdict::Exit(why) => Err(GatewayError::Setup(why)),
        }
    }

    /// The rotation step at the boundary, then the drops since the last one.
    fn rotate_if_due(&mut self, rotator: &mut Rotator, now: UnixTime) {
        if now < self.next_rotation {
            return;
        }
        let env = &self.env;
        if let Err(e) = rotator.step(&mut self.sys.netlink, env.polls, env.shared, now) {
            // A failed rotation (e.g. the external interface vanished) leaves the old routes
            // in place; retry shortly rather than stop carrying traffic.
            log::error!("rotation: {e}; retrying in 1 s");
            self.next_rotation = UnixTime::from_nanos(now.as_nanos() + 1_000_000_000);
        } else {
            self.next_rotation = rotator.next_change();
            let kernel = kernel_drops::read(env.shared, &mut self.sys.netlink, env.tun_index);
            self.drops
                .report(env.shared, self.kernel_report.rose(kernel));
            rotator.report_watch();
        }
    }

    /// The peers whose link is due or was flagged, and only those: handshakes, key expiry,
    /// route-set housekeeping, notices (docs/ARCHITECTURE.md, "The endpoint contract").
    /// Whether a peer's routes changed.
    fn visit_links(&mut self, rotator: &mut Rotator, now: UnixTime) -> bool {
        let shared = self.env.shared;
        let table = shared.table.load();
        self.link_timers
            .due(&table, &shared.attention, now, &mut self.due);
        let mut routes_changed = false;
        for &i in &self.due {
            let (next, changed) = session::tick(&table.peers[i].peer, &table, now);
            self.link_timers.schedule(i, next);
            if changed {
                rotator.routes_changed(i);
                routes_changed = true;
            }
        }
        routes_changed
    }

    /// The metrics thread serves the newest snapshot, refreshed every [`PUBLISH_EVERY`].
    fn publish_metrics(&mut self, rotator: &Rotator) {
        if self.env.metrics.is_none()
            || self
                .published_at
                .is_some_and(|t| t.elapsed() < PUBLISH_EVERY)
        {
            return;
        }
        let st = self.full_status(rotator);
        self.env.published.store(Some(std::sync::Arc::new(
            crate::status::AnyStatus::Gateway(Box::new(st)),
        )));
        self.published_at = Some(Instant::now());
    }
}
