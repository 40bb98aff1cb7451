//! Criterion benches of a relay network node's per-packet work (docs/PROTOCOL.md §10), in the
//! stages of 003's Fig. 16/19/20 that happen in the protocol crate: at a relay, one frame
//! forwarded whole (header protection off, open, route lookup, seal for the next link, header
//! protection on) and its parts on their own (open, route lookup, seal); at an edge gateway, one
//! inner packet originated (end-to-end seal, link seal) and one delivered (link open, end-to-end
//! open). A memcpy of the same datagram is the baseline in the same group. The syscall stages
//! (receive, send) are the daemon's: `mt6d status` of a relay node shows them per datagram.
//!
//! The network is edge A - relay R - edge B over real encrypt-mode links with pre-shared keys,
//! converged in simulated time before anything is measured. Opening needs datagrams never seen
//! (the replay window drops a repeat), so those benches seal a fresh chunk outside the timed part.
//!
//! A second group, `relay-threads`, forwards both directions at once (A -> B on one thread,
//! B -> A on another) through one relay node behind a mutex taken once per batch of 32, as
//! the daemon's workers share it: the whole work under the lock (`handle_datagram`) against the
//! passes whose AEAD runs outside it (`begin_datagram`, `OpenJob::open`, `finish_datagram`,
//! `SealJob::seal`), and one thread doing both directions as the baseline. Reported per
//! datagram of wall time: with two cores free, what the passes buy.
//!
//! A third group, `relay-junk`, forwards A -> B on one thread while a second thread checks junk
//! flat out, a batch of 32 at a time: UDP to random addresses of the node's /64 (`link_of` under
//! the node's mutex, once per batch, as the daemon's workers did first; the accept routes' copy
//! behind an `ArcSwap`, no lock, as they did next; the receive gate's `link_of`), and forgeries
//! on the live route (`begin_datagram` under the mutex and `finish_datagram` under it again, as
//! the workers did before the receive gate; `RxGate::admit`, no lock, as they do now). The good
//! thread forwards in passes (`begin_datagram` under the lock) in the first four, through the
//! gate (`RxGate::admit`, then `finish_datagram` under the lock) in the three whose name ends in
//! `gate`; no junk is each one's baseline. Reported: the good thread's time per datagram; the
//! junk thread's count of datagrams checked is printed after each.
//!
//! A fourth group, `edge-lock`, is the time an edge gateway holds the node's lock per delivered
//! datagram (batches of 32, after the gate): with the end-to-end open under it, and outside it.
//! A fifth, `gate`, is the receive gate's cost per datagram it rejects, on one thread.
//!
//! Run: `cargo bench -p mt6d-proto --bench relay -- --warm-up-time 1 --measurement-time 3`

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
use std::hint::black_box;
use std::net::{Ipv6Addr, SocketAddrV6};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mt6d_proto::endpoint::IndexSeed;
use mt6d_proto::handshake::PrivateKey;
use mt6d_proto::relay::frame::{RelayRepr, DEFAULT_FRAME_MAX, HEADER_LEN};
use mt6d_proto::relay::gate::{Admit, RxGate};
use mt6d_proto::relay::node::{E2eId, Finish, Received, RelayNode, Step, Transmit};
use mt6d_proto::relay::table::Neighbour;
use mt6d_proto::relay::{Kind, NodeId, HOP_LIMIT};
use mt6d_proto::tunnel::{frame_payload_len, FRAME_HEADROOM};
use mt6d_proto::{Endpoint, Mode, SessionKey, Stream, StreamConfig, UnixTime};

const FRAME_MAX: usize = DEFAULT_FRAME_MAX;
/// The inner packet: a full-size one for a 1500-byte path (frame_max 1428 carries 1416).
const INNER: usize = 1400;
/// Datagrams sealed per untimed preparation round of the opening benches.
const CHUNK: usize = 4096;

