//! The receive half of a server worker: a batch from the transparent socket, each datagram
//! matched to its client and epoch by the (hashed address, port) it was sent to, its source
//! checked, header protection removed and its class read (`mt6d_proto::classify`), then by
//! class and by the client's keying: data opened and written to the TUN queue, a route move
//! notice applied, a handshake message answered at once through this worker's raw socket.
//!
//! The registry's read lock is held for the batch; a handshake client's session lock, or a
//! pre-shared client's opener lock, once per received train of that client.

use std::sync::{Arc, MutexGuard};

use mt6d_os::raw_udp::{RawSendMsg, RawSendScratch};
use mt6d_os::udp::RecvBuf;
use mt6d_os::RecvScratch;
use mt6d_proto::classify::{self, Class};
use mt6d_proto::endpoint::PeerId;
use mt6d_proto::handshake::verify_link_mac;
use mt6d_proto::link::Notice;
use mt6d_proto::route_sets::RouteSet;
use mt6d_proto::{OpenError, Opener, Route, Stream, UnixTime};

use super::registry::{bump, Client, Registry, Session};
use super::shared::{drain, set_of, Shared, WorkerIo};
use crate::daemon::clock;
use crate::daemon::worker::{Carried, TunBatch};

/// Buffers in one recvmmsg.
const RX_BATCH: usize = 32;

/// A worker's receive buffers.
pub struct Receive {
    /// For handshake answers and notice acks, sent at once from the receiving worker.
    send_scratch: RawSendScratch,
    scratch: RecvScratch,
    bufs: Vec<RecvBuf>,
    batch: TunBatch,
}

/// What every datagram of a received batch is handled with.
struct Batch<'a> {
    shared: &'a Shared,
    io: &'a WorkerIo,
    reg: &'a Registry,
    now: UnixTime,
}

/// Whom a received train (one buffer: one source, one destination) is from.
struct Sender<'a> {
    /// The table entry the destination named.
    id: PeerId,
    /// The client's own id.
    cid: PeerId,
    client: &'a Client,
    stream: &'a Stream,
    route: &'a Route,
    /// The route set the entry stands for (0: the client's link set or stream).
    set_id: u64,
}

impl Receive {
    pub fn new(tun_mtu: usize) -> Receive {
        Receive {
            send_scratch: RawSendScratch::new(1),
            scratch: RecvScratch::new(RX_BATCH),
            bufs: (0..RX_BATCH).map(|_| RecvBuf::new()).collect(),
            batch: TunBatch::new(tun_mtu + 64),
        }
    }

    /// Reads what the transparent socket holds (one recvmmsg) and handles every datagram.
    /// Returns the packets delivered to the TUN queue and their bytes.
    pub fn on_readable(&mut self, shared: &Shared, io: &WorkerIo) -> Carried {
        let got = match io.socket.recv_ready(&mut self.scratch, &mut self.bufs) {
            Ok(n) => n,
            Err(e) if e.is_would_block() => return Carried::NOTHING,
            Err(e) => {
                log::debug!("{e}");
                return Carried::NOTHING;
            }
        };
        let overflowed = io.socket.take_queue_drops();
        if overflowed > 0 {
            bump(&shared.counters.socket_queue_drops, overflowed);
        }
        let mut n = RxCounts::default();
        let reg = shared.registry.read();
        let batch = Batch {
            shared,
            io,
            reg: &reg,
            now: clock::now(),
        };
        for buf in &mut self.bufs[..got] {
            let Some(from) = batch.sender(buf, &mut n) else {
                continue;
            };
            match from.client.session() {
                Some(guard) => batch.session_train(
                    &from,
                    guard,
                    buf,
                    (&mut self.batch, &mut self.send_scratch),
                    &mut n,
                ),
                None => batch.pre_shared_train(
                    &from,
                    buf,
                    (&mut self.batch, &mut self.send_scratch),
                    &mut n,
                ),
            }
        }
        drop(reg);
        self.batch
            .flush(&io.tun, &shared.counters.tun_write_failures);
        n.publish(shared);
        Carried {
            packets: n.packets,
            bytes: n.bytes,
        }
    }
}

