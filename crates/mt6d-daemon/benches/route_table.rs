//! What a rotation costs the daemon's route table (the goal: "rotation applies
//! a delta per peer, not a rebuild of every peer's routes"), at 1, 1,000 and 100,000 peers with
//! boundaries of their own (jittered, intervals of 1-3 s): `rebuild` derives every peer's
//! routes again, as every step did before; `delta` is what a step does now when one peer's
//! boundary passed (`RouteTable::advance`: that peer derived again, every other shared).
//! Per-packet lookups and the proto crate's million-peer index are in
//! `cargo bench -p mt6d-proto --bench endpoint`.

use std::hint::black_box;
use std::net::Ipv6Addr;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use mt6d::gateway::peer::{Peer, PeerKeys};
use mt6d::gateway::routing::RouteTable;
use mt6d_proto::{Endpoint, SessionKey, Stream, StreamConfig, UnixTime};

fn peer(i: u32) -> Arc<Peer> {
    let local: Ipv6Addr = "2001:db8:a::1".parse().expect("address");
    let remote = Ipv6Addr::from(
        u128::from(Ipv6Addr::new(0x2001, 0xdb8, 0xb, 0, 0, 0, 0, 0)) + u128::from(i) + 1,
    );
    let mut bytes = [0u8; 32];
    bytes[..4].copy_from_slice(&i.to_le_bytes());
    bytes[31] = 1;
    let key = SessionKey::from_bytes(&bytes).expect("key");
    let stream = || {
        let mut config =
            StreamConfig::new(Endpoint::new(local), Endpoint::new(remote), key.clone());
        config.jitter = true;
        config.rotation = Duration::from_secs(1 + u64::from(i % 3));
        Stream::new(config).expect("stream")
    };
    let s = stream();
    let keys = PeerKeys::pre_shared(s.sealer(0, 0), None);
    Arc::new(Peer::new(format!("p{i}"), s, stream(), keys, None))
}

fn rotation(c: &mut Criterion) {
    let mut g = c.benchmark_group("route_table/rotation");
    g.sample_size(10);
    let t0 = UnixTime::from_millis(1_800_000_000_000);
    for n in [1u32, 1_000, 100_000] {
        let peers: Vec<Arc<Peer>> = (0..n).map(peer).collect();
        let table = RouteTable::compute(&peers, 1, t0);
        // The first boundary after t0: the step a rotator makes then.
        let now = table
            .peers
            .iter()
            .map(|p| p.next_change())
            .min()
            .expect("a peer");
        let due = table
            .peers
            .iter()
            .filter(|p| p.next_change() <= now)
            .count();
        eprintln!("{n} peers: {due} due at the first boundary");
        g.bench_with_input(BenchmarkId::new("rebuild", n), &n, |b, _| {
            b.iter(|| black_box(RouteTable::compute(&peers, 1, now)))
        });
        g.bench_with_input(BenchmarkId::new("delta", n), &n, |b, _| {
            b.iter(|| black_box(RouteTable::advance(&table, &peers, 1, now, &[])))
        });
    }
    g.finish();
}

criterion_group!(benches, rotation);
criterion_main!(benches);
