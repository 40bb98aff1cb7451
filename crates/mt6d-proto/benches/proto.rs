//! Criterion benches: seal, open, their in-place forms and seal+open per mode/AEAD at 64/1280/1400/9000 bytes against a memcpy baseline
//! measured in the same group, with and without header protection (one mask each way), one address
//! derivation per derivation mode, and the handshake's cost to a responder (valid initiation, bogus
//! one) next to sealing one data packet, and the sent-packet log's cost on the transmit path
//! (record) and on the ICMPv6 thread (take), and identity scrubbing of TCP segments (the 1400-byte
//! data segment every forwarded packet pays for, a SYN carrying a HOST_ID to strip).
//! Run: `cargo bench -p mt6d-proto --bench proto -- --warm-up-time 1 --measurement-time 3`

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
use std::hint::black_box;
use std::net::Ipv6Addr;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mt6d_proto::addressing::{hashed_address, AddressKeys, Role};
use mt6d_proto::tunnel::{OPEN_HEADROOM, SEAL_HEADROOM, TAG_LEN};
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
            (Mode::Auth, AeadAlg::ChaCha20Poly1305),
        ] {
            let (sa, sb) = streams(mode, aead);
            let sealer = sa.sealer(UnixTime::from_secs(1_700_000_000).as_nanos(), u64::MAX);
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
            // Opening alone: each packet is sealed (with the next counter) in the untimed set-up,
            // so the one opener sees fresh counters and the replay window accepts every packet.
            if mode != Mode::Plain {
                g.bench_function(BenchmarkId::new("open", &name), |b| {
                    let mut opener = sb.opener();
                    b.iter_batched_ref(
                        || {
                            let mut w = vec![0u8; size + 64];
                            let n = sealer.seal(&ra, &pkt, &mut w).unwrap();
                            w.truncate(n);
                            w
                        },
                        |w| black_box(opener.open(&rb, w, &mut out).unwrap()),
                        criterion::BatchSize::SmallInput,
                    )
                });
            }
            // The in-place calls, each buffer laid out as a receive or a TUN read would leave
            // it (in the untimed set-up): what they save is the copies `seal` and `open` make.
            g.bench_function(BenchmarkId::new("seal-in-place", &name), |b| {
                b.iter_batched_ref(
                    || {
                        let mut buf = vec![0u8; SEAL_HEADROOM + size + TAG_LEN];
                        buf[SEAL_HEADROOM..SEAL_HEADROOM + size].copy_from_slice(&pkt);
                        buf
                    },
                    |buf| black_box(sealer.seal_in_place(&ra, buf, size).unwrap().len()),
                    criterion::BatchSize::SmallInput,
                )
            });
            g.bench_function(BenchmarkId::new("open-in-place", &name), |b| {
                let mut opener = sb.opener();
                b.iter_batched_ref(
                    || {
                        let mut w = vec![0u8; OPEN_HEADROOM + size + 64];
                        let n = sealer.seal(&ra, &pkt, &mut w[OPEN_HEADROOM..]).unwrap();
                        w.truncate(OPEN_HEADROOM + n);
                        w
                    },
                    |w| {
                        let n = w.len() - OPEN_HEADROOM;
                        black_box(opener.open_in_place(&rb, w, n).unwrap().len())
                    },
                    criterion::BatchSize::SmallInput,
                )
            });
            g.bench_function(BenchmarkId::new("seal+open", &name), |b| {
                // A fresh opener per batch would hide replay-window cost; counters only grow, so one
                // opener accepts every packet.
                let mut opener = sb.opener();
                b.iter(|| {
                    let n = sealer.seal(&ra, black_box(&pkt), &mut wire).unwrap();
                    black_box(opener.open(&rb, &wire[..n], &mut out).unwrap())
                })
            });
            // The same round trip as it runs in the gateway: header protection after sealing,
            // removal before opening (docs/PROTOCOL.md §4.5).
            if let (Some(tx), Some(rx)) = (sa.send_header_key(), sb.recv_header_key()) {
                g.bench_function(BenchmarkId::new("seal+hp+open", &name), |b| {
                    let mut opener = sb.opener();
                    b.iter(|| {
                        let n = sealer.seal(&ra, black_box(&pkt), &mut wire).unwrap();
                        tx.protect(&mut wire[..n]).unwrap();
                        rx.unprotect(&mut wire[..n]).unwrap();
                        black_box(opener.open(&rb, &wire[..n], &mut out).unwrap())
                    })
                });
                // The same through the one-call seal the roles use (`Sealer::seal_protected`):
                // beside the row above, it shows the call costs nothing over the two steps.
                g.bench_function(BenchmarkId::new("seal_protected+open", &name), |b| {
                    let mut opener = sb.opener();
                    b.iter(|| {
                        let n = sealer
                            .seal_protected(&ra, Some(tx), black_box(&pkt), &mut wire)
                            .unwrap();
                        rx.unprotect(&mut wire[..n]).unwrap();
                        black_box(opener.open(&rb, &wire[..n], &mut out).unwrap())
                    })
                });
            }
        }
        g.finish();
    }
}

