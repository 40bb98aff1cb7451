//! What the gateway's TCP policy (identity scrubbing, MSS clamping) costs per packet, through the
//! call the packet threads make (`PeerTcp::apply`), with its fast path, counters and verdict: off
//! (`[tcp] host_id = false`, `mss_clamp = false`: the call returns at once), and on with the
//! default policy (strip, MSS clamping) for a 1400-byte data segment without options, one with
//! Linux's timestamps, a SYN with Linux's options, the same SYN with a HOST_ID_WING to strip,
//! and a SYN the gateway injects into (SYN mode). Each SYN is restored before the call; the
//! copy alone is measured in the same group. The goal: under 50 ns per packet
//! without options. The proto crate's `scrub/*` groups measure the functions underneath.

use std::hint::black_box;
use std::net::Ipv6Addr;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mt6d::config::{HostIdPolicies, HostIdPolicy, Inject, InjectMode, TcpConfig};
use mt6d::gateway::tcp_policy::{Direction, Limits, LogBudget, PeerTcp, Verdict};
use mt6d_proto::scrub::{HostIdKinds, InjectData, InjectForm, ScrubPolicy};
use mt6d_proto::wire::{tcp_flags, upper_layer_checksum};

const A: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0xa);
const B: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0xb);
const KINDS: HostIdKinds = HostIdKinds {
    wing: Some(200),
    boucadair: Some(201),
    enabled: Some(202),
};
/// Linux's SYN options: MSS 1440, SACK permitted, timestamps, window scale 7.
const LINUX_SYN: [u8; 20] = [
    2, 4, 0x05, 0xa0, 4, 2, 8, 10, 0, 0, 0x10, 0, 0, 0, 0, 0, 1, 3, 3, 7,
];
const LIMITS: Limits = Limits {
    mss: 1380,
    mtu: 1440,
};

/// An IPv6+TCP packet A -> B with `opts` (a multiple of 4 bytes) and `payload` zero bytes,
/// a valid checksum, and 40 bytes of room behind it for an injected option.
fn tcp_packet(flags: u8, opts: &[u8], payload: usize) -> (Vec<u8>, usize) {
    let seg = 20 + opts.len() + payload;
    let mut p = vec![0u8; 40 + seg + 40];
    p[0] = 0x60;
    p[4..6].copy_from_slice(&(seg as u16).to_be_bytes());
    p[6] = 6;
    p[7] = 64;
    p[8..24].copy_from_slice(&A.octets());
    p[24..40].copy_from_slice(&B.octets());
    p[40..60].copy_from_slice(&[
        0x9c, 0x40, 0x01, 0xbb, 0, 0, 0, 1, 0, 0, 0, 0, 0, flags, 0xfa, 0xf0, 0, 0, 0, 0,
    ]);
    p[52] = (((20 + opts.len()) / 4) as u8) << 4;
    p[60..60 + opts.len()].copy_from_slice(opts);
    let c = upper_layer_checksum(A, B, 6, &p[40..40 + seg]);
    p[56..58].copy_from_slice(&c.to_be_bytes());
    (p, 40 + seg)
}

fn policy(host_id: bool, mss_clamp: bool, inject: Option<Inject>) -> PeerTcp {
    let tcp = TcpConfig {
        mss_clamp,
        host_id,
        scrub: ScrubPolicy {
            host_id_kinds: KINDS,
            strip_unknown: false,
        },
        normalize: None,
    };
    let mut policies: HostIdPolicies = Default::default();
    policies[0] = HostIdPolicy {
        inject,
        ..HostIdPolicy::default()
    };
    PeerTcp::new(&tcp, &policies)
}

fn apply(tcp: &PeerTcp, buf: &mut [u8], len: usize, log: &mut LogBudget) -> usize {
    match tcp.apply(buf, len, Direction::Out, LIMITS, "b", log) {
        Verdict::Forward(n) => n,
        Verdict::Drop => 0,
    }
}

fn tcp_policy(c: &mut Criterion) {
    let off = policy(false, false, None);
    let on = policy(true, true, None);
    let mut log = LogBudget::default();

    let mut g = c.benchmark_group("tcp_policy/1400");
    g.throughput(Throughput::Bytes(1400));
    let (mut data, len) = tcp_packet(tcp_flags::ACK, &[], 1400 - 60);
    g.bench_function("off", |b| {
        b.iter(|| black_box(apply(&off, black_box(&mut data), len, &mut log)))
    });
    g.bench_function("on-no-options", |b| {
        b.iter(|| black_box(apply(&on, black_box(&mut data), len, &mut log)))
    });
    let ts = [1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2];
    let (mut data_ts, len_ts) = tcp_packet(tcp_flags::ACK, &ts, 1400 - 72);
    g.bench_function("on-timestamps", |b| {
        b.iter(|| black_box(apply(&on, black_box(&mut data_ts), len_ts, &mut log)))
    });
    g.finish();

    let mut g = c.benchmark_group("tcp_policy/syn");
    let (syn, syn_len) = tcp_packet(tcp_flags::SYN, &LINUX_SYN, 0);
    let mut wing_opts = LINUX_SYN.to_vec();
    wing_opts.extend_from_slice(&[200, 4, 0x30, 0x39]);
    let (syn_wing, wing_len) = tcp_packet(tcp_flags::SYN, &wing_opts, 0);
    let mut buf = syn_wing.clone();
    g.bench_function("baseline-copy", |b| {
        b.iter(|| {
            buf.copy_from_slice(black_box(&syn_wing));
            black_box(&buf);
        })
    });
    let inject = policy(
        true,
        true,
        Some(Inject {
            form: InjectForm::Wing { bytes: 2 },
            data: InjectData::Label(0x3039),
            mode: InjectMode::Syn,
        }),
    );
    for (name, tcp, packet, len) in [
        ("copy+off", &off, &syn_wing, wing_len),
        ("copy+on-clamp", &on, &syn, syn_len),
        ("copy+on-strip-wing", &on, &syn_wing, wing_len),
        ("copy+on-inject-wing", &inject, &syn, syn_len),
    ] {
        let mut buf = packet.clone();
        g.bench_function(name, |b| {
            b.iter(|| {
                buf.copy_from_slice(black_box(packet));
                black_box(apply(tcp, &mut buf, len, &mut log))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, tcp_policy);
criterion_main!(benches);
