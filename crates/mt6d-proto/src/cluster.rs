//! Which server of a cluster owns a client (docs/ARCHITECTURE.md "Beyond one server"; design
//! groundwork for several servers sharing clients; the server role runs one server).
//!
//! Several servers that share one client population each hold every client's public key, so
//! each could derive every client's hashed addresses; session state (handshake keys, replay
//! windows) lives on one of them. Which one is decided by rendezvous hashing (highest random
//! weight), computed alike by the client and by every server from public values only: for each
//! server a score `H(server key, client key)`, and the live server with the highest score owns
//! the client. When a server fails only its own clients move, and they spread evenly over the
//! others; a server added takes an even share from every other and nothing else moves.
//!
//! The router's own ECMP hash cannot do this job: it hashes the outer addresses and ports,
//! which MT6D changes every epoch so that epochs cannot be linked, so it would send a client to
//! another server at almost every rotation.

/// BLAKE3 key-derivation context of the scores (domain separation from every other use of
/// BLAKE3 in the protocol).
const CONTEXT: &str = "mt6d 2026-11-26 cluster owner score v1";

/// The rendezvous score of `client` at `server` (their static public keys): the first 8 bytes
/// of `BLAKE3-derive_key(CONTEXT, server || client)`, little-endian.
pub fn score(server: &[u8; 32], client: &[u8; 32]) -> u64 {
    let mut h = blake3::Hasher::new_derive_key(CONTEXT);
    h.update(server);
    h.update(client);
    let mut out = [0u8; 8];
    h.finalize_xof().fill(&mut out);
    u64::from_le_bytes(out)
}

/// The index in `servers` of the server that owns `client` among those for which `alive` is
/// true: the highest score, the lower index on a tie. None if no server is alive.
pub fn owner(
    client: &[u8; 32],
    servers: &[[u8; 32]],
    alive: impl Fn(usize) -> bool,
) -> Option<usize> {
    servers
        .iter()
        .enumerate()
        .filter(|&(i, _)| alive(i))
        .map(|(i, s)| (score(s, client), std::cmp::Reverse(i)))
        .max()
        .map(|(_, std::cmp::Reverse(i))| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tag: u8, i: u32) -> [u8; 32] {
        let mut k = [tag; 32];
        k[..4].copy_from_slice(&i.to_le_bytes());
        k
    }

    #[test]
    fn the_score_is_fixed_by_the_two_keys_and_their_order() {
        let (s, c) = (key(1, 0), key(2, 0));
        assert_eq!(score(&s, &c), score(&s, &c));
        assert_ne!(score(&s, &c), score(&c, &s));
        assert_ne!(score(&s, &c), score(&s, &key(2, 1)));
    }

    #[test]
    fn a_failed_server_moves_only_its_own_clients_and_spreads_them() {
        let servers: Vec<[u8; 32]> = (0..10).map(|i| key(0xa0, i)).collect();
        let clients: Vec<[u8; 32]> = (0..20_000).map(|i| key(0xc0, i)).collect();
        let before: Vec<usize> = clients
            .iter()
            .map(|c| owner(c, &servers, |_| true).unwrap())
            .collect();
        let mut per = [0usize; 10];
        for &o in &before {
            per[o] += 1;
        }
        // 2,000 each expected; binomial sd 42: 6 sd either side.
        assert!(per.iter().all(|&n| (1_750..=2_250).contains(&n)), "{per:?}");
        let dead = 3;
        let mut took = [0usize; 10];
        for (c, &was) in clients.iter().zip(&before) {
            let now = owner(c, &servers, |i| i != dead).unwrap();
            if was == dead {
                assert_ne!(now, dead);
                took[now] += 1;
            } else {
                assert_eq!(now, was, "a client of a live server moved");
            }
        }
        assert_eq!(took[dead], 0);
        let orphans = per[dead];
        // Each of the 9 survivors takes about a ninth (222) of them.
        assert!(
            took.iter()
                .enumerate()
                .filter(|&(i, _)| i != dead)
                .all(|(_, &n)| n * 9 > orphans / 2 && n * 9 < orphans * 2),
            "{took:?} of {orphans}"
        );
        assert_eq!(owner(&clients[0], &servers, |_| false), None);
    }

    #[test]
    fn an_added_server_takes_only_from_the_others_and_nothing_else_moves() {
        let mut servers: Vec<[u8; 32]> = (0..10).map(|i| key(0xa0, i)).collect();
        let clients: Vec<[u8; 32]> = (0..11_000).map(|i| key(0xc0, i)).collect();
        let before: Vec<usize> = clients
            .iter()
            .map(|c| owner(c, &servers, |_| true).unwrap())
            .collect();
        servers.push(key(0xa0, 10));
        let mut moved = 0;
        for (c, &was) in clients.iter().zip(&before) {
            let now = owner(c, &servers, |_| true).unwrap();
            if now != was {
                assert_eq!(now, 10, "a client moved between two old servers");
                moved += 1;
            }
        }
        // 1,000 expected (1/11).
        assert!((800..=1_200).contains(&moved), "{moved}");
    }
}
