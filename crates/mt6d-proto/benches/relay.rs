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
//! A third group, `relay-junk`, forwards A -> B in passes on one thread while a second thread
//! checks junk (UDP to random addresses of the node's /64, a batch of 32 at a time, flat out)
//! the way the daemon's workers did before they filtered without the node (`link_of` under the
//! node's mutex, once per batch) and the way they do now (the accept routes' copy behind an
//! `ArcSwap`, no lock), with no junk as the baseline: the good thread's time per datagram.
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
                            Finish::Done(r) => panic!("not forwarded: {r:?}"),
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
    /// `RelayNode::link_of` under the node's mutex, once per batch of 32.
    UnderLock,
    /// The accept routes' lock-free copy (`RelayNode::accept_routes` behind an `ArcSwap`).
    LockFree,
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
    let junk = junk_pairs(BATCH * 64);
    let checked = AtomicU64::new(0);
    let mut g = c.benchmark_group(format!("relay-junk/{INNER}"));
    g.throughput(Throughput::Elements(1));
    for (name, mode) in [
        ("no-junk", Junk::None),
        ("junk-under-lock", Junk::UnderLock),
        ("junk-lock-free", Junk::LockFree),
    ] {
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
                        let (relay, stop, junk, accepts, checked) =
                            (&relay, &stop, &junk, &accepts, &checked);
                        if mode != Junk::None {
                            s.spawn(move || {
                                while !stop.load(Ordering::Relaxed) {
                                    for batch in junk.chunks(BATCH) {
                                        let mut found = 0;
                                        if mode == Junk::UnderLock {
                                            let n = relay.lock().unwrap();
                                            for &(l, r) in batch {
                                                found += usize::from(n.link_of(l, r).is_some());
                                            }
                                        } else {
                                            let acc = accepts.load();
                                            for &(l, r) in batch {
                                                found += usize::from(
                                                    acc.iter().any(|x| x.0 == l && x.1 == r),
                                                );
                                            }
                                        }
                                        assert_eq!(found, 0);
                                        checked.fetch_add(BATCH as u64, Ordering::Relaxed);
                                    }
                                }
                            });
                        }
                        let r_ab = r_ab.unwrap();
                        forward_batches(relay, now, Neighbour(0), r_ab, &mut ab, Sharing::Passes);
                        stop.store(true, Ordering::Relaxed);
                    });
                    spent += start.elapsed();
                    done += CHUNK as u64;
                }
                spent
            })
        });
        eprintln!(
            "{name}: {} junk datagrams checked alongside",
            checked.swap(0, Ordering::Relaxed)
        );
    }
    g.finish();
}

criterion_group!(benches, relay, relay_threads, relay_junk);
criterion_main!(benches);
