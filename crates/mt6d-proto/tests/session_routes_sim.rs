//! A thief of one static key, holding the whole capture of a conversation, against the session
//! route key (docs/PROTOCOL.md §9.8): it computes every
//! link-key route, replays every captured initiation into its own copy of the stolen gateway, and
//! feeds every captured response to it, and still reaches no route of a session whose ephemeral
//! keys it never had. The control runs the same attacker against link-key routes (the link set,
//! and what every route was before route sets), where it finds every route, so the check can fail.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod common;
use common::{handshake_config, ip, A, B, START_MS};

use std::collections::HashSet;
use std::net::SocketAddrV6;

use mt6d_proto::handshake::{link_key, Handshake, HandshakeError, Outcome, PrivateKey, Psk};
use mt6d_proto::{Endpoint, Epoch, SessionKey, Stream, StreamConfig, UnixTime};

/// Epochs of data phase checked per session (R = 10 s: 10 minutes).
const WINDOW: u64 = 60;

/// The stream of side A (role 0) with `key` as its session key: its routes are the §2 derivation.
fn stream(key: SessionKey) -> Stream {
    Stream::new(StreamConfig::new(
        Endpoint::new(ip(A)),
        Endpoint::new(ip(B)),
        key,
    ))
    .unwrap()
}

/// Every hashed address and port of `key` in epochs `from..from + WINDOW`, both endpoints.
fn routes(key: SessionKey, from: Epoch) -> HashSet<SocketAddrV6> {
    let s = stream(key);
    (from.0..from.0 + WINDOW)
        .flat_map(|e| {
            let r = s.route(Epoch(e));
            [r.local, r.remote]
        })
        .collect()
}

/// One captured handshake: the messages as they crossed the link, and the session it started.
struct Session {
    initiation: Vec<u8>,
    response: Vec<u8>,
    route_key: SessionKey,
    epoch: Epoch,
}

/// A and B handshake `n` times (a cold start, then rekeys 120 s apart), on link-key routes (the
/// capture holds every message whatever route a rekey would travel on: the thief gets more here
/// than on the wire).
fn conversation(a_key: &PrivateKey, b_key: &PrivateKey, n: usize) -> Vec<Session> {
    let mut a = Handshake::new(handshake_config(a_key, b_key, A, B)).unwrap();
    let mut b = Handshake::new(handshake_config(b_key, a_key, B, A)).unwrap();
    let a_stream = stream(a.link_key().clone());
    let b_stream = Stream::new(StreamConfig::new(
        Endpoint::new(ip(B)),
        Endpoint::new(ip(A)),
        b.link_key().clone(),
    ))
    .unwrap();
    let mut out = Vec::new();
    for i in 0..n {
        let now = UnixTime::from_millis(START_MS + i as u64 * 120_000);
        let e = a_stream.epoch_at(now);
        let (a_route, b_route) = (a_stream.route(e), b_stream.route(e));
        a.want_handshake();
        let init = a
            .poll(now, &a_route, 0, || Some([0x10 + i as u8; 32]))
            .unwrap();
        let Outcome::Responded {
            reply,
            keys: b_keys,
        } = b
            .handle(now, &b_route, &b_route, &init, || {
                Some([0x80 + i as u8; 32])
            })
            .unwrap()
        else {
            panic!("B did not answer session {i}");
        };
        let Outcome::Completed { keys: a_keys, .. } =
            a.handle(now, &a_route, &a_route, &reply, || None).unwrap()
        else {
            panic!("A did not complete session {i}");
        };
        // Both ends of the session derive the same route key.
        assert_eq!(a_keys.route.as_bytes(), b_keys.route.as_bytes());
        out.push(Session {
            initiation: init.to_vec(),
            response: reply.to_vec(),
            route_key: a_keys.route,
            epoch: e,
        });
    }
    out
}