/// The header-protection mask alone (one AES-256 block of a 16-byte sample, an 8-byte XOR): paid
/// once by the sender and once by the receiver per packet, whatever its size.
fn header(c: &mut Criterion) {
    let (sa, _) = streams(Mode::Encrypt, AeadAlg::Aes256Gcm);
    let hk = sa.send_header_key().unwrap();
    let mut p = vec![0x5au8; 64];
    let mut g = c.benchmark_group("header");
    g.bench_function("protect", |b| {
        b.iter(|| {
            hk.protect(black_box(&mut p)).unwrap();
            p[63] = p[63].wrapping_add(1);
        })
    });
    g.finish();
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

/// What a responder pays per initiation: a valid one (two Diffie-Hellman operations for the
/// responder's half of Noise IK, plus one for the response), and a bogus one rejected by the MAC;
/// next to sealing one 1280-byte data packet, measured in the same group.
fn handshake(c: &mut Criterion) {
    use mt6d_proto::handshake::{Handshake, HandshakeConfig, PrivateKey, Psk, INITIATION_LEN};
    use std::time::Duration;
    let cfg = |local: &PrivateKey, remote: &PrivateKey, lt: &str, rt: &str| HandshakeConfig {
        local_private: local.clone(),
        remote_public: remote.public_key(),
        psk: Psk::none(),
        mode: Mode::Encrypt,
        aead: AeadAlg::Aes256Gcm,
        local_true: lt.parse().unwrap(),
        remote_true: rt.parse().unwrap(),
        rekey_after: Duration::from_secs(120),
        rekey_after_packets: u64::MAX,
    };
    let (ka, kb) = (PrivateKey::generate([1; 32]), PrivateKey::generate([2; 32]));
    let mut a = Handshake::new(cfg(&ka, &kb, A, B)).unwrap();
    let mut b = Handshake::new(cfg(&kb, &ka, B, A)).unwrap();
    let (sa, sb) = streams(Mode::Encrypt, AeadAlg::Aes256Gcm);
    let (ra, rb) = (sa.route(Epoch(9)), sb.route(Epoch(9)));
    let mut g = c.benchmark_group("handshake");
    let data = inner(1280);
    let sealer = sa.sealer(UnixTime::from_secs(1).as_nanos(), u64::MAX);
    let mut out = vec![0u8; 2048];
    g.bench_function("baseline-seal-1280", |bch| {
        bch.iter(|| black_box(sealer.seal(&ra, black_box(&data), &mut out).unwrap()))
    });
    // Each valid initiation is new (fresh ephemeral, later timestamp, ten seconds later so the
    // responder's rate limit never applies and the initiator's retry backoff, which reaches
    // 4 s plus jitter, is always over): made in the untimed setup.
    let mut t = 1_800_000_000u64;
    let mut seed = 0u64;
    g.bench_function("respond-valid-initiation", |bch| {
        bch.iter_batched(
            || {
                t += 10;
                seed += 1;
                let mut e = [0u8; 32];
                e[..8].copy_from_slice(&seed.to_le_bytes());
                let now = UnixTime::from_secs(t);
                let init = a.poll(now, &ra, u64::MAX, || Some(e)).unwrap();
                (now, init)
            },
            |(now, init)| black_box(b.handle(now, &rb, &rb, &init, || Some([3; 32])).unwrap()),
            criterion::BatchSize::SmallInput,
        )
    });
    // One X25519 (what the responder does four times, plus a key generation) by the two
    // implementations in the dependency tree.
    let dalek_secret = x25519_dalek::StaticSecret::from([7u8; 32]);
    let dalek_public = x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from([9u8; 32]));
    g.bench_function("x25519-dalek", |bch| {
        bch.iter(|| black_box(dalek_secret.diffie_hellman(black_box(&dalek_public))))
    });
    let peer = *dalek_public.as_bytes();
    g.bench_function("x25519-aws-lc", |bch| {
        use aws_lc_rs::agreement;
        bch.iter(|| {
            let k =
                agreement::PrivateKey::from_private_key(&agreement::X25519, &[7u8; 32]).unwrap();
            agreement::agree(
                &k,
                agreement::UnparsedPublicKey::new(&agreement::X25519, black_box(&peer)),
                (),
                |s| {
                    black_box(s);
                    Ok(())
                },
            )
            .unwrap()
        })
    });
    let mut junk = [0x5au8; INITIATION_LEN];
    junk[..4].copy_from_slice(&[0x81, 0, 0, 0]);
    let now = UnixTime::from_secs(t + 10);
    g.bench_function("reject-bogus-initiation", |bch| {
        bch.iter(|| {
            black_box(
                b.handle(now, &rb, &rb, black_box(&junk), || Some([4; 32]))
                    .unwrap_err(),
            )
        })
    });
    g.finish();
}

