//! Where a [`Link`](super::Link)'s keys go once it hands them out: the one place that applies
//! its key changes (a new sending key, no sending key, every key erased at expiry), so that no
//! driver applies them in its own way.
//!
//! A driver gives [`Link::poll_event`](super::Link::poll_event) a [`KeyStore`]; the link applies
//! its key changes to that store before it returns the next [`Event`](super::Event), and only
//! the events that are the driver's business come back (established, route sets, routes
//! changed, keys erased: already applied, to log or to drop a session).
//!
//! Two stores exist, for the two ways a driver's packet path reaches the keys:
//! - [`Keys`] owns them: the sending key as the packet path uses it, the receive keys and
//!   whether they expired. A driver that seals and opens under the same lock as the link's
//!   (the server's registry, a relay node, the simulator) keeps one per link.
//! - A driver whose packet threads read the sending key without a lock (the gateway publishes
//!   it behind an atomic pointer, one load per packet) and whose receive keys belong to the
//!   thread that opens (erased by that thread at its next train) implements [`KeyStore`] over
//!   its own publication.
//!
//! What it must not do: seal, open, or hold a key the link took back. After expiry the sending
//! key is gone before the driver hears of it, so no packet is sealed under it again.

use std::sync::Arc;

use crate::handshake::ReceiveKeys;
use crate::Sealer;

/// What a driver keeps of a link's keys, however its packet path reaches them. The link calls
/// it from [`Link::poll_event`](super::Link::poll_event), in the order the changes happened.
pub trait KeyStore {
    /// Seal with `key` from now on; None: seal with nothing (the packet path drops and asks for a
    /// handshake). A key handed out earlier must not be used once this returns.
    fn publish_send(&mut self, key: Option<Arc<Sealer>>);

    /// No rekey succeeded for `REJECT_AFTER_REKEYS` intervals: erase every receive key
    /// ([`ReceiveKeys::clear`]) before another packet is opened. [`KeyStore::publish_send`]`(None)`
    /// came just before.
    fn erase_receive_keys(&mut self);
}

/// A link's keys held by its driver: see the module documentation.
#[derive(Debug, Default)]
pub struct Keys {
    send: Option<Arc<Sealer>>,
    recv: ReceiveKeys,
    expired: bool,
}

impl Keys {
    /// No keys yet: a handshake link before its first handshake.
    pub fn new() -> Keys {
        Keys::default()
    }

    /// A pre-shared key's: its sealer and its one receive key, for good (a pre-shared link hands
    /// out no keys and never expires).
    pub fn pre_shared(send: Arc<Sealer>, recv: ReceiveKeys) -> Keys {
        Keys {
            send: Some(send),
            recv,
            expired: false,
        }
    }

    /// The sending key, as the packet path must use it (None: drop and ask for a handshake).
    pub fn send(&self) -> Option<&Arc<Sealer>> {
        self.send.as_ref()
    }

    /// The receive keys, for opening and for [`Link::handle_handshake`](super::Link::handle_handshake).
    pub fn recv(&self) -> &ReceiveKeys {
        &self.recv
    }

    /// The receive keys, mutably (opening moves replay windows; a handshake installs keys).
    pub fn recv_mut(&mut self) -> &mut ReceiveKeys {
        &mut self.recv
    }

    /// The keys expired without a rekey and no handshake has succeeded since.
    pub fn expired(&self) -> bool {
        self.expired
    }
}

impl KeyStore for Keys {
    fn publish_send(&mut self, key: Option<Arc<Sealer>>) {
        if key.is_some() {
            self.expired = false;
        }
        self.send = key;
    }

