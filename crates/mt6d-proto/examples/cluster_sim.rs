//! The arithmetic of several servers sharing one client population (design only;
//! docs/ARCHITECTURE.md "Beyond one server"): 10 servers and 10,000,000 clients by default.
//! Synthetic public keys (BLAKE3 of the index); `mt6d_proto::cluster::owner` decides.
//!
//! Prints: the balance of rendezvous hashing, what one server's failure moves and where to,
//! what an added server takes, the same for `hash mod N` (the naive choice), and how often a
//! router's per-epoch ECMP hash would send a client's packets to the server that holds its
//! session. Run:
//! `cargo run --release -p mt6d-proto --example cluster_sim [CLIENTS [SERVERS]]`

#![allow(clippy::unwrap_used)]
use mt6d_proto::cluster::{owner, score};
use std::time::Instant;

fn key(tag: &str, i: u64) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(tag.as_bytes());
    h.update(&i.to_le_bytes());
    *h.finalize().as_bytes()
}

fn spread(per: &[u64]) -> String {
    let n = per.len() as f64;
    let mean = per.iter().sum::<u64>() as f64 / n;
    let max = *per.iter().max().unwrap() as f64;
    let min = *per.iter().min().unwrap() as f64;
    let sd = (per.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
    format!(
        "mean {mean:.0}, min {min:.0}, max {max:.0}, max/mean {:.5}, sd {sd:.0}",
        max / mean
    )
}

fn main() {
    let mut args = std::env::args().skip(1);
    let clients: u64 = args.next().map_or(10_000_000, |a| a.parse().unwrap());
    let n: usize = args.next().map_or(10, |a| a.parse().unwrap());
    let started = Instant::now();
    let servers: Vec<[u8; 32]> = (0..=n as u64).map(|i| key("server", i)).collect();
    let (base, extra) = servers.split_at(n);
    let dead = 3 % n;
    let mut per = vec![0u64; n];
    let mut per_after_failure = vec![0u64; n];
    let mut orphans_to = vec![0u64; n];
    let mut moved_on_failure = 0u64;
    let mut moved_on_add = 0u64;
    let mut add_from = vec![0u64; n];
    let mut modulo_moved = 0u64;
    // ECMP: per epoch the router's hash of a fresh outer tuple picks a server at random; count
    // the epochs (of 10 per client, for a 1 in 100 sample) that land on the owner.
    let (mut ecmp_epochs, mut ecmp_on_owner) = (0u64, 0u64);
    for c in 0..clients {
        let client = key("client", c);
        let o = owner(&client, base, |_| true).unwrap();
        per[o] += 1;
        let after = owner(&client, base, |i| i != dead).unwrap();
        per_after_failure[after] += 1;
        if o == dead {
            orphans_to[after] += 1;
        } else if after != o {
            moved_on_failure += 1;
        }
        if score(&extra[0], &client) > score(&base[o], &client) {
            moved_on_add += 1;
            add_from[o] += 1;
        }
        let h = u64::from_le_bytes(client[..8].try_into().unwrap());
        let (m_before, m_after) = (h % n as u64, h % (n as u64 - 1));
        // mod N-1 over the survivors, indexed past the dead one.
        let m_after = if m_after >= dead as u64 {
            m_after + 1
        } else {
            m_after
        };
        if m_before != dead as u64 && m_before != m_after {
            modulo_moved += 1;
        }
        if c % 100 == 0 {
            for e in 0..10u64 {
                let tuple = key("outer", c * 10 + e);
                let pick = u64::from_le_bytes(tuple[..8].try_into().unwrap()) % n as u64;
                ecmp_epochs += 1;
                ecmp_on_owner += u64::from(pick == o as u64);
            }
        }
    }
    let orphans = per[dead];
    let live: Vec<u64> = orphans_to
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != dead)
        .map(|(_, &x)| x)
        .collect();
    let survivors: Vec<u64> = per_after_failure
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != dead)
        .map(|(_, &x)| x)
        .collect();
    let p = 1.0 / n as f64;
    println!("{clients} clients, {n} servers (rendezvous hashing, BLAKE3 scores)");
    println!(
        "balance: {} (binomial sd expected {:.0})",
        spread(&per),
        (clients as f64 * p * (1.0 - p)).sqrt()
    );
    println!(
        "server {dead} fails: its {orphans} clients move ({:.2} %), clients of live servers moved: {moved_on_failure}",
        100.0 * orphans as f64 / clients as f64
    );
    println!("  orphans per survivor: {}", spread(&live));
    println!("  load after failure: {}", spread(&survivors));
    println!(
        "server {n} added: {moved_on_add} clients move to it ({:.3} %, 1/{} = {:.3} %); taken per old server: {}",
        100.0 * moved_on_add as f64 / clients as f64,
        n + 1,
        100.0 / (n + 1) as f64,
        spread(&add_from)
    );
    println!(
        "hash mod N instead: server {dead} fails and {modulo_moved} clients of live servers move too ({:.1} % of all)",
        100.0 * modulo_moved as f64 / clients as f64
    );
    println!(
        "router ECMP per epoch: {ecmp_on_owner} of {ecmp_epochs} sampled epochs reach the owner ({:.1} %; 1/N = {:.1} %): the rest would cross to the owner inside the cluster",
        100.0 * ecmp_on_owner as f64 / ecmp_epochs as f64,
        100.0 * p
    );
    println!("({:.1} s)", started.elapsed().as_secs_f64());
}
