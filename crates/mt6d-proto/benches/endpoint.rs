//! Criterion benches of the endpoint indexes (many peers on one endpoint) at 1, 1,000 and
//! 1,000,000 peers, each peer a real [`Stream`] with its own session key and remote true
//! address, its routes derived by [`Stream::route_with_attempt`]:
//!
//! * `lookup_local/hit`, `lookup_local/miss`, `lookup_inner/hit`: one per-packet lookup, keys
//!   drawn in a shuffled order over all peers (up to 2^20 distinct queries, so at a million
//!   peers the table is probed cold, as a receive path would);
//! * `rotate/derive-only` (baseline: the one route derivation a rotation needs anyway) and
//!   `rotate/set_window`: one peer advanced by one epoch (remove e-1's key, derive and insert
//!   e+2's), round robin over all peers, so the figure is the cost per peer of a rotation of
//!   every peer;
//! * `rotate/index-only`: the same advance with a synthetic route (a mix of peer and epoch, no
//!   BLAKE3, the `Stream` not read): what the index itself costs, cache misses included;
//! * `rotate/set_window-shuffled`: as `rotate/set_window` but the peers in a shuffled order, as
//!   jittered deadlines would pop them (the streams are then read cold too);
//! * `table/rotate-per-due-peer`: a [`PeerTable`] of jittered streams (boundaries spread over
//!   half an interval, as the daemon would configure them), `handle_timeout` every 100 ms; the
//!   figure is the time of a tick divided by the peers it advanced: the whole cost of rotating
//!   one peer (timers, stream, derivation, index) in the order the deadlines pop them;
//! * `tick`: one timer tick with 1% of the peers due (deadlines spread evenly over a 10 s
//!   interval, `now` advanced by 100 ms per tick; each due peer is popped and rescheduled one
//!   interval later). The rotation of the due peers is `rotate/set_window` times their number.
//!
//! Memory per peer is measured with a counting global allocator (live heap bytes before and
//! after building, divided by the number of peers) and printed as `memory/<n>` lines: the
//! streams, and the index plus timers.
//!
//! Run: `cargo bench -p mt6d-proto --bench endpoint -- --warm-up-time 1 --measurement-time 3`

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::net::{Ipv6Addr, SocketAddrV6};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use mt6d_proto::endpoint::{IndexSeed, PeerId, PeerSlab, PeerTable, RouteIndex, Timers};
use mt6d_proto::{Endpoint, Epoch, Route, SessionKey, Stream, StreamConfig, UnixTime};