    fn erase_receive_keys(&mut self) {
        self.recv.clear();
        self.send = None;
        self.expired = true;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::handshake::tests::configs;
    use crate::handshake::{Handshake, HandshakeConfig, Psk};
    use crate::link::{Event, Link, Transmit, TransmitKind};
    use crate::route_sets::RouteSet;
    use crate::testutil::udp;
    use crate::{Endpoint, OpenError, Route, Stream, StreamConfig, UnixTime};

    fn link(cfg: HandshakeConfig) -> Link {
        let hs = Handshake::new(cfg.clone()).unwrap();
        let mut sc = StreamConfig::new(
            Endpoint::new(cfg.local_true),
            Endpoint::new(cfg.remote_true),
            hs.link_key().clone(),
        );
        sc.rotation = Duration::from_secs(2);
        Link::with_handshake(Stream::new(sc).unwrap(), hs)
    }

    fn at(ms: u64) -> UnixTime {
        UnixTime::from_millis(1_800_000_000_000 + ms)
    }

    /// One side: its link and the holder of its keys, drained as a driver drains.
    struct Side {
        link: Link,
        keys: Keys,
        /// The events the holder left to the driver, in order.
        events: Vec<Event>,
        /// Makes every handshake message's randomness fresh (a repeated ephemeral is a replay).
        draws: u8,
    }

    impl Side {
        fn new(cfg: HandshakeConfig) -> Side {
            Side {
                link: link(cfg),
                keys: Keys::new(),
                events: Vec::new(),
                draws: 0,
            }
        }

        fn entropy(&mut self) -> [u8; 32] {
            self.draws += 1;
            let mut e = [self.draws; 32];
            e[0] = self.link.stream().local_true().octets()[15];
            e
        }

        fn drain(&mut self) -> Vec<Transmit> {
            while let Some(e) = self.link.poll_event(&mut self.keys) {
                self.events.push(e);
            }
            std::iter::from_fn(|| self.link.poll_transmit()).collect()
        }

        fn arrival(&self, now: UnixTime, t: &Transmit) -> (Arc<RouteSet>, Route) {
            self.link
                .select(now)
                .bound
                .iter()
                .find_map(|b| {
                    Link::schedule_of(&b.set, now)
                        .accept
                        .into_iter()
                        .find(|r| r.local == t.dst && r.remote == t.src)
                        .map(|r| (b.set.clone(), r))
                })
                .unwrap()
        }

        /// A datagram arrives: a handshake message goes to the link, anything else is opened
        /// under the held receive keys (a confirmation goes to the link).
        fn receive(&mut self, now: UnixTime, t: &Transmit) -> Result<(), OpenError> {
            let (set, route) = self.arrival(now, t);
            let mut bytes = t.bytes.clone();
            crate::classify::receive(set.stream.recv_header_key(), &mut bytes).unwrap();
            if t.kind == TransmitKind::Notice {
                return Ok(());
            }
            if matches!(t.kind, TransmitKind::Initiation | TransmitKind::Response) {
                let e = self.entropy();
                self.link
                    .handle_handshake(now, &set, &route, &bytes, self.keys.recv_mut(), || Some(e))
                    .unwrap();
                return Ok(());
            }
            let mut out = [0u8; 256];
            let opened = self.keys.recv_mut().open(now, &route, &bytes, &mut out)?;
            if let Some(phase) = opened.confirmed {
                self.link.handle_confirmed(now, phase, opened.confirmed_key);
            }
            Ok(())
        }

        /// Seals one data packet with the held sending key, header protection applied.
        fn send_data(&mut self, now: UnixTime) -> Option<Transmit> {
            let sealer = self.keys.send()?.clone();
            let set = self
                .link
                .sets()
                .send_set(self.link.stream().epoch_at(now))
                .clone();
            let route = Link::schedule_of(&set, now).send;
            let s = self.link.stream();
            let inner = udp(s.local_true(), s.remote_true(), &[9; 40]);
            let mut out = vec![0u8; 256];
            let n = sealer
                .seal_protected(&route, set.stream.send_header_key(), &inner, &mut out)
                .unwrap();
            out.truncate(n);
            Some(Transmit {
                src: route.local,
                dst: route.remote,
                set: set.id,
                kind: TransmitKind::Keepalive,
                bytes: out,
            })
        }

        fn established(&self) -> usize {
            self.events
                .iter()
                .filter(|e| matches!(e, Event::Established { .. }))
                .count()
        }
    }

    /// A initiates at `t0`, B answers, A completes and its keepalive makes B confirm.
    fn handshake(a: &mut Side, b: &mut Side, t0: u64) {
        let e = a.entropy();
        a.link.handle_timeout(at(t0), || Some(e));
        let init = a.drain();
        let init = init
            .iter()
            .find(|t| t.kind == TransmitKind::Initiation)
            .unwrap();
        b.receive(at(t0 + 5), init).unwrap();
        let resp = b.drain();
        let resp = resp
            .iter()
            .find(|t| t.kind == TransmitKind::Response)
            .unwrap();
        a.receive(at(t0 + 10), resp).unwrap();
        for t in a.drain() {
            b.receive(at(t0 + 15), &t).unwrap();
        }
        b.drain();
    }

    fn pair() -> (Side, Side) {
        let (ca, cb) = configs(Psk::from_bytes([1; 32]));
        (Side::new(ca), Side::new(cb))
    }

    #[test]
    fn a_completed_handshake_gives_both_holders_the_keys_the_link_handed_out() {
        let (mut a, mut b) = pair();
        assert!(a.keys.send().is_none() && b.keys.send().is_none());
        a.link.handle_timeout(at(0), || Some([1; 32]));
        let init = a.drain().remove(0);
        b.receive(at(5), &init).unwrap();
        let resp = b.drain();
        // The responder holds no sending key until the initiator's first packet opens.
        assert!(b.keys.send().is_none());
        assert_eq!(b.established(), 0);
        a.receive(at(10), &resp[0]).unwrap();
        let ka = a.drain();
        assert!(Arc::ptr_eq(
            a.keys.send().unwrap(),
            a.link.send_key().unwrap()
        ));
        assert_eq!(a.established(), 1);
        b.receive(at(15), &ka[0]).unwrap();
        b.drain();
        assert!(Arc::ptr_eq(
            b.keys.send().unwrap(),
            b.link.send_key().unwrap()
        ));
        assert!(b.events.iter().any(|e| matches!(
            e,
            Event::Established {
                initiator: false,
                rekey: false,
                ..
            }
        )));
        // Data sealed under the held key opens under the other holder's receive keys.
        let d = a.send_data(at(20)).unwrap();
        b.receive(at(20), &d).unwrap();
        let d = b.send_data(at(21)).unwrap();
        a.receive(at(21), &d).unwrap();
        assert!(!a.keys.expired() && !b.keys.expired());
    }

    #[test]
    fn a_rekey_replaces_the_held_sending_key_and_both_directions_keep_working() {
        let (mut a, mut b) = pair();
        handshake(&mut a, &mut b, 0);
        let (old_a, old_b) = (
            a.keys.send().unwrap().clone(),
            b.keys.send().unwrap().clone(),
        );
        // A rekey well inside the keys' life (rekey every 120 s).
        handshake(&mut a, &mut b, 130_000);
        assert!(!Arc::ptr_eq(a.keys.send().unwrap(), &old_a));
        assert!(!Arc::ptr_eq(b.keys.send().unwrap(), &old_b));
        assert_ne!(a.keys.send().unwrap().key_id(), old_a.key_id());
        assert!(a
            .events
            .iter()
            .any(|e| matches!(e, Event::Established { rekey: true, .. })));
        let d = a.send_data(at(130_100)).unwrap();
        b.receive(at(130_100), &d).unwrap();
        let d = b.send_data(at(130_101)).unwrap();
        a.receive(at(130_101), &d).unwrap();
    }

    #[test]
    fn expiry_erases_every_held_key_before_the_driver_hears_of_it() {
        let (mut a, mut b) = pair();
        handshake(&mut a, &mut b, 0);
        let stale = a.keys.send().unwrap().clone();
        // A packet of the peer's that arrives only after the expiry, read off the wire now.
        let late = b.send_data(at(20)).unwrap();
        let (set, route) = a.arrival(at(20), &late);
        let mut late = late.bytes;
        set.stream
            .recv_header_key()
            .unwrap()
            .unprotect(&mut late)
            .unwrap();
        a.events.clear();
        // Rekey every 120 s, keys rejected after 3: past that, with no rekey answered.
        let expiry = at(15 + 360_000 + 1);
        a.link.handle_timeout(expiry, || None);
        while let Some(e) = a.link.poll_event(&mut a.keys) {
            // The first event the driver sees already finds the keys gone.
            assert!(a.keys.send().is_none(), "{e:?} with a sending key held");
            assert!(a.keys.expired());
            a.events.push(e);
        }
        assert!(a.events.iter().any(|e| matches!(e, Event::KeysErased)));
        assert!(a.events.iter().any(|e| matches!(e, Event::RoutesChanged)));
        // A stale key after expiry is never used to send, and nothing opens any more.
        assert!(a.send_data(expiry).is_none());
        assert_eq!(a.keys.recv().newest_packets_seen(), 0);
        let mut out = [0u8; 256];
        assert!(a
            .keys
            .recv_mut()
            .open(expiry, &route, &late, &mut out)
            .is_err());
        // The stale key itself lives on only where a caller cloned it; the holder gave it up.
        assert_eq!(
            Arc::strong_count(&stale),
            1 + usize::from(a.link.send_key().is_some())
        );
    }

    #[test]
    fn a_handshake_after_expiry_clears_it_and_sends_under_the_new_key_only() {
        let (mut a, mut b) = pair();
        handshake(&mut a, &mut b, 0);
        let stale = a.keys.send().unwrap().key_id();
        let expiry = 15 + 360_000 + 1;
        a.link.handle_timeout(at(expiry), || None);
        a.drain();
        b.link.handle_timeout(at(expiry), || None);
        b.drain();
        assert!(a.keys.expired() && b.keys.expired());
        handshake(&mut a, &mut b, expiry + 1_000);
        assert!(!a.keys.expired() && !b.keys.expired());
        assert_ne!(a.keys.send().unwrap().key_id(), stale);
        let d = a.send_data(at(expiry + 1_100)).unwrap();
        b.receive(at(expiry + 1_100), &d).unwrap();
    }

    #[test]
    fn a_store_hears_the_key_changes_in_the_order_they_happened() {
        #[derive(Default)]
        struct Log(Vec<&'static str>);
        impl KeyStore for Log {
            fn publish_send(&mut self, key: Option<Arc<Sealer>>) {
                self.0.push(if key.is_some() { "send" } else { "none" });
            }
            fn erase_receive_keys(&mut self) {
                self.0.push("erase");
            }
        }
        let (mut a, mut b) = pair();
        handshake(&mut a, &mut b, 0);
        let mut log = Log::default();
        handshake(&mut a, &mut b, 130_000);
        a.link.handle_timeout(at(130_015 + 360_001), || None);
        let mut events = Vec::new();
        while let Some(e) = a.link.poll_event(&mut log) {
            events.push(e);
        }
        // The rekey's key went to the holder above; here only the expiry.
        assert_eq!(log.0, ["none", "erase"], "{events:?}");
    }
}
