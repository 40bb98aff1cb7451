//! Property test of the endpoint's route index against a plain model: after any sequence of
//! peers added, removed (stale ids included) and windows moved or re-derived over a key space
//! of 8 local (address, port) pairs, so that collisions are frequent, a key is found exactly
//! when one (peer, epoch) of the live windows claims it, and then for that one.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
use std::collections::BTreeMap;
use std::net::{Ipv6Addr, SocketAddrV6};

use mt6d_proto::endpoint::{IndexError, IndexSeed, PeerId, PeerSlab, RouteIndex};
use mt6d_proto::{Epoch, Route};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Add,
    Remove(usize),
    RemoveStale(usize),
    Window { peer: usize, epoch: u64, bump: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => Just(Op::Add),
        1 => any::<usize>().prop_map(Op::Remove),
        1 => any::<usize>().prop_map(Op::RemoveStale),
        4 => (any::<usize>(), 0u64..8, 0u64..3).prop_map(|(peer, epoch, bump)| Op::Window { peer, epoch, bump }),
    ]
}

/// One of 8 local keys, a function of everything a derivation depends on.
fn key(peer: PeerId, e: Epoch, k: u8, salt: u64) -> (Ipv6Addr, u16) {
    let h = (u64::from(peer.index()) * 31
        + u64::from(peer.generation()) * 17
        + e.0 * 7
        + u64::from(k) * 3
        + salt)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        >> 61;
    (
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, (h & 3) as u16),
        2000 + (h >> 2) as u16,
    )
}

/// A peer's window in the model: epoch -> (attempt offset, local key).
type Window = BTreeMap<Epoch, (u8, (Ipv6Addr, u16))>;

fn window(e: u64) -> Vec<Epoch> {
    (e.saturating_sub(1)..=e + 1).map(Epoch).collect()
}

proptest! {
    #[test]
    fn index_agrees_with_a_model(ops in proptest::collection::vec(op(), 1..120), salt in 0u64..1000) {
        let mut ix = RouteIndex::new(IndexSeed::from_bytes([5; 16]));
        let mut slab = PeerSlab::new();
        let mut live: Vec<PeerId> = Vec::new();
        let mut stale: Vec<PeerId> = Vec::new();
        let mut model: BTreeMap<PeerId, Window> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Add => {
                    let id = slab.insert(()).unwrap();
                    let remote = Ipv6Addr::from(0x2001_0db8_00ff_u128 << 80 | u128::from(id.index()) << 32 | u128::from(id.generation()));
                    ix.add_peer(id, "2001:db8::1".parse().unwrap(), remote).unwrap();
                    live.push(id);
                    model.insert(id, BTreeMap::new());
                }
                Op::Remove(i) if !live.is_empty() => {
                    let id = live.swap_remove(i % live.len());
                    slab.remove(id).unwrap();
                    let d = ix.remove_peer(id).unwrap();
                    prop_assert_eq!(d.removed().count(), model.remove(&id).unwrap().len());
                    stale.push(id);
                }
                Op::RemoveStale(i) if !stale.is_empty() => {
                    let id = stale[i % stale.len()];
                    prop_assert_eq!(ix.remove_peer(id), Err(IndexError::UnknownPeer { peer: id }));
                    prop_assert!(ix.send_route(id).is_none());
                }
                Op::Window { peer, epoch, bump } if !live.is_empty() => {
                    let id = live[peer % live.len()];
                    let offset = |e: Epoch| ((e.0 + bump) % 2) as u8;
                    let derive = |e: Epoch, k: u8| {
                        let (a, p) = key(id, e, k, salt);
                        Route { epoch: e, local: SocketAddrV6::new(a, p, 0, 0), remote: SocketAddrV6::new(Ipv6Addr::LOCALHOST, 1, 0, 0) }
                    };
                    let d = ix.set_window(id, Epoch(epoch), offset, derive).unwrap();
                    let m = model.get_mut(&id).unwrap();
                    let before = m.len();
                    m.retain(|e, (k, _)| window(epoch).contains(e) && *k == offset(*e));
                    prop_assert_eq!(d.removed().count(), before - m.len());
                    let mut added = 0;
                    for e in window(epoch) {
                        m.entry(e).or_insert_with(|| { added += 1; (offset(e), key(id, e, offset(e), salt)) });
                    }
                    prop_assert_eq!(d.added().count(), added);
                    prop_assert_eq!(ix.send_route(id).map(|r| r.epoch), Some(Epoch(epoch)));
                }
                _ => {}
            }
            // Every key of the space: found iff exactly one live claim.
            let mut claims: BTreeMap<(Ipv6Addr, u16), Vec<(PeerId, Epoch)>> = BTreeMap::new();
            for (id, w) in &model {
                for (e, (_, k)) in w {
                    claims.entry(*k).or_default().push((*id, *e));
                }
            }
            for h in 0..8u16 {
                let k = (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, h & 3), 2000 + (h >> 2));
                let c = claims.get(&k).map_or(&[][..], Vec::as_slice);
                let expect = if c.len() == 1 { Some(c[0]) } else { None };
                prop_assert_eq!(ix.lookup_local(k.0, k.1), expect);
                prop_assert_eq!(ix.is_contested(k.0, k.1), c.len() > 1);
            }
            prop_assert_eq!(ix.len(), live.len());
        }
    }
}
