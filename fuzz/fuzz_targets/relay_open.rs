//! The relay open paths (docs/PROTOCOL.md §10.2, §10.5) over arbitrary bytes: must never panic.
//!
//! - `Opener::open_frame` on arbitrary relay link payloads (header protection removed first, as
//!   a relay receives), both AEADs: whatever it accepts is a checked frame or a keepalive.
//! - The input as a frame: if it parses, `Sealer::seal_frame_in_place` seals it and
//!   `open_frame` gives it back byte for byte, while a direct opener refuses it as
//!   `open_bad_inner`; anything else is refused by the sealer and leaves the buffer as it was.
//! - The input as the body of an inner packet: a direct sealer's payload is refused by
//!   `open_frame` as `relay_bad_kind` (a link relay at one end and direct at the other), or as
//!   `open_truncated` if it is shorter than any frame's payload.
//! - The input as an e2e relay payload: the tag index finds nothing (`relay_unknown_tag`) unless
//!   it is a tag of the window; the input sealed as an e2e payload for the virtual route is found
//!   and opens to the inner packet.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mt6d_proto::endpoint::{IndexSeed, PeerId};
use mt6d_proto::relay::e2e::{seal_e2e, E2ePayload, RouteTagKey, VirtualRoute};
use mt6d_proto::relay::tags::TagIndex;
use mt6d_proto::relay::{RelayError, RelayFrame};
use mt6d_proto::tunnel::{frame_payload_len, FRAME_HEADROOM, MIN_FRAME_PAYLOAD};
use mt6d_proto::{
    AeadAlg, Endpoint, Epoch, Mode, OpenError, SealError, SessionKey, Stream, StreamConfig,
};

fn streams(aead: AeadAlg) -> (Stream, Stream) {
    let mut c = StreamConfig::new(
        Endpoint::new("2001:db8:a::1".parse().unwrap()),
        Endpoint::new("2001:db8:b::2".parse().unwrap()),
        SessionKey::from_bytes(&[0x42; 32]).unwrap(),
    );
    c.mode = Mode::Encrypt;
    c.aead = aead;
    (
        Stream::new(c.clone()).unwrap(),
        Stream::new(c.mirrored()).unwrap(),
    )
}

fn inner_packet(body: &[u8]) -> Vec<u8> {
    let mut p = vec![0x60, 0, 0, 0, 0, 0, 59, 64];
    p[4..6].copy_from_slice(&(body.len() as u16).to_be_bytes());
    p.extend_from_slice(
        &"2001:db8:a::1"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    p.extend_from_slice(
        &"2001:db8:b::2"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    p.extend_from_slice(body);
    p
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, data)) = data.split_first() else {
        return;
    };
    if data.len() > 1500 {
        return;
    }
    let aead = if sel & 1 != 0 {
        AeadAlg::ChaCha20Poly1305
    } else {
        AeadAlg::Aes256Gcm
    };
    let (a, b) = streams(aead);
    let epoch = Epoch(1_000 + u64::from(sel >> 1));
    let (ra, rb) = (a.route(epoch), b.route(epoch));
    let mut opener = b.opener();

    // Arbitrary link payloads, as a relay receives them.
    let mut rx = data.to_vec();
    let _ = b.recv_header_key().unwrap().unprotect(&mut rx);
    match opener.open_frame(&rb, &mut rx) {
        Ok(Some(f)) => {
            let n = f.as_bytes().len();
            assert!(RelayFrame::new_checked(f.as_bytes()).is_ok());
            assert_eq!(n + 24, data.len());
        }
        Ok(None) => assert_eq!(data.len(), 24),
        Err(_) => {}
    }

    // The input as a frame: sealed and opened back, refused by a direct opener.
    let sealer = a.sealer(1 << 26, u64::MAX);
    let mut buf = vec![0u8; frame_payload_len(data.len())];
    buf[FRAME_HEADROOM..FRAME_HEADROOM + data.len()].copy_from_slice(data);
    let before = buf.clone();
    match sealer.seal_frame_in_place(&ra, &mut buf, data.len()) {
        Ok(wire) => {
            let wire = wire.to_vec();
            let mut rx = wire.clone();
            let f = b.opener().open_frame(&rb, &mut rx).unwrap().unwrap();
            assert_eq!(f.as_bytes(), data);
            assert_eq!(
                b.opener().open(&rb, &wire, &mut vec![0u8; wire.len() + 64]),
                Err(OpenError::BadInner)
            );
        }
        Err(e) => {
            assert!(matches!(e, SealError::BadFrame(_)), "{e:?}");
            assert!(RelayFrame::new_checked(data).is_err());
            assert_eq!(buf, before, "a refused frame leaves the buffer as it was");
        }
    }

    // The input as an inner packet's body, sealed by a direct sender.
    let inner = inner_packet(data);
    let mut wire = vec![0u8; inner.len() + 64];
    let n = sealer.seal(&ra, &inner, &mut wire).unwrap();
    let refused = b.opener().open_frame(&rb, &mut wire[..n]).unwrap_err();
    if n >= MIN_FRAME_PAYLOAD {
        assert_eq!(refused, OpenError::BadFrame(RelayError::BadKind(0x60)));
    } else {
        // An inner packet with under 4 bytes of payload is shorter than any frame's payload.
        assert_eq!(refused.reason(), "open_truncated");
    }

    // The input as an e2e relay payload, and sealed as one.
    let mut tags = TagIndex::new(IndexSeed::from_bytes([sel; 16]));
    let set = PeerId::from_parts(u32::from(sel), 0);
    tags.add_set(set, RouteTagKey::derive(&b.config().key))
        .unwrap();
    tags.set_window(set, epoch, |e| b.route(e)).unwrap();
    if let Ok(p) = E2ePayload::new_checked(data) {
        match tags.find(&p) {
            Ok((s, r)) => {
                assert_eq!(s, set);
                assert!(r.epoch.0.abs_diff(epoch.0) <= 1);
            }
            Err(e) => assert_eq!(e, RelayError::UnknownTag(p.tag().0)),
        }
    }
    let via = VirtualRoute::new(a.route(epoch), &RouteTagKey::derive(&a.config().key));
    let mut out = vec![0u8; inner.len() + 64];
    let n = seal_e2e(
        &sealer,
        a.send_header_key().unwrap(),
        &via,
        &inner,
        &mut out,
    )
    .unwrap();
    let p = E2ePayload::new_checked(&mut out[..n]).unwrap();
    let route = *tags.find(&p).unwrap().1;
    let e2e = p.into_payload_mut();
    b.recv_header_key().unwrap().unprotect(e2e).unwrap();
    let mut back = vec![0u8; inner.len()];
    let m = b.opener().open(&route, e2e, &mut back).unwrap();
    assert_eq!(&back[..m], &inner[..]);
});
