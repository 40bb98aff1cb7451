//! One peer's whole state machine (`mt6d_proto::link::Link`) under a schedule the fuzzer writes:
//! two links exchange their genuine datagrams (delivered, dropped, duplicated or delayed at the
//! fuzzer's choice), time advances by fuzzer-chosen steps, and fuzzer bytes arrive as handshake
//! messages and notices on any bound route, raw or unmasked, with forged confirmations and
//! packet-path flags mixed in. Must never panic, and a timeout must never leave work due at the
//! same instant (a driver sleeping until `poll_timeout` would spin).
#![no_main]

use std::sync::Arc;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use mt6d_proto::handshake::{Handshake, HandshakeConfig, PrivateKey, Psk, ReceiveKeys};
use mt6d_proto::link::{KeyStore, Link, Transmit};
use mt6d_proto::moves::{is_notice, Evidence};
use mt6d_proto::route_sets::RouteSet;
use mt6d_proto::{AeadAlg, Endpoint, Epoch, KeyPhase, Mode, Route, Stream, StreamConfig, UnixTime};

fn link(own: &PrivateKey, peer: &PrivateKey, local: &str, remote: &str) -> Link {
    let cfg = HandshakeConfig {
        local_private: own.clone(),
        remote_public: peer.public_key(),
        psk: Psk::none(),
        mode: Mode::Encrypt,
        aead: AeadAlg::Aes256Gcm,
        local_true: local.parse().unwrap(),
        remote_true: remote.parse().unwrap(),
        rekey_after: Duration::from_secs(2),
        rekey_after_packets: 1 << 40,
    };
    let hs = Handshake::new(cfg.clone()).unwrap();
    let mut sc = StreamConfig::new(
        Endpoint::new(cfg.local_true),
        Endpoint::new(cfg.remote_true),
        hs.link_key().clone(),
    );
    sc.rotation = Duration::from_secs(1);
    Link::with_handshake(Stream::new(sc).unwrap(), hs)
}

/// The bound set and accept route of `l` a datagram from `src` to `dst` arrives on.
fn arrival(l: &Link, now: UnixTime, t: &Transmit) -> Option<(Arc<RouteSet>, Route)> {
    l.select(now).bound.iter().find_map(|b| {
        Link::schedule_of(&b.set, now)
            .accept
            .into_iter()
            .find(|r| r.local == t.dst && r.remote == t.src)
            .map(|r| (b.set.clone(), r))
    })
}

/// The link's key changes applied to the side's receive keys (the sending key is not used here).
struct Recv<'a>(&'a mut ReceiveKeys);

impl KeyStore for Recv<'_> {
    fn publish_send(&mut self, _key: Option<std::sync::Arc<mt6d_proto::Sealer>>) {}

    fn erase_receive_keys(&mut self) {
        self.0.clear();
    }
}