fn at(ms: u64) -> UnixTime {
    UnixTime::from_millis(1_700_000_000_000 + ms)
}
fn a(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

fn stream_pair(x: Ipv6Addr, y: Ipv6Addr, k: u8) -> (Stream, Stream) {
    let mut c = StreamConfig::new(
        Endpoint::new(x),
        Endpoint::new(y),
        SessionKey::from_bytes(&[k; 32]).unwrap(),
    );
    c.mode = Mode::Encrypt;
    c.rotation = Duration::from_secs(3600);
    (
        Stream::new(c.clone()).unwrap(),
        Stream::new(c.mirrored()).unwrap(),
    )
}

fn inner(src: Ipv6Addr, dst: Ipv6Addr) -> Vec<u8> {
    let mut p = vec![0xabu8; INNER];
    p[..8].copy_from_slice(&[0x60, 0, 0, 0, 0, 0, 59, 64]);
    p[4..6].copy_from_slice(&u16::try_from(INNER - 40).unwrap().to_be_bytes());
    p[8..24].copy_from_slice(&src.octets());
    p[24..40].copy_from_slice(&dst.octets());
    p
}

/// Edge A (node 0) - relay R (node 1) - edge B (node 2). Links: A.0 - R.0, R.1 - B.0.
struct Net {
    nodes: [RelayNode; 3],
    b_id: NodeId,
    hosts: (Ipv6Addr, Ipv6Addr),
}

impl Net {
    fn build() -> Net {
        let ids: Vec<NodeId> = [1u8, 2]
            .iter()
            .map(|&k| {
                NodeId::from_public_key(&PrivateKey::from_bytes([k; 32]).public_key()).unwrap()
            })
            .collect();
        let seed = IndexSeed::from_bytes([3; 16]);
        let mut ea = RelayNode::edge(at(0), ids[0], FRAME_MAX, seed).unwrap();
        let mut r = RelayNode::relay(at(0), FRAME_MAX).unwrap();
        let mut eb = RelayNode::edge(at(0), ids[1], FRAME_MAX, seed).unwrap();
        let (na, nr, nb) = (
            a("2001:db8:ff:1::1"),
            a("2001:db8:ff:2::1"),
            a("2001:db8:ff:3::1"),
        );
        let (s1, s2) = stream_pair(na, nr, 1);
        {
            let sealer = s1.sealer(1, u64::MAX);
            ea.add_link(at(0), Neighbour(0), s1, sealer)
        }
        .unwrap();
        {
            let sealer = s2.sealer(1, u64::MAX);
            r.add_link(at(0), Neighbour(0), s2, sealer)
        }
        .unwrap();
        let (s3, s4) = stream_pair(nr, nb, 2);
        {
            let sealer = s3.sealer(1, u64::MAX);
            r.add_link(at(0), Neighbour(1), s3, sealer)
        }
        .unwrap();
        {
            let sealer = s4.sealer(1, u64::MAX);
            eb.add_link(at(0), Neighbour(0), s4, sealer)
        }
        .unwrap();
        let hosts = (a("fd00:1::10"), a("fd00:2::10"));
        let (e1, e2) = stream_pair(hosts.0, hosts.1, 3);
        {
            let sealer = e1.sealer(1, u64::MAX);
            ea.add_e2e(at(0), E2eId(0), ids[1], e1, sealer)
        }
        .unwrap();
        {
            let sealer = e2.sealer(1, u64::MAX);
            eb.add_e2e(at(0), E2eId(0), ids[0], e2, sealer)
        }
        .unwrap();
        let mut net = Net {
            nodes: [ea, r, eb],
            b_id: ids[1],
            hosts,
        };
        // Probes, costs and routes in simulated time, 1 ms steps, for 3 s.
        let mut buf = vec![0u8; frame_payload_len(FRAME_MAX)];
        for ms in 0..3000 {
            let now = at(ms);
            for i in 0..3 {
                if net.nodes[i].poll_timeout() <= now {
                    net.nodes[i].handle_timeout(now, || 0x5555_5555);
                }
                while let Some(t) = net.nodes[i].poll_transmit(now, &mut buf) {
                    let (j, link) = Net::peer(i, t.link);
                    let _ = net.nodes[j].handle_datagram(
                        now,
                        link,
                        t.route.remote,
                        t.route.local,
                        &mut buf[..t.len],
                    );
                }
                while net.nodes[i].poll_event().is_some() {}
            }
        }
        assert!(
            net.nodes[0].table().next_hop(&ids[1]).is_some(),
            "A has no route to B"
        );
        assert!(
            net.nodes[2].table().next_hop(&ids[0]).is_some(),
            "B has no route to A"
        );
        net
    }

    /// The other end of node `i`'s link `n`.
    fn peer(i: usize, n: Neighbour) -> (usize, Neighbour) {
        match (i, n.0) {
            (0, _) => (1, Neighbour(0)),
            (1, 0) => (0, Neighbour(0)),
            (1, _) => (2, Neighbour(0)),
            _ => (1, Neighbour(1)),
        }
    }

    /// One inner packet from B's host to A's host, sealed by B for the link to R.
    fn originate_back(&mut self, now: UnixTime, packet: &[u8], out: &mut [u8]) -> Transmit {
        self.nodes[2]
            .send_inner(now, E2eId(0), packet, out)
            .unwrap()
    }

    /// One inner packet from A's host to B's host, sealed by A for the link to R.
    fn originate(&mut self, now: UnixTime, packet: &[u8], out: &mut [u8]) -> Transmit {
        self.nodes[0]
            .send_inner(now, E2eId(0), packet, out)
            .unwrap()
    }
}

fn relay(c: &mut Criterion) {
    let mut net = Net::build();
    let now = at(3000);
    let packet = inner(net.hosts.0, net.hosts.1);
    let wire = frame_payload_len(FRAME_MAX);
    let mut g = c.benchmark_group(format!("relay/{INNER}"));
    g.throughput(Throughput::Elements(1));
    let mut out = vec![0u8; wire];
    let t = net.originate(now, &packet, &mut out);
    let datagram = out[..t.len].to_vec();
    let mut buf = vec![0u8; wire];
    g.bench_function("baseline-memcpy", |b| {
        b.iter(|| {
            buf[..datagram.len()].copy_from_slice(black_box(&datagram));
            black_box(&buf);
        })
    });
    // Edge A: end-to-end seal, frame, link seal, both header protections.
    g.bench_function("edge-originate", |b| {
        b.iter(|| black_box(net.originate(now, black_box(&packet), &mut out)))
    });
    // Relay R: the whole forwarding step, on datagrams A sealed (fresh ones, copied in).
    let mut chunk: Vec<Vec<u8>> = Vec::with_capacity(CHUNK);
    let mut fill = |net: &mut Net, chunk: &mut Vec<Vec<u8>>| {
        chunk.clear();
        for _ in 0..CHUNK {
            let t = net.originate(now, &packet, &mut out);
            chunk.push(out[..t.len].to_vec());
        }
        t.route
    };
    g.bench_function("relay-forward", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                let route = fill(&mut net, &mut chunk);
                let n = (iters - done).min(CHUNK as u64) as usize;
                let start = Instant::now();
                for d in &mut chunk[..n] {
                    let r = net.nodes[1].handle_datagram(
                        now,
                        Neighbour(0),
                        route.remote,
                        route.local,
                        d,
                    );
                    assert!(matches!(r, Received::Forward(_)));
                }
                spent += start.elapsed();
                done += n as u64;
            }
            spent
        })
    });
    // Edge B: link open, end-to-end open, the inner packet restored (datagrams through R).
    let mut forwarded: Vec<(Vec<u8>, SocketAddrV6, SocketAddrV6)> = Vec::with_capacity(CHUNK);
    g.bench_function("edge-deliver", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                let route = fill(&mut net, &mut chunk);
                forwarded.clear();
                for d in &mut chunk {
                    if let Received::Forward(t) = net.nodes[1].handle_datagram(
                        now,
                        Neighbour(0),
                        route.remote,
                        route.local,
                        d,
                    ) {
                        forwarded.push((d[..t.len].to_vec(), t.route.remote, t.route.local));
                    }
                }
                let n = (iters - done).min(forwarded.len() as u64) as usize;
                let start = Instant::now();
                for (d, local, remote) in &mut forwarded[..n] {
                    let r = net.nodes[2].handle_datagram(now, Neighbour(0), *local, *remote, d);
                    assert!(matches!(r, Received::Deliver { .. }));
                }
                spent += start.elapsed();
                done += n as u64;
            }
            spent
        })
    });
    // The route lookup of the forwarding step on its own (§10.3).
    let header = RelayRepr {
        kind: Kind::Data,
        hops: HOP_LIMIT,
        payload_len: 1,
        destination: net.b_id,
    };
    g.bench_function("route-lookup", |b| {
        b.iter(|| black_box(net.nodes[1].table().forward(black_box(&header), false)))
    });
    // Link seal on its own: the relay's sealer for the next link, in place.
    let (s, mut o) = {
        let (x, y) = stream_pair(a("2001:db8:ff:2::1"), a("2001:db8:ff:3::1"), 9);
        (x.sealer(1, u64::MAX), y.opener())
    };
    let route = Stream::new({
        let mut c = StreamConfig::new(
            Endpoint::new(a("2001:db8:ff:2::1")),
            Endpoint::new(a("2001:db8:ff:3::1")),
            SessionKey::from_bytes(&[9; 32]).unwrap(),
        );
        c.mode = Mode::Encrypt;
        c.rotation = Duration::from_secs(3600);
        c
    })
    .unwrap()
    .schedule(now)
    .send;
    // A frame as the relay holds it between open and seal: header and payload in clear.
    let flen = FRAME_MAX;
    let mut template = vec![0u8; wire];
    RelayRepr {
        kind: Kind::Data,
        hops: HOP_LIMIT,
        payload_len: u16::try_from(flen - HEADER_LEN).unwrap(),
        destination: net.b_id,
    }
    .emit(&mut template[FRAME_HEADROOM..FRAME_HEADROOM + flen])
    .unwrap();
    g.bench_function("link-seal", |b| {
        b.iter(|| {
            // The copy is the baseline's memcpy again: subtract it.
            buf.copy_from_slice(&template);
            black_box(s.seal_frame_in_place(&route, &mut buf, flen).unwrap().len());
        })
    });
    // Link open on its own: fresh frames sealed outside the timed part.
    let mut sealed: Vec<Vec<u8>> = Vec::with_capacity(CHUNK);
    g.bench_function("link-open", |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                sealed.clear();
                for _ in 0..CHUNK {
                    let mut d = template.clone();
                    s.seal_frame_in_place(&route, &mut d, flen).unwrap();
                    sealed.push(d);
                }
                let n = (iters - done).min(CHUNK as u64) as usize;
                let start = Instant::now();
                for d in &mut sealed[..n] {
                    black_box(o.open_frame(&route, d).is_ok());
                }
                spent += start.elapsed();
                done += n as u64;
            }
            spent
        })
    });
    g.finish();
}

