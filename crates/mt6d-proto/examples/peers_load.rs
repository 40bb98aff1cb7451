//! How long a server takes to load its peers file (the goal: a million clients "in seconds"):
//! parsing N lines with `mt6d_proto::peers_file`, then building the `PeerTable` (a `Stream` per
//! client, its accept window derived and indexed, its deadline scheduled).
//!
//! As in `benches/endpoint.rs`, each stream gets a pre-shared session key (here the client's
//! public key bytes stand in for it), so the figure leaves out the X25519 of a real link key
//! (docs/PROTOCOL.md §9.1); that is timed separately on the first `--x25519` lines (default
//! 10,000) and extrapolated.
//!
//! Run: `cargo run --release -p mt6d-proto --example peers_load -- [LINES] [--x25519 N]`

#![allow(clippy::unwrap_used)] // an example: a failed unwrap is a failed run
use std::fmt::Write as _;
use std::net::Ipv6Addr;
use std::time::Instant;

use base64::Engine as _;
use mt6d_proto::endpoint::{IndexSeed, PeerTable};
use mt6d_proto::handshake::{link_key, PrivateKey, Psk};
use mt6d_proto::{peers_file, Endpoint, SessionKey, Stream, StreamConfig, UnixTime};

const SERVER_TRUE: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xa, 0, 0, 0, 0, 1);

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn key(i: u64, salt: u64) -> [u8; 32] {
    let mut k = [0u8; 32];
    for (j, c) in k.chunks_mut(8).enumerate() {
        c.copy_from_slice(&splitmix(i ^ salt ^ ((j as u64) << 56)).to_le_bytes());
    }
    k
}

/// A peers file of `n` clients, every other one with a psk, a comment every 1,000 lines.
fn peers_text(n: u64) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut t = String::with_capacity(n as usize * 120);
    for i in 0..n {
        if i % 1000 == 0 {
            writeln!(t, "# clients {i}..").unwrap();
        }
        let addr = Ipv6Addr::from((0x2001_0db8_000b_u128 << 80) | u128::from(i + 1));
        write!(t, "client-{i}\t{}\t{addr}", b64.encode(key(i, 1))).unwrap();
        if i % 2 == 0 {
            write!(t, "\t{}", b64.encode(key(i, 2))).unwrap();
        }
        t.push('\n');
    }
    t
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut lines = 1_000_000u64;
    let mut x25519 = 10_000usize;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--x25519" => x25519 = args.next().unwrap().parse().unwrap(),
            n => lines = n.parse().unwrap(),
        }
    }
    let text = peers_text(lines);
    println!(
        "peers file: {lines} clients, {:.1} MiB",
        text.len() as f64 / f64::from(1 << 20)
    );

    let t = Instant::now();
    let entries = peers_file::parse(&text).unwrap();
    let parse_s = t.elapsed().as_secs_f64();
    assert_eq!(entries.len() as u64, lines);
    println!(
        "parse: {parse_s:.2} s ({:.0} ns per line)",
        parse_s * 1e9 / lines as f64
    );

    let now = UnixTime::from_millis(1_700_000_000_000);
    let t = Instant::now();
    let mut table = PeerTable::with_capacity(IndexSeed::from_bytes([0x42; 16]), entries.len());
    for e in &entries {
        let cfg = StreamConfig::new(
            Endpoint::new(SERVER_TRUE),
            Endpoint::new(e.true_addr),
            SessionKey::from_bytes(e.public_key.as_bytes()).unwrap(),
        );
        table.add(Stream::new(cfg).unwrap(), now, |_| 0).unwrap();
    }
    let build_s = t.elapsed().as_secs_f64();
    println!(
        "build PeerTable (pre-shared keys): {build_s:.2} s ({:.0} ns per client); parse + build: {:.2} s",
        build_s * 1e9 / lines as f64,
        parse_s + build_s
    );

    let n = x25519.min(entries.len());
    if n > 0 {
        let server = PrivateKey::from_bytes(key(u64::MAX, 3));
        let t = Instant::now();
        for e in &entries[..n] {
            let psk = e.psk.clone().unwrap_or_else(Psk::none);
            std::hint::black_box(
                link_key(&server, &e.public_key, &psk, (SERVER_TRUE, e.true_addr)).unwrap(),
            );
        }
        let per = t.elapsed().as_secs_f64() / n as f64;
        println!(
            "link keys (X25519 + BLAKE3), first {n}: {:.1} us each, {:.1} s for {lines} on one core",
            per * 1e6,
            per * lines as f64
        );
    }
}
