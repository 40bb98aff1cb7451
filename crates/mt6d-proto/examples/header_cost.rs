//! What header protection (docs/PROTOCOL.md §4.5) adds to a seal+open round trip, measured as the
//! minimum over 200 runs of 2000 iterations, interleaved with the same round trip without it: the
//! minimum is what the code costs, robust against other load on a shared machine (where criterion's
//! means wander by more than the difference). Run:
//! `cargo run --release -p mt6d-proto --example header_cost`

#![allow(clippy::unwrap_used)]
use mt6d_proto::{AeadAlg, Endpoint, Epoch, Mode, SessionKey, Stream, StreamConfig};
use std::hint::black_box;
use std::net::Ipv6Addr;
use std::time::Instant;
const A: &str = "2001:db8:a::1";
const B: &str = "2001:db8:b::2";
fn inner(len: usize) -> Vec<u8> {
    let mut p = vec![0xabu8; len];
    p[..8].copy_from_slice(&[0x60, 0, 0, 0, 0, 0, 59, 64]);
    p[4..6].copy_from_slice(&((len - 40) as u16).to_be_bytes());
    p[8..24].copy_from_slice(&A.parse::<Ipv6Addr>().unwrap().octets());
    p[24..40].copy_from_slice(&B.parse::<Ipv6Addr>().unwrap().octets());
    p
}
fn main() {
    for aead in [AeadAlg::Aes256Gcm, AeadAlg::ChaCha20Poly1305] {
        let mut c = StreamConfig::new(
            Endpoint::new(A.parse().unwrap()),
            Endpoint::new(B.parse().unwrap()),
            SessionKey::from_bytes(&[7; 32]).unwrap(),
        );
        c.mode = Mode::Encrypt;
        c.aead = aead;
        let (sa, sb) = (
            Stream::new(c.clone()).unwrap(),
            Stream::new(c.mirrored()).unwrap(),
        );
        let sealer = sa.sealer(1 << 26, u64::MAX);
        let (ra, rb) = (sa.route(Epoch(1)), sb.route(Epoch(1)));
        let (tx, rx) = (sa.send_header_key().unwrap(), sb.recv_header_key().unwrap());
        let mut opener = sb.opener();
        const IT: u32 = 2000;
        let mut p = vec![0u8; 64];
        let mut best_mask = f64::MAX;
        for _ in 0..300 {
            let t = Instant::now();
            for _ in 0..IT {
                tx.protect(black_box(&mut p)).unwrap();
                p[63] = p[63].wrapping_add(1);
            }
            best_mask = best_mask.min(t.elapsed().as_nanos() as f64 / IT as f64);
        }
        println!("{aead} protect (one mask): {best_mask:.1} ns");
        for size in [64usize, 1280, 1400] {
            let pkt = inner(size);
            let mut wire = vec![0u8; size + 64];
            let mut out = vec![0u8; size + 64];
            let (mut best0, mut best1) = (f64::MAX, f64::MAX);
            for _ in 0..200 {
                let t = Instant::now();
                for _ in 0..IT {
                    let n = sealer.seal(&ra, black_box(&pkt), &mut wire).unwrap();
                    black_box(opener.open(&rb, &wire[..n], &mut out).unwrap());
                }
                best0 = best0.min(t.elapsed().as_nanos() as f64 / IT as f64);
                let t = Instant::now();
                for _ in 0..IT {
                    let n = sealer.seal(&ra, black_box(&pkt), &mut wire).unwrap();
                    tx.protect(&mut wire[..n]).unwrap();
                    rx.unprotect(&mut wire[..n]).unwrap();
                    black_box(opener.open(&rb, &wire[..n], &mut out).unwrap());
                }
                best1 = best1.min(t.elapsed().as_nanos() as f64 / IT as f64);
            }
            println!("{aead} {size}: seal+open {best0:.0} ns, seal+hp+open {best1:.0} ns, +{:.0} ns ({:+.1} %)", best1-best0, (best1/best0-1.0)*100.0);
        }
    }
}