/// Datagrams per lock hold in `relay-threads`, as one `recvmmsg` batch of the daemon.
const BATCH: usize = 32;

/// How one thread works through its datagrams with the shared node.
#[derive(Clone, Copy)]
enum Sharing {
    /// Each batch whole under the lock.
    OnePass,
    /// Each batch in passes, the AEAD (open and seal) outside the lock.
    Passes,
}

/// Forwards `datagrams` (arrived on relay link `link` between `local` and `remote`) through
/// the shared relay node, a batch per lock hold.
fn forward_batches(
    node: &Mutex<RelayNode>,
    now: UnixTime,
    link: Neighbour,
    (local, remote): (SocketAddrV6, SocketAddrV6),
    datagrams: &mut [Vec<u8>],
    sharing: Sharing,
) {
    let mut steps = Vec::with_capacity(BATCH);
    let mut seals = Vec::with_capacity(BATCH);
    for batch in datagrams.chunks_mut(BATCH) {
        match sharing {
            Sharing::OnePass => {
                let mut n = node.lock().unwrap();
                for d in batch.iter_mut() {
                    let r = n.handle_datagram(now, link, local, remote, d);
                    assert!(matches!(r, Received::Forward(_)));
                }
            }
            Sharing::Passes => {
                steps.clear();
                seals.clear();
                {
                    let mut n = node.lock().unwrap();
                    for d in batch.iter_mut() {
                        match n.begin_datagram(now, link, local, remote, d) {
                            Step::Open(job) => steps.push(job),
                            _ => panic!("not a forwarded frame"),
                        }
                    }
                }
                let opened: Vec<_> = steps
                    .iter()
                    .zip(batch.iter_mut())
                    .map(|(job, d)| job.open(d))
                    .collect();
                {
                    let mut n = node.lock().unwrap();
                    for ((job, d), o) in steps.iter().zip(batch.iter_mut()).zip(opened) {
                        match n.finish_datagram(now, job, o, d) {
                            Finish::Seal(seal) => seals.push(seal),
                            other => panic!("not forwarded: {other:?}"),
                        }
                    }
                }
                for (seal, d) in seals.iter().zip(batch.iter_mut()) {
                    black_box(seal.seal(d).unwrap());
                }
            }
        }
    }
}