fn deliver(l: &mut Link, recv: &mut ReceiveKeys, now: UnixTime, t: &Transmit, e: [u8; 32]) {
    let Some((set, route)) = arrival(l, now, t) else {
        return;
    };
    let mut bytes = t.bytes.clone();
    if set
        .stream
        .recv_header_key()
        .unwrap()
        .unprotect(&mut bytes)
        .is_err()
    {
        return;
    }
    if is_notice(&bytes) {
        let _ = l.handle_notice(now, &set, &route, &bytes);
    } else if mt6d_proto::handshake::is_handshake(&bytes) {
        let _ = l.handle_handshake(now, &set, &route, &bytes, recv, || Some(e));
    } else {
        let mut out = [0u8; 128];
        if let Ok(opened) = recv.open(now, &route, &bytes, &mut out) {
            set.opened_on(route.epoch);
            if let Some(phase) = opened.confirmed {
                l.handle_confirmed(now, phase, opened.confirmed_key);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (ka, kb) = (PrivateKey::generate([1; 32]), PrivateKey::generate([2; 32]));
    let mut links = [
        link(&ka, &kb, "2001:db8:a::1", "2001:db8:b::2"),
        link(&kb, &ka, "2001:db8:b::2", "2001:db8:a::1"),
    ];
    let mut recv = [ReceiveKeys::new(), ReceiveKeys::new()];
    let mut wire: Vec<(usize, Transmit)> = Vec::new();
    let mut ms: u64 = 1_800_000_000_000;
    let mut counter = 0u8;
    let mut ops = data.chunks(3);
    for _ in 0..256 {
        let Some(op) = ops.next() else {
            break;
        };
        let (kind, arg) = (op[0], op.get(1).copied().unwrap_or(0));
        let side = usize::from(kind & 1);
        let now = UnixTime::from_millis(ms);
        counter = counter.wrapping_add(1);
        let e = [counter; 32];
        match kind >> 1 {
            // Time passes, then the side's timeout if due.
            0..=19 => {
                ms += u64::from(arg) * 37;
                let now = UnixTime::from_millis(ms);
                if links[side].poll_timeout().is_some_and(|t| t <= now) {
                    links[side].handle_timeout(now, || Some(e));
                    let next = links[side].poll_timeout();
                    assert!(next.is_none_or(|t| t > now), "{next:?} due at {now:?}");
                }
            }
            // The oldest genuine datagram in flight: delivered, duplicated or lost.
            20..=59 => {
                if let Some(i) = wire.iter().position(|(to, _)| *to == side) {
                    let (to, t) = wire.remove(i);
                    match arg % 8 {
                        0 => {}
                        1 => {
                            deliver(&mut links[to], &mut recv[to], now, &t, e);
                            deliver(&mut links[to], &mut recv[to], now, &t, e);
                        }
                        _ => deliver(&mut links[to], &mut recv[to], now, &t, e),
                    }
                }
            }
            // Fuzzer bytes as a handshake message or notice on a bound route of the side.
            60..=89 => {
                let body = op.get(2..).unwrap_or(&[]);
                let rest: Vec<u8> = std::iter::once(arg)
                    .chain(body.iter().copied())
                    .chain(data.iter().copied().take(usize::from(arg)))
                    .collect();
                let selection = links[side].select(now);
                let b = &selection.bound[usize::from(arg) % selection.bound.len()];
                let route = Link::schedule_of(&b.set, now).accept[usize::from(arg) % 3];
                let set = b.set.clone();
                let l = &mut links[side];
                if kind & 2 == 0 {
                    let _ =
                        l.handle_handshake(now, &set, &route, &rest, &mut recv[side], || Some(e));
                } else {
                    let _ = l.handle_notice(now, &set, &route, &rest);
                }
            }
            // Packet-path reports, forged or not.
            90..=99 => links[side].handle_no_send_key(),
            100..=109 => {
                let _ = links[side].handle_empty_slot(now);
            }
            110..=119 => {
                let phase = if arg & 1 == 0 {
                    KeyPhase::Zero
                } else {
                    KeyPhase::One
                };
                links[side].handle_confirmed(now, phase, Some(u64::from(arg)));
            }
            // A collision on one of the side's routes.
            _ => {
                let selection = links[side].select(now);
                let set = selection.bound[usize::from(arg) % selection.bound.len()]
                    .set
                    .clone();
                let epoch = Epoch(links[side].stream().epoch_at(now).0 + u64::from(arg % 3) - 1);
                let ev = if arg & 4 == 0 {
                    Evidence::Confirmed
                } else {
                    Evidence::Unconfirmed
                };
                let _ = links[side].handle_collision(now, &set, epoch, arg % 4, ev);
            }
        }
        for (i, l) in links.iter_mut().enumerate() {
            while l.poll_event(&mut Recv(&mut recv[i])).is_some() {}
            while let Some(t) = l.poll_transmit() {
                if wire.len() < 64 {
                    wire.push((1 - i, t));
                }
            }
        }
    }
});