/// Every route key the thief of `stolen` (whose peer is `other`) can get from the capture with the
/// project's own code: the link key, and the route key of each session it completes itself by
/// answering a captured initiation as the stolen gateway. Captured responses reach no attempt of
/// its own and yield nothing (asserted).
fn thief_keys(
    stolen: &PrivateKey,
    other: &PrivateKey,
    stolen_is_responder: bool,
    capture: &[Session],
) -> Vec<SessionKey> {
    let (local, remote) = if stolen_is_responder { (B, A) } else { (A, B) };
    let trues = (ip(local), ip(remote));
    let mut keys = vec![link_key(stolen, &other.public_key(), &Psk::none(), trues).unwrap()];
    let mut hs = Handshake::new(handshake_config(stolen, other, local, remote)).unwrap();
    let s = Stream::new(StreamConfig::new(
        Endpoint::new(ip(local)),
        Endpoint::new(ip(remote)),
        hs.link_key().clone(),
    ))
    .unwrap();
    for (i, c) in capture.iter().enumerate() {
        let now = UnixTime::from_millis(START_MS + i as u64 * 120_000);
        let r = s.route(c.epoch);
        match hs.handle(now, &r, &r, &c.initiation, || Some([0xee; 32])) {
            Ok(Outcome::Responded { keys: k, .. }) => keys.push(k.route),
            Ok(Outcome::Completed { .. }) => panic!("an initiation completed a handshake"),
            // The initiator's key cannot read an initiation addressed to the responder.
            Err(_) => assert!(!stolen_is_responder, "the responder's key read nothing"),
        }
        // A response answers an attempt the thief never made (its mac does not even pass on the
        // responder's side, which sent it).
        let got = hs.handle(now, &r, &r, &c.response, || Some([0xef; 32]));
        if stolen_is_responder {
            assert!(matches!(got, Err(HandshakeError::BadMac)));
        } else {
            assert!(matches!(got, Err(HandshakeError::UnexpectedResponse)));
        }
    }
    keys
}

fn assert_thief_finds_no_route(stolen_is_responder: bool) {
    let a_key = PrivateKey::generate([0x11; 32]);
    let b_key = PrivateKey::generate([0x22; 32]);
    let capture = conversation(&a_key, &b_key, 4);
    let (stolen, other) = if stolen_is_responder {
        (&b_key, &a_key)
    } else {
        (&a_key, &b_key)
    };
    let thief = thief_keys(stolen, other, stolen_is_responder, &capture);
    // The responder's key reads every initiation: the thief completed a session per capture.
    if stolen_is_responder {
        assert_eq!(thief.len(), 1 + capture.len());
    }
    for s in &capture {
        let session = routes(s.route_key.clone(), s.epoch);
        assert_eq!(session.len(), 2 * WINDOW as usize, "routes repeat");
        for k in &thief {
            assert_ne!(k.as_bytes(), s.route_key.as_bytes());
            let found = routes(k.clone(), s.epoch);
            assert!(
                session.is_disjoint(&found),
                "the thief computed a data-phase route of the session of epoch {}",
                s.epoch.0
            );
        }
    }
}

#[test]
fn a_thief_of_the_responders_static_key_computes_no_session_route() {
    assert_thief_finds_no_route(true);
}

#[test]
fn a_thief_of_the_initiators_static_key_computes_no_session_route() {
    assert_thief_finds_no_route(false);
}

/// Control: with link-key routes (what the daemon does today, and what cold starts keep doing) the
/// same thief computes every route, so the checks above can fail.
#[test]
fn the_same_thief_computes_every_link_key_route() {
    let a_key = PrivateKey::generate([0x11; 32]);
    let b_key = PrivateKey::generate([0x22; 32]);
    let capture = conversation(&a_key, &b_key, 1);
    let thief = thief_keys(&b_key, &a_key, true, &capture);
    let link = link_key(&a_key, &b_key.public_key(), &Psk::none(), (ip(A), ip(B))).unwrap();
    let wire = routes(link, capture[0].epoch);
    assert!(thief
        .iter()
        .any(|k| routes(k.clone(), capture[0].epoch) == wire));
}