fn relay_threads(c: &mut Criterion) {
    let mut net = Net::build();
    let now = at(3000);
    let there = inner(net.hosts.0, net.hosts.1);
    let back = inner(net.hosts.1, net.hosts.0);
    let wire = frame_payload_len(FRAME_MAX);
    let mut out = vec![0u8; wire];
    // The relay behind the mutex; the edges seal fresh datagrams for it outside the timing.
    let relay = Mutex::new(std::mem::replace(
        &mut net.nodes[1],
        RelayNode::relay(at(0), FRAME_MAX).unwrap(),
    ));
    let mut g = c.benchmark_group(format!("relay-threads/{INNER}"));
    g.throughput(Throughput::Elements(1));
    let mut fill = |net: &mut Net| {
        let (mut ab, mut ba) = (Vec::with_capacity(CHUNK), Vec::with_capacity(CHUNK));
        let (mut r_ab, mut r_ba) = (None, None);
        for _ in 0..CHUNK {
            let t = net.originate(now, &there, &mut out);
            ab.push(out[..t.len].to_vec());
            r_ab = Some((t.route.remote, t.route.local));
            let t = net.originate_back(now, &back, &mut out);
            ba.push(out[..t.len].to_vec());
            r_ba = Some((t.route.remote, t.route.local));
        }
        (ab, r_ab.unwrap(), ba, r_ba.unwrap())
    };
    for (name, threads, sharing) in [
        ("one-thread", 1, Sharing::OnePass),
        ("two-threads-one-pass", 2, Sharing::OnePass),
        ("two-threads-passes", 2, Sharing::Passes),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                let mut done = 0;
                while done < iters {
                    let (mut ab, r_ab, mut ba, r_ba) = fill(&mut net);
                    let start = Instant::now();
                    if threads == 1 {
                        forward_batches(&relay, now, Neighbour(0), r_ab, &mut ab, sharing);
                        forward_batches(&relay, now, Neighbour(1), r_ba, &mut ba, sharing);
                    } else {
                        std::thread::scope(|s| {
                            let relay = &relay;
                            s.spawn(move || {
                                forward_batches(relay, now, Neighbour(0), r_ab, &mut ab, sharing)
                            });
                            forward_batches(relay, now, Neighbour(1), r_ba, &mut ba, sharing);
                        });
                    }
                    spent += start.elapsed();
                    done += 2 * CHUNK as u64;
                }
                spent
            })
        });
    }
    g.finish();
}