/// What the transmit path pays for [`SentLog::record`] per packet, against sealing the same
/// 1400-byte packet without it, and what one ICMPv6 error costs the ICMPv6 thread to look up
/// (a miss scans both rings).
fn sent_log(c: &mut Criterion) {
    use mt6d_proto::icmp::SentLog;
    let mut g = c.benchmark_group("sent_log/1400");
    g.throughput(Throughput::Bytes(1400));
    let pkt = inner(1400);
    let (sa, _) = streams(Mode::Encrypt, AeadAlg::Aes256Gcm);
    let sealer = sa.sealer(0, u64::MAX);
    let route = sa.route(Epoch(1));
    let mut wire = vec![0u8; 1500];
    let log = SentLog::new();
    g.bench_function("baseline-seal", |b| {
        b.iter(|| black_box(sealer.seal(&route, black_box(&pkt), &mut wire).unwrap()))
    });
    g.bench_function("seal+record", |b| {
        b.iter(|| {
            let n = sealer.seal(&route, black_box(&pkt), &mut wire).unwrap();
            log.record(&wire[..n]);
            black_box(n)
        })
    });
    g.bench_function("record", |b| {
        b.iter(|| log.record(black_box(&wire[..1440])))
    });
    g.bench_function("take-miss", |b| {
        b.iter(|| black_box(log.take(black_box(&pkt[..1184]), 1440)))
    });
    g.finish();
}

/// An IPv6+TCP packet A -> B with `opts` (a multiple of 4 bytes) and `payload` zero bytes, with a
/// valid checksum.
fn tcp_packet(flags: u8, opts: &[u8], payload: usize) -> Vec<u8> {
    use mt6d_proto::wire::upper_layer_checksum;
    let seg = 20 + opts.len() + payload;
    let mut p = inner(40 + seg);
    p[6] = 6;
    p[40..60].copy_from_slice(&[
        0x9c, 0x40, 0x01, 0xbb, 0, 0, 0, 1, 0, 0, 0, 0, 0, flags, 0xfa, 0xf0, 0, 0, 0, 0,
    ]);
    p[52] = (((20 + opts.len()) / 4) as u8) << 4;
    p[60..60 + opts.len()].copy_from_slice(opts);
    let c = upper_layer_checksum(A.parse().unwrap(), B.parse().unwrap(), 6, &p[40..]);
    p[56..58].copy_from_slice(&c.to_be_bytes());
    p
}

