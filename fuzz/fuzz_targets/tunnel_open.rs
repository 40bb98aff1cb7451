//! Opens arbitrary UDP payloads in every mode and AEAD: must never panic, and anything accepted
//! must be a well-formed inner IPv6 packet. The payload goes through header-protection removal
//! first, as in the gateway. `Opener::open_in_place` must decide and restore exactly as `open`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mt6d_proto::tunnel::header::MIN_PROTECTED_LEN;
use mt6d_proto::tunnel::OPEN_HEADROOM;
use mt6d_proto::wire::Ipv6Packet;
use mt6d_proto::{AeadAlg, Endpoint, Epoch, Mode, SessionKey, Stream, StreamConfig};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, payload)) = data.split_first() else {
        return;
    };
    let mode = [Mode::Plain, Mode::Auth, Mode::Encrypt][usize::from(sel % 3)];
    let aead = if sel & 0x80 != 0 {
        AeadAlg::ChaCha20Poly1305
    } else {
        AeadAlg::Aes256Gcm
    };
    let mut c = StreamConfig::new(
        Endpoint::new("2001:db8:a::1".parse().unwrap()),
        Endpoint::new("2001:db8:b::2".parse().unwrap()),
        SessionKey::from_bytes(&[0x42; 32]).unwrap(),
    );
    c.mode = mode;
    c.aead = aead;
    let s = Stream::new(c).unwrap();
    let mut opener = s.opener();
    let route = s.route(Epoch(u64::from(sel)));
    // As the gateway receives: header protection removed first (auth/encrypt, §4.5).
    let mut unmasked = payload.to_vec();
    if let Some(hk) = s.recv_header_key() {
        if hk.unprotect(&mut unmasked).is_err() {
            assert!(payload.len() < MIN_PROTECTED_LEN);
        }
        let mut again = unmasked.clone();
        if hk.protect(&mut again).is_ok() {
            assert_eq!(again, payload, "protect inverts unprotect");
        }
    }
    let mut out = vec![0u8; payload.len() + 64];
    let opened = opener.open(&route, &unmasked, &mut out);
    if let Ok(n) = opened {
        Ipv6Packet::new_checked(&out[..n]).expect("accepted packet is valid IPv6");
    }
    // The in-place form (a fresh opener, as the first open had) decides and restores the same.
    let mut in_place = s.opener();
    let mut buf = vec![0xeeu8; OPEN_HEADROOM + unmasked.len()];
    buf[OPEN_HEADROOM..].copy_from_slice(&unmasked);
    let got = in_place
        .open_in_place(&route, &mut buf, unmasked.len())
        .map(|inner| inner.to_vec());
    assert_eq!(
        got,
        opened.map(|n| out[..n].to_vec()),
        "open_in_place = open"
    );
    let cut = usize::from(sel).min(out.len());
    let _ = opener.open(&route, &unmasked, &mut out[..cut]);
});