/// How the junk thread of `relay-junk` checks its datagrams.
#[derive(Clone, Copy, PartialEq)]
enum Junk {
    None,
    /// Junk to random addresses of the /64: `RelayNode::link_of` under the node's mutex, once
    /// per batch of 32 (the daemon before it filtered without the node).
    UnderLock,
    /// The same junk against the accept routes' lock-free copy (`RelayNode::accept_routes`
    /// behind an `ArcSwap`, no lock).
    LockFree,
    /// Forgeries on the live route (a real datagram with one bit of its ciphertext changed):
    /// `begin_datagram` under the mutex, the AEAD without it, `finish_datagram` under it again,
    /// once per batch (the daemon before the receive gate).
    ForgedUnderLock,
    /// The same forgeries through the receive gate (`RxGate::admit`, no lock).
    ForgedGate,
    /// Junk to random addresses of the /64 through the receive gate.
    Gate,
}

/// Adds the time since `.0` to `.1` when dropped (the junk thread's wall time, however it ends).
struct Spent<'a>(Instant, &'a std::sync::atomic::AtomicU64);

impl Drop for Spent<'_> {
    fn drop(&mut self) {
        let ns = u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.1.fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Junk datagrams' (destination, source): random addresses of the relay's /64 and ports.
fn junk_pairs(n: usize) -> Vec<(SocketAddrV6, SocketAddrV6)> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..n)
        .map(|_| {
            let dst = u128::from(a("2001:db8:ff:2::")) | u128::from(next());
            let src = u128::from(a("2001:db8:66::")) | u128::from(next());
            (
                SocketAddrV6::new(Ipv6Addr::from(dst), next() as u16, 0, 0),
                SocketAddrV6::new(Ipv6Addr::from(src), next() as u16, 0, 0),
            )
        })
        .collect()
}

/// Forgeries on A's live route to R, the worst case for a receiver: A's header key (so they
/// unmask to data frames), counters far ahead of any replay window (a forger picks them; they
/// stay fresh, as nothing forged is ever taken), one bit of ciphertext changed (the tag fails,
/// after the whole AEAD). Returns them and their (local, remote) at R.
fn forgeries(now: UnixTime) -> (Vec<Vec<u8>>, (SocketAddrV6, SocketAddrV6)) {
    let (s, _) = stream_pair(a("2001:db8:ff:1::1"), a("2001:db8:ff:2::1"), 1);
    let sealer = s.sealer(1 << 40, u64::MAX);
    let route = s.schedule(now).send;
    let repr = RelayRepr {
        kind: Kind::Data,
        hops: HOP_LIMIT,
        payload_len: u16::try_from(FRAME_MAX - HEADER_LEN).unwrap(),
        destination: NodeId::from_bytes([7; 8]),
    };
    let payload = vec![0x42u8; FRAME_MAX - HEADER_LEN];
    let forged = (0..BATCH)
        .map(|_| {
            let mut d = vec![0u8; frame_payload_len(FRAME_MAX)];
            let n = sealer
                .seal_frame(&route, &repr, &payload, FRAME_MAX, &mut d)
                .unwrap();
            d.truncate(n);
            s.send_header_key().unwrap().protect(&mut d).unwrap();
            d[100] ^= 1;
            d
        })
        .collect();
    (forged, (route.remote, route.local))
}