/// What identity scrubbing costs per forwarded packet: a 1400-byte data segment without options
/// and with Linux's timestamps (nothing to strip: the path nearly every packet takes), and a SYN
/// with Linux's options plus a HOST_ID_WING to strip, each strip preceded by restoring the SYN
/// (the copy alone is the baseline); and what `normalize` adds: the hop limit and flow label of
/// every packet, and a SYN's normalisation (timestamps out, re-laid, window lowered).
fn scrub(c: &mut Criterion) {
    use mt6d_proto::scrub::{clamp_mss, strip, ChecksumField, HostIdKinds, ScrubPolicy};
    use mt6d_proto::wire::tcp_flags;
    let kinds = HostIdKinds {
        wing: Some(200),
        boucadair: Some(201),
        enabled: Some(202),
    };
    let policy = ScrubPolicy {
        host_id_kinds: kinds,
        strip_unknown: false,
    };
    let full = ChecksumField::Complete;
    let mut g = c.benchmark_group("scrub/1400");
    g.throughput(Throughput::Bytes(1400));
    let mut data = tcp_packet(tcp_flags::ACK, &[], 1400 - 60);
    g.bench_function("strip-no-options", |b| {
        b.iter(|| black_box(strip(black_box(&mut data), &policy, full).unwrap()))
    });
    let ts = [1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2];
    let mut data_ts = tcp_packet(tcp_flags::ACK, &ts, 1400 - 72);
    g.bench_function("strip-timestamps", |b| {
        b.iter(|| black_box(strip(black_box(&mut data_ts), &policy, full).unwrap()))
    });
    g.bench_function("clamp-not-syn", |b| {
        b.iter(|| black_box(clamp_mss(black_box(&mut data), 1380, kinds, full).unwrap()))
    });
    // What `normalize` adds to every packet from the protected side.
    let key = [0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210];
    g.bench_function("normalize-ip", |b| {
        b.iter(|| mt6d_proto::scrub::normalize_ip(black_box(&mut data), 64, &key))
    });
    g.finish();

    let mut g = c.benchmark_group("scrub/syn");
    let opts = [
        2, 4, 0x23, 0xc4, 4, 2, 8, 10, 0, 0, 0x10, 0, 0, 0, 0, 0, 1, 3, 3, 7, 200, 4, 0x30, 0x39,
    ];
    let syn = tcp_packet(tcp_flags::SYN, &opts, 0);
    let mut buf = syn.clone();
    g.bench_function("baseline-copy", |b| {
        b.iter(|| {
            buf.copy_from_slice(black_box(&syn));
            black_box(&buf);
        })
    });
    for (name, csum) in [
        ("copy+strip-wing", full),
        (
            "copy+strip-wing-partial",
            ChecksumField::Partial {
                includes_length: true,
            },
        ),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                buf.copy_from_slice(black_box(&syn));
                black_box(strip(&mut buf, &policy, csum).unwrap())
            })
        });
    }
    g.bench_function("copy+clamp", |b| {
        b.iter(|| {
            buf.copy_from_slice(black_box(&syn));
            black_box(clamp_mss(&mut buf, 1380, kinds, full).unwrap())
        })
    });
    g.bench_function("copy+normalize-syn", |b| {
        b.iter(|| {
            buf.copy_from_slice(black_box(&syn));
            black_box(mt6d_proto::scrub::normalize_syn(&mut buf, &policy, 10, full).unwrap())
        })
    });
    g.finish();
}

criterion_group!(benches, tunnel, header, addressing, handshake, sent_log, scrub);
criterion_main!(benches);