/// Live heap bytes of the whole process.
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator with the caller's layout
// and pointer, so its contract is the system allocator's; the counter is only arithmetic.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same layout as received; the caller upholds `alloc`'s contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation goes through
        // this type).
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`; `new_size` comes from the caller, who upholds `realloc`'s
        // contract.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

const LOCAL_TRUE: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xa, 0, 0, 0, 0, 1);
const ROTATION: Duration = Duration::from_secs(10);
const T0_MS: u64 = 1_700_000_000_000;
/// The epoch every peer's window starts at (each peer's schedule is the same function of time;
/// only the keys differ).
const E0: u64 = T0_MS / 10_000;

/// Peer `i`: its own session key and remote true address (2001:db8:b::/48 + i + 1).
fn stream(i: u32) -> Stream {
    stream_with(i, false)
}

fn stream_with(i: u32, jitter: bool) -> Stream {
    let mut key = [0x5au8; 32];
    key[..4].copy_from_slice(&i.to_be_bytes());
    let remote = Ipv6Addr::from(0x2001_0db8_000b_u128 << 80 | (u128::from(i) + 1));
    let mut c = StreamConfig::new(
        Endpoint::new(LOCAL_TRUE),
        Endpoint::new(remote),
        SessionKey::from_bytes(&key).unwrap(),
    );
    c.rotation = ROTATION;
    c.jitter = jitter;
    Stream::new(c).unwrap()
}

/// A route of `epoch` for peer `k` without any BLAKE3 (splitmix64 of the two), in the same
/// /64 as the real ones: for timing the index alone.
fn synthetic(k: usize, epoch: Epoch) -> Route {
    let mut x = (k as u64) ^ epoch.0.rotate_left(32);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    let addr = Ipv6Addr::from((u128::from(LOCAL_TRUE) >> 64 << 64) | u128::from(x));
    let port = 1024 + (x >> 48) as u16 % 64_000;
    Route {
        epoch,
        local: SocketAddrV6::new(addr, port, 0, 0),
        remote: SocketAddrV6::new(Ipv6Addr::from(!u128::from(x)), port, 0, 0),
    }
}

/// A deterministic shuffle source (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

struct Setup {
    streams: PeerSlab<Stream>,
    ids: Vec<PeerId>,
    index: RouteIndex,
    epochs: Vec<u64>,
}

fn setup(n: u32) -> Setup {
    let t = std::time::Instant::now();
    let base = live();
    let mut streams = PeerSlab::with_capacity(n as usize);
    let ids: Vec<PeerId> = (0..n).map(|i| streams.insert(stream(i)).unwrap()).collect();
    let after_streams = live();
    let mut index = RouteIndex::with_capacity(IndexSeed::from_bytes([0x42; 16]), n as usize);
    let mut timers = Timers::with_capacity(n as usize);
    for (i, id) in ids.iter().enumerate() {
        let s = streams.get(*id).unwrap();
        index
            .add_peer(*id, s.local_true(), s.remote_true())
            .unwrap();
        let d = index
            .set_window(*id, Epoch(E0), |_| 0, |e, k| s.route_with_attempt(e, k))
            .unwrap();
        assert_eq!(d.contested().count(), 0);
        timers.schedule(*id, deadline(i, n as usize));
    }
    let after_index = live();
    let per = |b: isize| b as f64 / f64::from(n);
    println!(
        "memory/{n}: {:.0} bytes per peer in the index and timers, {:.0} per stream, \
         {:.1} MiB in all, built in {:.1} s",
        per(after_index - after_streams),
        per(after_streams - base),
        (after_index - base) as f64 / (1 << 20) as f64,
        t.elapsed().as_secs_f64()
    );
    drop(timers);
    Setup {
        streams,
        ids,
        index,
        epochs: vec![E0; n as usize],
    }
}

/// Peer `i` of `n`: deadlines spread evenly over one rotation interval.
fn deadline(i: usize, n: usize) -> UnixTime {
    let step = ROTATION.as_nanos() as u64 / n as u64;
    UnixTime::from_millis(T0_MS).saturating_add(Duration::from_nanos(step * i as u64))
}

fn endpoint(c: &mut Criterion) {
    for n in [1u32, 1_000, 1_000_000] {
        let mut s = setup(n);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let queries = (3 * n as usize).clamp(4096, 1 << 20);
        let mut g = c.benchmark_group(format!("endpoint/{n}"));

        let hits: Vec<(Ipv6Addr, u16)> = (0..queries)
            .map(|_| {
                let id = s.ids[rng.below(s.ids.len())];
                let r = s.index.window(id).nth(rng.below(3)).copied().unwrap();
                (*r.local.ip(), r.local.port())
            })
            .collect();
        let mut i = 0;
        g.bench_function("lookup_local/hit", |b| {
            b.iter(|| {
                let (a, p) = hits[i];
                i = (i + 1) % hits.len();
                black_box(s.index.lookup_local(black_box(a), black_box(p)))
            })
        });
        // Addresses in our /64 that no route uses: what a scan or a late packet costs.
        let misses: Vec<(Ipv6Addr, u16)> = hits
            .iter()
            .map(|(a, p)| (Ipv6Addr::from(u128::from(*a) ^ 0x5555), *p))
            .collect();
        g.bench_function("lookup_local/miss", |b| {
            b.iter(|| {
                let (a, p) = misses[i];
                i = (i + 1) % misses.len();
                black_box(s.index.lookup_local(black_box(a), black_box(p)))
            })
        });
        let inner: Vec<(Ipv6Addr, Ipv6Addr)> = (0..queries)
            .map(|_| {
                let st = s.streams.get(s.ids[rng.below(s.ids.len())]).unwrap();
                (st.local_true(), st.remote_true())
            })
            .collect();
        g.bench_function("lookup_inner/hit", |b| {
            b.iter(|| {
                let (src, dst) = inner[i % inner.len()];
                i = i.wrapping_add(1);
                black_box(s.index.lookup_inner(black_box(src), black_box(dst)))
            })
        });

        let mut next = 0usize;
        g.bench_function("rotate/derive-only", |b| {
            b.iter(|| {
                let st = s.streams.get(s.ids[next]).unwrap();
                next = (next + 1) % s.ids.len();
                black_box(st.route_with_attempt(black_box(Epoch(E0 + 2)), 0))
            })
        });
        let Setup {
            streams,
            ids,
            index,
            epochs,
        } = &mut s;
        g.bench_function("rotate/index-only", |b| {
            b.iter(|| {
                let k = next;
                next = (next + 1) % ids.len();
                epochs[k] += 1;
                let d = index
                    .set_window(ids[k], Epoch(epochs[k]), |_| 0, |e, _| synthetic(k, e))
                    .unwrap();
                black_box(d);
            })
        });
        // Peers in slot order, then in a shuffled one (as jittered deadlines pop them).
        let in_order: Vec<usize> = (0..ids.len()).collect();
        let mut shuffled = in_order.clone();
        for i in (1..shuffled.len()).rev() {
            shuffled.swap(i, rng.below(i + 1));
        }
        for (name, order) in [
            ("rotate/set_window", &in_order),
            ("rotate/set_window-shuffled", &shuffled),
        ] {
            g.bench_function(name, |b| {
                b.iter(|| {
                    let k = order[next];
                    next = (next + 1) % ids.len();
                    let st = streams.get(ids[k]).unwrap();
                    epochs[k] += 1;
                    let d = index
                        .set_window(
                            ids[k],
                            Epoch(epochs[k]),
                            |_| 0,
                            |e, o| st.route_with_attempt(e, o),
                        )
                        .unwrap();
                    black_box(d);
                })
            });
        }

        // Timers alone (the setup's were dropped to keep its memory figure honest).
        let mut timers = Timers::with_capacity(n as usize);
        for (k, id) in ids.iter().enumerate() {
            timers.schedule(*id, deadline(k, n as usize));
        }
        let mut now = UnixTime::from_millis(T0_MS);
        let tick = ROTATION / 100;
        g.bench_function("tick/1%-due", |b| {
            b.iter(|| {
                now = now.saturating_add(tick);
                let mut due = 0;
                while let Some((id, at)) = timers.pop_due(now) {
                    timers.schedule(id, at.saturating_add(ROTATION));
                    due += 1;
                }
                black_box(due)
            })
        });
        drop(timers);
        drop(s);

        // The whole table, jittered: what a server's rotation costs per client.
        let base = live();
        let t = std::time::Instant::now();
        let mut table = PeerTable::with_capacity(IndexSeed::from_bytes([0x42; 16]), n as usize);
        let t0 = UnixTime::from_millis(T0_MS);
        for i in 0..n {
            table.add(stream_with(i, true), t0, |_| 0).unwrap();
        }
        println!(
            "memory/{n}: {:.0} bytes per peer in a PeerTable (streams, index, timers), built in {:.1} s",
            (live() - base) as f64 / f64::from(n),
            t.elapsed().as_secs_f64()
        );
        let mut now = t0;
        g.bench_function("table/rotate-per-due-peer", |b| {
            b.iter_custom(|iters| {
                // Whole ticks until `iters` peers were advanced; the time per peer is scaled to
                // `iters`.
                let mut done = 0u64;
                let mut spent = Duration::ZERO;
                while done < iters {
                    now = now.saturating_add(ROTATION / 100);
                    let t = std::time::Instant::now();
                    done += table.handle_timeout(
                        now,
                        |_, _| 0,
                        |_, d| {
                            black_box(d);
                        },
                    ) as u64;
                    spent += t.elapsed();
                }
                spent.mul_f64(iters as f64 / done as f64)
            })
        });
        g.finish();
    }
}

criterion_group!(benches, endpoint);
criterion_main!(benches);