impl<'a> Batch<'a> {
    /// The client and epoch a train was sent to, checked against its source; `None` (counted)
    /// for a truncated train, an (address, port) that is no client's current route, or the
    /// wrong source.
    fn sender(&self, buf: &RecvBuf, n: &mut RxCounts) -> Option<Sender<'a>> {
        if buf.truncated() {
            n.truncated += 1;
            return None;
        }
        let count = buf.datagrams().count() as u64;
        let table = self.reg.table();
        let found = table
            .lookup_local(buf.dst(), buf.dst_port())
            .and_then(|(id, epoch)| {
                let route = table.index().route(id, epoch)?;
                let stream = table.stream(id)?;
                let (cid, client, set_id) = self.reg.resolve(id)?;
                Some(Sender {
                    id,
                    cid,
                    client,
                    stream,
                    route,
                    set_id,
                })
            });
        let Some(from) = found else {
            n.not_current += count;
            return None;
        };
        if buf.src() != from.route.remote {
            n.wrong_source += count;
            return None;
        }
        Some(from)
    }

    /// A handshake client's train: its link's keys and route sets, under its session lock.
    fn session_train(
        &self,
        from: &Sender<'_>,
        mut guard: MutexGuard<'_, Option<Box<Session>>>,
        buf: &mut RecvBuf,
        (batch, send_scratch): (&mut TunBatch, &mut RawSendScratch),
        n: &mut RxCounts,
    ) {
        if let Some(s) = guard.as_mut() {
            s.keys.recv_mut().expire(self.now);
        }
        let header_key = from.stream.recv_header_key();
        let mut set: Option<Arc<RouteSet>> = None;
        for datagram in buf.datagrams_mut() {
            let Ok(class) = classify::receive(header_key, datagram) else {
                n.rejected += 1;
                continue;
            };
            let datagram = &*datagram;
            match class {
                Class::Notice | Class::LinkAnnouncement => {
                    self.session_notice(from, &mut guard, &mut set, datagram, send_scratch, n);
                }
                Class::Handshake => {
                    self.session_handshake(from, &mut guard, &mut set, datagram, send_scratch, n);
                }
                Class::Data => {
                    let Some(session) = guard.as_mut() else {
                        n.no_key += 1;
                        continue;
                    };
                    let Some(on) = bound_set(session, &mut set, from.set_id, n) else {
                        continue;
                    };
                    self.session_data(from, session, on, datagram, (batch, send_scratch), n);
                }
            }
        }
    }

    /// A route move (§5.2) on the set it arrived on; the link queues the ack.
    fn session_notice(
        &self,
        from: &Sender<'_>,
        guard: &mut Option<Box<Session>>,
        set: &mut Option<Arc<RouteSet>>,
        datagram: &[u8],
        send_scratch: &mut RawSendScratch,
        n: &mut RxCounts,
    ) {
        let Some(session) = guard.as_mut() else {
            n.unsupported += 1;
            return;
        };
        let Some(on) = bound_set(session, set, from.set_id, n) else {
            return;
        };
        match session
            .link
            .handle_notice(self.now, on, from.route, datagram)
        {
            Ok(Notice::Move { moved }) => {
                n.notices += 1;
                n.moved += u64::from(moved);
            }
            Ok(_) => n.unsupported += 1,
            Err(_) => n.notices_refused += 1,
        }
        self.drain(from, session, send_scratch, n);
    }

    /// A handshake message: no state is made for a client before its link MAC checks (one
    /// BLAKE3); then the client's responder-only link answers it, at once.
    fn session_handshake(
        &self,
        from: &Sender<'_>,
        guard: &mut Option<Box<Session>>,
        set: &mut Option<Arc<RouteSet>>,
        datagram: &[u8],
        send_scratch: &mut RawSendScratch,
        n: &mut RxCounts,
    ) {
        if guard.is_none() {
            if from.set_id != 0 || !verify_link_mac(&from.stream.config().key, from.route, datagram)
            {
                n.hs_rejected += 1;
                return;
            }
            match from.client.new_session(self.reg.handshake(), from.stream) {
                Some(Ok(s)) => {
                    *guard = Some(s);
                    self.reg.note_session();
                }
                Some(Err(e)) => {
                    log::warn!("client {}: no handshake state: {e}", from.client.name);
                    n.hs_rejected += 1;
                    return;
                }
                None => {
                    n.hs_rejected += 1;
                    return;
                }
            }
        }
        let Some(session) = guard.as_mut() else {
            return;
        };
        let Some(on) = bound_set(session, set, from.set_id, n) else {
            return;
        };
        let result = session.link.handle_handshake(
            self.now,
            on,
            from.route,
            datagram,
            session.keys.recv_mut(),
            crate::daemon::entropy::entropy,
        );
        self.drain(from, session, send_scratch, n);
        match result {
            Ok(()) => n.answered += 1,
            Err(e) => {
                log::debug!(
                    "client {}: handshake message refused: {e}",
                    from.client.name
                );
                n.hs_rejected += 1;
            }
        }
    }

    /// A handshake client's data packet or keepalive, opened under its session's keys.
    fn session_data(
        &self,
        from: &Sender<'_>,
        session: &mut Session,
        on: &Arc<RouteSet>,
        datagram: &[u8],
        (batch, send_scratch): (&mut TunBatch, &mut RawSendScratch),
        n: &mut RxCounts,
    ) {
        let failures = &self.shared.counters.tun_write_failures;
        let slot = batch.slot(&self.io.tun, failures);
        match session
            .keys
            .recv_mut()
            .open(self.now, from.route, datagram, slot)
        {
            // After the switch the link set takes handshake messages only (§9.8).
            Ok(_) if on.is_link() && !session.link.sets().takes_data(on) => {
                n.not_current += 1;
            }
            Ok(opened) => {
                on.opened(from.route.epoch, opened.len);
                if let Some(phase) = opened.confirmed {
                    session
                        .link
                        .handle_confirmed(self.now, phase, opened.confirmed_key);
                    n.confirmed += u64::from(self.drain(from, session, send_scratch, n));
                }
                if opened.len > 0 {
                    batch.commit(opened.len);
                    n.packets += 1;
                    n.bytes += opened.len as u64;
                }
            }
            Err(OpenError::NoKey) => n.no_key += 1,
            Err(_) => n.rejected += 1,
        }
    }

    /// Sends what the session's link queued and applies its events; returns whether a
    /// handshake was established.
    fn drain(
        &self,
        from: &Sender<'_>,
        session: &mut Session,
        send_scratch: &mut RawSendScratch,
        n: &mut RxCounts,
    ) -> bool {
        let d = drain(session, Some((&self.io.raw, send_scratch)));
        n.send_failed += d.send_failed;
        if d.resync {
            self.shared.resync(from.cid);
        }
        d.established
    }

    /// A pre-shared client's train, under its opener's lock.
    fn pre_shared_train(
        &self,
        from: &Sender<'_>,
        buf: &mut RecvBuf,
        (batch, send_scratch): (&mut TunBatch, &mut RawSendScratch),
        n: &mut RxCounts,
    ) {
        let header_key = from.stream.recv_header_key();
        from.client.with_opener(from.stream, |opener| {
            for datagram in buf.datagrams_mut() {
                let Ok(class) = classify::receive(header_key, datagram) else {
                    n.rejected += 1;
                    continue;
                };
                match class {
                    Class::Notice => self.pre_shared_notice(from, datagram, send_scratch, n),
                    Class::Handshake | Class::LinkAnnouncement => n.unsupported += 1,
                    Class::Data => self.pre_shared_data(from, opener, datagram, batch, n),
                }
            }
        });
    }

    /// A route move (§5.2): applied here, the client's window re-derived by the main thread,
    /// and answered from this worker once it is.
    fn pre_shared_notice(
        &self,
        from: &Sender<'_>,
        datagram: &[u8],
        send_scratch: &mut RawSendScratch,
        n: &mut RxCounts,
    ) {
        let raw = &self.io.raw;
        let mut failed = 0;
        let mut send = |r: &Route, bytes: &[u8]| {
            let msg = [RawSendMsg {
                src: r.local,
                dst: r.remote,
                payload: bytes,
            }];
            if !matches!(raw.send_batch(send_scratch, &msg), Ok(1)) {
                failed += 1;
            }
        };
        match self
            .reg
            .handle_notice(from.id, self.now, from.route, datagram, &mut send)
        {
            Ok(handled) => {
                n.notices += 1;
                n.moved += u64::from(handled.moved);
                // Once per move: a resend or replay before the main thread synced finds it
                // already asked for.
                if handled.moved && handled.pending {
                    self.shared.resync(from.cid);
                }
            }
            Err(_) => n.notices_refused += 1,
        }
        n.send_failed += failed;
    }

    /// A pre-shared client's data packet or keepalive.
    fn pre_shared_data(
        &self,
        from: &Sender<'_>,
        opener: &mut Opener,
        datagram: &[u8],
        batch: &mut TunBatch,
        n: &mut RxCounts,
    ) {
        let failures = &self.shared.counters.tun_write_failures;
        let slot = batch.slot(&self.io.tun, failures);
        match opener.open(from.route, datagram, slot) {
            // A keepalive: valid, nothing to deliver.
            Ok(0) => {}
            Ok(len) => {
                batch.commit(len);
                n.packets += 1;
                n.bytes += len as u64;
            }
            Err(_) => n.rejected += 1,
        }
    }
}

