//! Handshake messages and keepalive-sized payloads from the network: raw bytes (stopped by the
//! view or the MAC), and bytes framed with a valid MAC so the Noise layer behind it is reached,
//! as responder and as initiator with an initiation in flight. Must never panic; nothing forged
//! may complete a handshake.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use mt6d_proto::handshake::{
    is_handshake, Handshake, HandshakeConfig, Kind, Message, PrivateKey, Psk, ReceiveKeys,
};
use mt6d_proto::{AeadAlg, Endpoint, Epoch, Mode, Stream, StreamConfig, UnixTime};

fn pair() -> (Handshake, Handshake) {
    let (ka, kb) = (PrivateKey::generate([1; 32]), PrivateKey::generate([2; 32]));
    let cfg = |l: &PrivateKey, r: &PrivateKey, lt: &str, rt: &str| HandshakeConfig {
        local_private: l.clone(),
        remote_public: r.public_key(),
        psk: Psk::none(),
        mode: Mode::Encrypt,
        aead: AeadAlg::Aes256Gcm,
        local_true: lt.parse().unwrap(),
        remote_true: rt.parse().unwrap(),
        rekey_after: Duration::from_secs(120),
        rekey_after_packets: 1 << 40,
    };
    (
        Handshake::new(cfg(&ka, &kb, "2001:db8:a::1", "2001:db8:b::2")).unwrap(),
        Handshake::new(cfg(&kb, &ka, "2001:db8:b::2", "2001:db8:a::1")).unwrap(),
    )
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let _ = Message::new_checked(body);
    let _ = is_handshake(body);
    let (mut a, mut b) = pair();
    let stream = Stream::new(StreamConfig::new(
        Endpoint::new("2001:db8:b::2".parse().unwrap()),
        Endpoint::new("2001:db8:a::1".parse().unwrap()),
        b.link_key().clone(),
    ))
    .unwrap();
    let route_b = stream.route(Epoch(7));
    let now = UnixTime::from_secs(1_800_000_000);
    // The first 4 bytes of `body` are the index, the rest the Noise message.
    let index = body
        .get(..4)
        .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    let noise = body.get(4..).unwrap_or(&[]);
    let mut msg = match sel % 3 {
        0 => body.to_vec(),
        1 => b.frame_with_mac(
            Kind::Initiation,
            index,
            noise,
            &route_b.remote,
            &route_b.local,
        ),
        _ => b.frame_with_mac(
            Kind::Response,
            index,
            noise,
            &route_b.remote,
            &route_b.local,
        ),
    };
    // The wire carries protected headers (§4.5): raw bytes are unmasked as the gateway does;
    // framed ones are protected by the sender and unmasked by the receiver.
    let hk = stream.recv_header_key().unwrap();
    if sel % 3 != 0 {
        let framed = msg.clone();
        if hk.protect(&mut msg).is_ok() {
            hk.unprotect(&mut msg).unwrap();
        }
        assert_eq!(msg, framed);
    } else {
        let _ = hk.unprotect(&mut msg);
    }
    // As responder: forged Noise bytes must fail.
    if sel % 3 != 0 {
        assert!(b
            .handle(now, &route_b, &route_b, &msg, || Some([3; 32]))
            .is_err());
    } else {
        let _ = b.handle(now, &route_b, &route_b, &msg, || Some([3; 32]));
    }
    // As initiator with an initiation in flight: a forged response must fail.
    let route_a = mt6d_proto::Route {
        epoch: route_b.epoch,
        local: route_b.remote,
        remote: route_b.local,
    };
    assert!(a.poll(now, &route_a, 0, || Some([4; 32])).is_some());
    // Half the inputs name the attempt in flight, so the Noise layer behind the index is reached.
    let index = if sel & 0x80 != 0 {
        a.pending_index().unwrap()
    } else {
        index
    };
    let resp = a.frame_with_mac(
        Kind::Response,
        index,
        noise,
        &route_a.remote,
        &route_a.local,
    );
    assert!(a
        .handle(now, &route_a, &route_a, &resp, || Some([5; 32]))
        .is_err());
    // Receive keys with none installed, and arbitrary payloads.
    let mut keys = ReceiveKeys::new();
    let mut out = vec![0u8; body.len() + 64];
    let _ = keys.open(now, &route_b, body, &mut out);
});