/// Forwards `datagrams` as the daemon's workers do with the receive gate: each through
/// `RxGate::admit` without the lock, `finish_datagram` under it once per batch, the seals without
/// it.
fn forward_gated(
    node: &Mutex<RelayNode>,
    gate: &RxGate,
    now: UnixTime,
    (local, remote): (SocketAddrV6, SocketAddrV6),
    datagrams: &mut [Vec<u8>],
) {
    let mut jobs = Vec::with_capacity(BATCH);
    let mut seals = Vec::with_capacity(BATCH);
    for batch in datagrams.chunks_mut(BATCH) {
        jobs.clear();
        seals.clear();
        for d in batch.iter_mut() {
            match gate.admit(local, remote, d) {
                Admit::Opened(job) => jobs.push(job),
                other => panic!("not opened at the gate: {other:?}"),
            }
        }
        {
            let mut n = node.lock().unwrap();
            for (job, d) in jobs.iter().zip(batch.iter_mut()) {
                match n.finish_datagram(now, job, Ok(()), d) {
                    Finish::Seal(seal) => seals.push(seal),
                    _ => panic!("not forwarded"),
                }
            }
        }
        for (seal, d) in seals.iter().zip(batch.iter_mut()) {
            black_box(seal.seal(d).unwrap());
        }
    }
}

/// One batch of forgeries checked the way `mode` says; returns how many passed (none should).
fn check_forged(
    node: &Mutex<RelayNode>,
    gate: &RxGate,
    now: UnixTime,
    (local, remote): (SocketAddrV6, SocketAddrV6),
    forged: &[Vec<u8>],
    scratch: &mut [Vec<u8>],
    mode: Junk,
) -> usize {
    for (s, f) in scratch.iter_mut().zip(forged) {
        s.clear();
        s.extend_from_slice(f);
    }
    let mut passed = 0;
    if mode == Junk::ForgedGate {
        for s in scratch.iter_mut() {
            passed += usize::from(!matches!(gate.admit(local, remote, s), Admit::Refused(..)));
        }
        return passed;
    }
    let mut jobs = Vec::with_capacity(scratch.len());
    {
        let mut n = node.lock().unwrap();
        for s in scratch.iter_mut() {
            match n.begin_datagram(now, Neighbour(0), local, remote, s) {
                Step::Open(job) => jobs.push(job),
                Step::Done(Received::Consumed) => {}
                _ => passed += 1,
            }
        }
    }
    let opened: Vec<_> = jobs
        .iter()
        .zip(scratch.iter_mut())
        .map(|(j, s)| j.open(s))
        .collect();
    let mut n = node.lock().unwrap();
    for ((job, s), o) in jobs.iter().zip(scratch.iter_mut()).zip(opened) {
        passed += usize::from(!matches!(
            n.finish_datagram(now, job, o, s),
            Finish::Done(Received::Consumed)
        ));
    }
    passed
}