/// The route set a train arrived on (looked up once per train), or `None` (counted) when it
/// is no longer bound.
fn bound_set<'s>(
    session: &Session,
    set: &'s mut Option<Arc<RouteSet>>,
    set_id: u64,
    n: &mut RxCounts,
) -> Option<&'s Arc<RouteSet>> {
    if set.is_none() {
        *set = set_of(&session.link, set_id);
    }
    if set.is_none() {
        n.not_current += 1;
    }
    set.as_ref()
}

/// What one received batch counted.
#[derive(Debug, Default)]
struct RxCounts {
    packets: u64,
    bytes: u64,
    not_current: u64,
    wrong_source: u64,
    rejected: u64,
    unsupported: u64,
    truncated: u64,
    hs_rejected: u64,
    answered: u64,
    confirmed: u64,
    no_key: u64,
    send_failed: u64,
    notices: u64,
    notices_refused: u64,
    moved: u64,
}

impl RxCounts {
    /// Adds the batch's counts to the workers' counters (one relaxed add per nonzero count).
    fn publish(&self, shared: &Shared) {
        let c = &shared.counters;
        for (counter, v) in [
            (&c.rx_packets, self.packets),
            (&c.rx_bytes, self.bytes),
            (&c.rx_not_current, self.not_current),
            (&c.rx_wrong_source, self.wrong_source),
            (&c.rx_rejected, self.rejected),
            (&c.rx_unsupported, self.unsupported),
            (&c.notices_received, self.notices),
            (&c.notices_refused, self.notices_refused),
            (&c.routes_moved, self.moved),
            (&c.rx_truncated, self.truncated),
            (&c.rx_handshake_rejected, self.hs_rejected),
            (&c.handshakes_answered, self.answered),
            (&c.handshakes_confirmed, self.confirmed),
            (&c.rx_no_key, self.no_key),
            (&c.tx_send_failed, self.send_failed),
        ] {
            if v > 0 {
                bump(counter, v);
            }
        }
    }
}
