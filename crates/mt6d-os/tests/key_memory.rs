//! No key material is left in freed heap memory by the protocol crate's key holders: a global
//! allocator that inspects every block as it is freed looks for a known key's bytes.
//!
//! This test lives in the OS crate because a global allocator needs `unsafe`, which the protocol
//! crate forbids; it drives `mt6d-proto` only through its public API and recomputes the data keys
//! from docs/PROTOCOL.md §2.3. The controls show that the watch sees a key that is not wiped, so a
//! holder that stopped wiping would fail here.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use mt6d_proto::handshake::{Handshake, HandshakeConfig, Outcome, PrivateKey, Psk};
use mt6d_proto::{AeadAlg, Endpoint, Epoch, Mode, SessionKey, Stream, StreamConfig};
use ring::aead::{LessSafeKey, UnboundKey, AES_256_GCM, CHACHA20_POLY1305};

const NEEDLE_LEN: usize = 16;

/// Passes every call to the system allocator; while armed, counts freed blocks holding the needle.
struct Watch;

static ARMED: AtomicBool = AtomicBool::new(false);
static NEEDLE: [AtomicU8; NEEDLE_LEN] = [const { AtomicU8::new(0) }; NEEDLE_LEN];
static HITS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `System` with the caller's arguments unchanged; `dealloc`
// only reads the block it is handed (valid for `layout.size()` bytes until it is freed) first.
unsafe impl GlobalAlloc for Watch {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged (the caller upholds `GlobalAlloc::alloc`'s contract).
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if ARMED.load(Ordering::Acquire) && layout.size() >= NEEDLE_LEN {
            let mut needle = [0u8; NEEDLE_LEN];
            for (n, a) in needle.iter_mut().zip(&NEEDLE) {
                *n = a.load(Ordering::Relaxed);
            }
            // SAFETY: `ptr` was allocated with `layout` and is still live: size() bytes readable.
            let block = unsafe { std::slice::from_raw_parts(ptr, layout.size()) };
            if block.windows(NEEDLE_LEN).any(|w| w == needle) {
                HITS.fetch_add(1, Ordering::Relaxed);
            }
        }
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Watch = Watch;

/// One watch at a time: the needle is global.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `f` with `needle` watched; returns how many freed blocks held it.
fn freed_blocks_holding(needle: &[u8], f: impl FnOnce()) -> usize {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (a, b) in NEEDLE.iter().zip(needle) {
        a.store(*b, Ordering::Relaxed);
    }
    HITS.store(0, Ordering::Relaxed);
    ARMED.store(true, Ordering::Release);
    f();
    ARMED.store(false, Ordering::Release);
    HITS.load(Ordering::Relaxed)
}

fn low() -> Endpoint {
    Endpoint::new("2001:db8:a::1".parse().unwrap())
}
fn high() -> Endpoint {
    Endpoint::new("2001:db8:b::2".parse().unwrap())
}
const EPOCH: Epoch = Epoch(170_000_000);

fn session_key() -> SessionKey {
    SessionKey::from_bytes(&[0x3c; 32]).unwrap()
}

/// docs/PROTOCOL.md §2.3: dataKey = BLAKE3-derive_key(ctx(alg), key || mode || senderRole ||
/// senderTrue || receiverTrue).
fn data_key(alg: AeadAlg, mode: Mode, role: u8, sender: Ipv6Addr, receiver: Ipv6Addr) -> [u8; 32] {
    let ctx = match alg {
        AeadAlg::Aes256Gcm => "mt6d-proto 2026-11-23 stream data key aes256-gcm",
        AeadAlg::ChaCha20Poly1305 => "mt6d-proto 2026-11-23 stream data key chacha20-poly1305",
    };
    let mode = match mode {
        Mode::Auth => 1u8,
        Mode::Encrypt => 2,
        _ => unreachable!("AEAD modes only"),
    };
    let mut h = blake3::Hasher::new_derive_key(ctx);
    h.update(&[0x3c; 32]);
    h.update(&[mode, role]);
    h.update(&sender.octets());
    h.update(&receiver.octets());
    *h.finalize().as_bytes()
}

fn ring_key(alg: AeadAlg, key: &[u8; 32]) -> LessSafeKey {
    let a = match alg {
        AeadAlg::Aes256Gcm => &AES_256_GCM,
        _ => &CHACHA20_POLY1305,
    };
    LessSafeKey::new(UnboundKey::new(a, key).unwrap())
}

#[test]
fn a_ring_key_schedule_dropped_as_is_is_seen_by_the_watch() {
    // The control: the first 16 bytes of an AES-256 key are its first round key, and ChaCha20's
    // key is kept as is, so an unwiped schedule shows the needle when its block is freed.
    for alg in [AeadAlg::Aes256Gcm, AeadAlg::ChaCha20Poly1305] {
        let key = [0xa7u8; 32];
        let hits = freed_blocks_holding(&key[..NEEDLE_LEN], || {
            drop(std::hint::black_box(Box::new(ring_key(alg, &key))));
        });
        assert!(hits >= 1, "{alg:?}: the watch must see an unwiped schedule");
    }
}

#[test]
fn sealers_and_openers_leave_no_data_key_in_freed_memory() {
    for alg in [AeadAlg::Aes256Gcm, AeadAlg::ChaCha20Poly1305] {
        for mode in [Mode::Auth, Mode::Encrypt] {
            let (lo, hi) = (low(), high());
            let send = data_key(alg, mode, 0, lo.true_addr, hi.true_addr);
            let recv = data_key(alg, mode, 1, hi.true_addr, lo.true_addr);
            let mut c = StreamConfig::new(lo, hi, session_key());
            c.mode = mode;
            c.aead = alg;
            let stream = Stream::new(c).unwrap();
            let route = stream.route(EPOCH);
            for (needle, label) in [(send, "send"), (recv, "receive")] {
                let hits = freed_blocks_holding(&needle[..NEEDLE_LEN], || {
                    // Several, so that some are freed after others reused their blocks.
                    for _ in 0..8 {
                        let sealer = stream.sealer(0, u64::MAX);
                        let mut out = [0u8; 64];
                        sealer.seal_keepalive(&route, &mut out).unwrap();
                        drop(sealer);
                        drop(stream.opener());
                    }
                });
                assert_eq!(
                    hits, 0,
                    "{alg:?} {mode:?}: the {label} key's schedule was left"
                );
            }
        }
    }
}

#[test]
fn handshakes_leave_no_pre_shared_key_in_freed_memory() {
    let psk = [0x5eu8; 32];
    let private = |b: u8| PrivateKey::from_bytes([b; 32]);
    let config = |me: u8, peer: u8, local: &Endpoint, remote: &Endpoint| HandshakeConfig {
        local_private: private(me),
        remote_public: private(peer).public_key(),
        psk: Psk::from_bytes(psk),
        mode: Mode::Encrypt,
        aead: AeadAlg::Aes256Gcm,
        local_true: local.true_addr,
        remote_true: remote.true_addr,
        rekey_after: Duration::from_secs(120),
        rekey_after_packets: 1 << 20,
    };
    let hits = freed_blocks_holding(&psk[..NEEDLE_LEN], || {
        let (lo, hi) = (low(), high());
        let mut a = Handshake::new(config(1, 2, &lo, &hi)).unwrap();
        let mut b = Handshake::new(config(2, 1, &hi, &lo)).unwrap();
        let link = a.link_key().clone();
        let (sa, sb) = (
            Stream::new(StreamConfig::new(lo, hi, link.clone())).unwrap(),
            Stream::new(StreamConfig::new(hi, lo, link)).unwrap(),
        );
        let (ra, rb) = (sa.route(EPOCH), sb.route(EPOCH));
        let mut t = sa.epoch_start(EPOCH);
        // Retries that stay pending, answered ones, and rekeys: states are created, moved
        // between pending slots and dropped in every way the handshake does it.
        for round in 0..6u8 {
            a.want_handshake();
            let init = a.poll(t, &ra, 0, || Some([round; 32])).unwrap();
            if round % 2 == 0 {
                let Outcome::Responded { reply, .. } = b
                    .handle(t, &rb, &rb, &init, || Some([0x80 | round; 32]))
                    .unwrap()
                else {
                    panic!("b answers");
                };
                assert!(matches!(
                    a.handle(t, &ra, &ra, &reply, || None).unwrap(),
                    Outcome::Completed { .. }
                ));
            }
            t = mt6d_proto::UnixTime::from_millis(t.as_millis() + 1500);
        }
        drop((a, b));
    });
    assert_eq!(hits, 0, "a copy of the pre-shared key was freed unwiped");
}