fn relay_junk(c: &mut Criterion) {
    use arc_swap::ArcSwap;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let mut net = Net::build();
    let now = at(3000);
    let there = inner(net.hosts.0, net.hosts.1);
    let mut out = vec![0u8; frame_payload_len(FRAME_MAX)];
    let relay = Mutex::new(std::mem::replace(
        &mut net.nodes[1],
        RelayNode::relay(at(0), FRAME_MAX).unwrap(),
    ));
    type Accepts = Vec<(SocketAddrV6, SocketAddrV6, Neighbour)>;
    let accepts: ArcSwap<Accepts> = ArcSwap::from_pointee(
        relay
            .lock()
            .unwrap()
            .accept_routes()
            .map(|(n, r)| (r.local, r.remote, n))
            .collect(),
    );
    let gate = relay.lock().unwrap().rx_gate();
    let junk = junk_pairs(BATCH * 64);
    let (forged, r_forged) = forgeries(now);
    let checked = AtomicU64::new(0);
    let junk_ns = AtomicU64::new(0);
    let good = AtomicU64::new(0);
    let mut g = c.benchmark_group(format!("relay-junk/{INNER}"));
    g.throughput(Throughput::Elements(1));
    for (name, mode) in [
        ("no-junk", Junk::None),
        ("junk-under-lock", Junk::UnderLock),
        ("junk-lock-free", Junk::LockFree),
        ("forged-under-lock", Junk::ForgedUnderLock),
        ("no-junk-gate", Junk::None),
        ("junk-gate", Junk::Gate),
        ("forged-gate", Junk::ForgedGate),
    ] {
        // The good thread as the daemon's workers were (passes) or are (the gate).
        let gated = name.ends_with("gate");
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                let mut done = 0;
                while done < iters {
                    let mut ab = Vec::with_capacity(CHUNK);
                    let mut r_ab = None;
                    for _ in 0..CHUNK {
                        let t = net.originate(now, &there, &mut out);
                        ab.push(out[..t.len].to_vec());
                        r_ab = Some((t.route.remote, t.route.local));
                    }
                    let stop = AtomicBool::new(false);
                    let start = Instant::now();
                    std::thread::scope(|s| {
                        let (relay, stop, junk, accepts, checked, gate, forged, junk_ns) = (
                            &relay, &stop, &junk, &accepts, &checked, &gate, &forged, &junk_ns,
                        );
                        if mode != Junk::None {
                            s.spawn(move || {
                                let began = Instant::now();
                                let _spent = Spent(began, junk_ns);
                                let mut scratch = forged.clone();
                                while !stop.load(Ordering::Relaxed) {
                                    if matches!(mode, Junk::ForgedUnderLock | Junk::ForgedGate) {
                                        let passed = check_forged(
                                            relay,
                                            gate,
                                            now,
                                            r_forged,
                                            forged,
                                            &mut scratch,
                                            mode,
                                        );
                                        assert_eq!(passed, 0);
                                        checked.fetch_add(BATCH as u64, Ordering::Relaxed);
                                        continue;
                                    }
                                    for batch in junk.chunks(BATCH) {
                                        let mut found = 0;
                                        match mode {
                                            Junk::UnderLock => {
                                                let n = relay.lock().unwrap();
                                                for &(l, r) in batch {
                                                    found += usize::from(n.link_of(l, r).is_some());
                                                }
                                            }
                                            Junk::Gate => {
                                                for &(l, r) in batch {
                                                    found +=
                                                        usize::from(gate.link_of(l, r).is_some());
                                                }
                                            }
                                            _ => {
                                                let acc = accepts.load();
                                                for &(l, r) in batch {
                                                    found += usize::from(
                                                        acc.iter().any(|x| x.0 == l && x.1 == r),
                                                    );
                                                }
                                            }
                                        }
                                        assert_eq!(found, 0);
                                        checked.fetch_add(BATCH as u64, Ordering::Relaxed);
                                    }
                                }
                            });
                        }
                        let r_ab = r_ab.unwrap();
                        if gated {
                            forward_gated(relay, gate, now, r_ab, &mut ab);
                        } else {
                            forward_batches(
                                relay,
                                now,
                                Neighbour(0),
                                r_ab,
                                &mut ab,
                                Sharing::Passes,
                            );
                        }
                        stop.store(true, Ordering::Relaxed);
                    });
                    spent += start.elapsed();
                    done += CHUNK as u64;
                    good.fetch_add(CHUNK as u64, Ordering::Relaxed);
                }
                spent
            })
        });
        let n = checked.swap(0, Ordering::Relaxed);
        let ns = junk_ns.swap(0, Ordering::Relaxed);
        let forwarded = good.swap(0, Ordering::Relaxed).max(1);
        eprintln!(
            "{name}: {n} junk datagrams checked alongside ({:.1} per good datagram), {:.1} ns of the junk thread's wall time each",
            n as f64 / forwarded as f64,
            ns as f64 / n.max(1) as f64
        );
    }
    g.finish();
}

