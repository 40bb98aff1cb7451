//! Criterion benches: seal+open per mode/AEAD at 64/1280/1400/9000 bytes against a memcpy baseline
//! measured in the same group, and one address derivation per derivation mode.
//! Run: `cargo bench -p mt6d-proto --bench proto -- --warm-up-time 1 --measurement-time 3`

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
use std::hint::black_box;
use std::net::Ipv6Addr;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mt6d_proto::addressing::{hashed_address, AddressKeys, Role};
use mt6d_proto::{
    AeadAlg, Derivation, Endpoint, Epoch, Mode, SessionKey, Stream, StreamConfig, UnixTime,
};

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

fn streams(mode: Mode, aead: AeadAlg) -> (Stream, Stream) {
    let mut c = StreamConfig::new(
        Endpoint::new(A.parse().unwrap()),
        Endpoint::new(B.parse().unwrap()),
        SessionKey::from_bytes(&[7; 32]).unwrap(),
    );
    c.mode = mode;
    c.aead = aead;
    (
        Stream::new(c.clone()).unwrap(),
        Stream::new(c.mirrored()).unwrap(),
    )
}

fn tunnel(c: &mut Criterion) {
    for size in [64usize, 1280, 1400, 9000] {
        let mut g = c.benchmark_group(format!("tunnel/{size}"));
        g.throughput(Throughput::Bytes(size as u64));
        let pkt = inner(size);
        let mut buf = vec![0u8; size + 64];
        g.bench_function("baseline-memcpy", |b| {
            b.iter(|| {
                buf[..size].copy_from_slice(black_box(&pkt));
                black_box(&buf);
            })
        });
        for (mode, aead) in [
            (Mode::Plain, AeadAlg::Aes256Gcm),
            (Mode::Encrypt, AeadAlg::Aes256Gcm),
            (Mode::Encrypt, AeadAlg::ChaCha20Poly1305),
            (Mode::Auth, AeadAlg::Aes256Gcm),
        ] {
            let (sa, sb) = streams(mode, aead);
            let sealer = sa.sealer(UnixTime::from_secs(1_700_000_000));
            let (ra, rb) = (sa.route(Epoch(1)), sb.route(Epoch(1)));
            let name = if mode == Mode::Plain {
                "plain".to_string()
            } else {
                format!("{mode}-{aead}")
            };
            let mut wire = vec![0u8; size + 64];
            g.bench_function(BenchmarkId::new("seal", &name), |b| {
                b.iter(|| black_box(sealer.seal(&ra, black_box(&pkt), &mut wire).unwrap()))
            });
            let mut out = vec![0u8; size + 64];
            g.bench_function(BenchmarkId::new("seal+open", &name), |b| {
                // A fresh opener per batch would hide replay-window cost; counters only grow, so one
                // opener accepts every packet.
                let mut opener = sb.opener();
                b.iter(|| {
                    let n = sealer.seal(&ra, black_box(&pkt), &mut wire).unwrap();
                    black_box(opener.open(&rb, &wire[..n], &mut out).unwrap())
                })
            });
        }
        g.finish();
    }
}

fn addressing(c: &mut Criterion) {
    let keys = AddressKeys::derive(&SessionKey::from_bytes(&[7; 64]).unwrap());
    let ep = Endpoint::new(A.parse().unwrap());
    let mut g = c.benchmark_group("address");
    for d in [Derivation::Keyed, Derivation::Thesis] {
        let mut e = 0u64;
        g.bench_function(d.name(), |b| {
            b.iter(|| {
                e += 1;
                black_box(hashed_address(&keys, d, &ep, Role::Low, Epoch(e), 0))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, tunnel, addressing);
criterion_main!(benches);
