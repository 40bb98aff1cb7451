//! One configured peer as every thread of the daemon shares it: its stream, its protocol state
//! (`mt6d_proto::link::Link`, behind a lock), the sending key a sealing worker seals with (handed
//! out by the link), and its counters. Its own file because the route table (`routing`) and the
//! link's driver (`session`) both name it, and neither should import the other for it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use arc_swap::ArcSwapOption;
use mt6d_proto::handshake::{Handshake, ReceiveKeys};
use mt6d_proto::icmp::SentLog;
use mt6d_proto::link::KeyStore;
use mt6d_proto::{Sealer, Stream};

use super::counter_state::CounterState;
use super::counters::PeerCounters;
use super::peer_link::PeerLink;

/// One configured peer: its protocol state and counters. Shared by all threads; immutable apart
/// from the atomics inside.
#[derive(Debug)]
pub struct Peer {
    pub name: String,
    pub stream: Stream,
    pub keys: PeerKeys,
    pub counters: PeerCounters,
    /// The protocol state: handshake, key life, route sets (docs/PROTOCOL.md §9.8) and route
    /// moves. Locked by the main thread when its timeout is due and by the receiving worker for a
    /// handshake message, a notice or a new key's first packet, never per data packet.
    pub link: PeerLink,
    /// Notices refused (malformed, bad MAC, outside the window).
    pub notices_refused: AtomicU64,
    /// The peer's external MAC from its authenticated announcement (docs/PROTOCOL.md §5.2,
    /// "Pinned neighbours"), as `1 << 48 | mac`; 0 until one arrived.
    pub lladdr: AtomicU64,
    /// The tunnel payloads a sealing worker sent lately: ICMPv6 errors from the path are believed
    /// only about these, once each (docs/PROTOCOL.md §5).
    pub sent: SentLog,
    /// What the packet threads do to this peer's TCP segments (identity options, MSS).
    pub tcp: super::tcp_policy::PeerTcp,
    /// The receive keys (two slots by phase, their replay windows). Locked by the worker that
    /// receives the peer's datagrams, once per received train, never by the main thread: the
    /// peer's sockets all belong to one worker (`worker`), so the lock is uncontended but for
    /// a handshake message's brief visit.
    pub recv: Mutex<ReceiveKeys>,
    /// The data-plane worker whose epoll watches this peer's sockets; chosen by the rotation
    /// when it first binds a port for the peer, then fixed for the peer's life, so that all of
    /// its epochs arrive at one worker (no reordering across an epoch switch).
    pub worker: OnceLock<usize>,
}

impl Peer {
    /// `link_stream`: a second copy of `stream` for the link (streams are not cloned: each copy
    /// derives its own subkeys). `hs`: the handshake, None with a pre-shared key.
    pub fn new(
        name: String,
        stream: Stream,
        link_stream: Stream,
        keys: PeerKeys,
        hs: Option<Handshake>,
    ) -> Peer {
        let recv = Mutex::new(if keys.handshake {
            ReceiveKeys::new()
        } else {
            ReceiveKeys::single(stream.opener())
        });
        Peer {
            name,
            stream,
            keys,
            counters: PeerCounters::default(),
            link: PeerLink::new(link_stream, hs),
            notices_refused: AtomicU64::new(0),
            lladdr: AtomicU64::new(0),
            sent: SentLog::new(),
            tcp: super::tcp_policy::PeerTcp::new(&Default::default(), &Default::default()),
            recv,
            worker: OnceLock::new(),
        }
    }

    /// The peer's external MAC, once it announced it.
    pub fn lladdr(&self) -> Option<[u8; 6]> {
        let v = self.lladdr.load(std::sync::atomic::Ordering::Relaxed);
        (v != 0).then(|| {
            let b = v.to_be_bytes();
            [b[2], b[3], b[4], b[5], b[6], b[7]]
        })
    }

    /// Records the peer's MAC; true if it changed.
    pub fn set_lladdr(&self, mac: [u8; 6]) -> bool {
        let mut b = [0u8; 8];
        b[1] = 1;
        b[2..].copy_from_slice(&mac);
        let v = u64::from_be_bytes(b);
        self.lladdr.swap(v, std::sync::atomic::Ordering::Relaxed) != v
    }
}

/// One peer's keys, shared by all threads.
#[derive(Debug)]
pub struct PeerKeys {
    /// What a sealing worker seals with. None before the first handshake and after keys expired.
    pub send: ArcSwapOption<Sealer>,
    /// Set by a sealing worker when it has nothing to seal with; taken by the timer.
    pub want: AtomicBool,
    /// Set by the receiving worker when a packet named a key phase it holds no key for (may be forged:
    /// the handshake rate-limits what it does about it); taken by the timer.
    pub empty_slot: AtomicBool,
    /// Set by the timer when keys expired with no rekey; the receiving worker then erases its keys.
    pub erase_recv: AtomicBool,
    /// Keys come from handshakes (else from a pre-shared key).
    pub handshake: bool,
    /// A pre-shared auth/encrypt key's persisted counter reservation (docs/PROTOCOL.md §4.3);
    /// touched only by the main thread's timer.
    pub counter: Option<Mutex<CounterState>>,
}

impl PeerKeys {
    /// A pre-shared session key: one sealer for the daemon's lifetime, no handshake. `counter`:
    /// the sealer's persisted reservation (None in plain mode, which has no counter).
    pub fn pre_shared(sealer: Sealer, counter: Option<CounterState>) -> PeerKeys {
        PeerKeys {
            send: ArcSwapOption::from_pointee(sealer),
            want: AtomicBool::new(false),
            empty_slot: AtomicBool::new(false),
            erase_recv: AtomicBool::new(false),
            handshake: false,
            counter: counter.map(Mutex::new),
        }
    }

    /// Keys from handshakes: none until the first one completes (the link hands them out).
    pub fn handshake() -> PeerKeys {
        PeerKeys {
            send: ArcSwapOption::empty(),
            want: AtomicBool::new(true),
            empty_slot: AtomicBool::new(false),
            erase_recv: AtomicBool::new(false),
            handshake: true,
            counter: None,
        }
    }
}

/// The gateway's publication of a link's keys (the link applies its key changes through it,
/// `Link::poll_event`): the sending key behind the atomic pointer the sealing workers load once
/// per packet, and the receive keys erased by the receiving worker, which holds them, at its
/// next train (the timer that learns of the expiry holds the link's lock, which a worker takes
/// while it holds the receive keys: it must not wait for them).
impl KeyStore for &PeerKeys {
    fn publish_send(&mut self, key: Option<Arc<Sealer>>) {
        let got = key.is_some();
        self.send.store(key);
        if got {
            // Requests raised while there was no key are answered by this handshake.
            self.want.store(false, Ordering::Relaxed);
        }
    }

    fn erase_receive_keys(&mut self) {
        self.erase_recv.store(true, Ordering::Relaxed);
    }
}