/// The receive gate's cost per datagram it rejects, on one thread: junk to a random address of
/// the /64 (no route), a forgery on the live route (the AEAD fails), and a random payload on the
/// live route (refused by its unmasked first byte or its tag). Each copied from a template
/// first, as a received datagram would be in its buffer (`baseline-memcpy` of the `relay`
/// group is that copy's cost).
fn gate(c: &mut Criterion) {
    let net = Net::build();
    let now = at(3000);
    let gate = net.nodes[1].rx_gate();
    let (forged, route) = forgeries(now);
    let forged = forged[0].clone();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let random: Vec<u8> = (0..forged.len())
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let junk = junk_pairs(BATCH);
    let mut buf = forged.clone();
    let mut g = c.benchmark_group(format!("gate/{INNER}"));
    g.throughput(Throughput::Elements(1));
    let mut k = 0;
    g.bench_function("no-route", |b| {
        b.iter(|| {
            k = (k + 1) % junk.len();
            buf.copy_from_slice(&random);
            let (l, r) = junk[k];
            assert!(matches!(gate.admit(l, r, &mut buf), Admit::NoRoute));
        })
    });
    g.bench_function("forged-on-route", |b| {
        b.iter(|| {
            buf.copy_from_slice(&forged);
            let got = gate.admit(route.0, route.1, black_box(&mut buf));
            assert!(matches!(got, Admit::Refused(_, "open_bad_tag")));
        })
    });
    g.bench_function("random-on-route", |b| {
        b.iter(|| {
            buf.copy_from_slice(&random);
            let got = gate.admit(route.0, route.1, black_box(&mut buf));
            assert!(matches!(got, Admit::Refused(..)));
        })
    });
    g.finish();
}

/// At an edge gateway (B), the time spent under the node's lock per delivered datagram, in
/// batches of 32 as the daemon's workers take them: the end-to-end open under the lock (as it
/// was: `finish_datagram`, then the `DeliverJob` opened and finished in the same hold) against
/// outside it (`DeliverJob::open` between two holds), both after the receive gate. What the
/// other workers wait for.
fn edge_lock(c: &mut Criterion) {
    let mut net = Net::build();
    let now = at(3000);
    let packet = inner(net.hosts.0, net.hosts.1);
    let wire = frame_payload_len(FRAME_MAX);
    let mut out = vec![0u8; wire];
    let mut g = c.benchmark_group(format!("edge-lock/{INNER}"));
    g.throughput(Throughput::Elements(1));
    for (name, outside) in [("e2e-open-under-lock", false), ("e2e-open-outside", true)] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut held = Duration::ZERO;
                let mut done = 0;
                while done < iters {
                    // Fresh datagrams for B: sealed by A, forwarded by R, outside the timing.
                    let mut forwarded: Vec<(Vec<u8>, SocketAddrV6, SocketAddrV6)> =
                        Vec::with_capacity(CHUNK);
                    for _ in 0..CHUNK {
                        let t = net.originate(now, &packet, &mut out);
                        let mut d = out[..t.len].to_vec();
                        if let Received::Forward(f) = net.nodes[1].handle_datagram(
                            now,
                            Neighbour(0),
                            t.route.remote,
                            t.route.local,
                            &mut d,
                        ) {
                            d.truncate(f.len);
                            forwarded.push((d, f.route.remote, f.route.local));
                        }
                    }
                    let gate = net.nodes[2].rx_gate();
                    let b_node = &mut net.nodes[2];
                    for batch in forwarded.chunks_mut(BATCH) {
                        let jobs: Vec<_> = batch
                            .iter_mut()
                            .map(|(d, l, r)| match gate.admit(*l, *r, d) {
                                Admit::Opened(job) => job,
                                other => panic!("not opened: {other:?}"),
                            })
                            .collect();
                        let mut deliveries = Vec::with_capacity(BATCH);
                        let start = Instant::now();
                        for (job, (d, _, _)) in jobs.iter().zip(batch.iter_mut()) {
                            match b_node.finish_datagram(now, job, Ok(()), d) {
                                Finish::Deliver(dj) if outside => deliveries.push(dj),
                                Finish::Deliver(dj) => {
                                    let opened = dj.open(d);
                                    let r = b_node.finish_delivery(now, &dj, opened);
                                    assert!(matches!(r, Received::Deliver { .. }));
                                }
                                _ => panic!("not a delivery"),
                            }
                        }
                        held += start.elapsed();
                        if outside {
                            let opened: Vec<_> = deliveries
                                .iter()
                                .zip(batch.iter_mut())
                                .map(|(dj, (d, _, _))| dj.open(d))
                                .collect();
                            let start = Instant::now();
                            for (dj, o) in deliveries.iter().zip(opened) {
                                let r = b_node.finish_delivery(now, dj, o);
                                assert!(matches!(r, Received::Deliver { .. }));
                            }
                            held += start.elapsed();
                        }
                    }
                    done += forwarded.len() as u64;
                }
                held
            })
        });
    }
    g.finish();
}

criterion_group!(benches, relay, relay_threads, relay_junk, edge_lock, gate);
criterion_main!(benches);
