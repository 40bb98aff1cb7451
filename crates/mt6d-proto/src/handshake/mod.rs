//! The authenticated key exchange (docs/PROTOCOL.md §9): Noise `IKpsk2_25519_ChaChaPoly_BLAKE2s`
//! (WireGuard's pattern, through the `snow` crate) carried in the tunnel's own UDP packets at the
//! current epoch's hashed addresses and ports, with a route-bound MAC keyed by the key of the
//! route set the message travels on (the link key, or a session's route key: docs/PROTOCOL.md
//! §9.8), so a packet from anyone who does not hold an identity key of this pair is rejected by
//! one BLAKE3.
//!
//! Sans-IO like the rest of the crate: time and 32 bytes of entropy come in as arguments; messages
//! go out as byte arrays for the caller to send on the route it is given.
//!
//! One [`Handshake`] per peer. The caller
//! * derives the stream's address key from [`Handshake::link_key`];
//! * calls [`Handshake::poll`] on a timer (every ~100 ms) and sends what it returns on the current
//!   send route;
//! * hands every received handshake message to [`Handshake::handle`], installs the keys of the
//!   [`Outcome`] (receive keys at once, a responder's send key only once [`ReceiveKeys::open`]
//!   reports the new phase confirmed) and sends the reply or, as initiator, a keepalive;
//! * calls [`Handshake::want_handshake`] when it has no send key, and
//!   [`Handshake::packet_for_empty_slot`] when a packet arrives for a key phase it does not hold
//!   (rate-limited: such a packet may be forged).

mod exchange;
mod identity;
mod keys;
mod mac;
mod message;
mod rng;
mod state;
mod timers;

use std::collections::HashMap;
use std::net::Ipv6Addr;
use std::time::Duration;

use snow::params::NoiseParams;

use exchange::{Bucket, Pending};
pub use mac::{verify_link_mac, MacKey};

pub use identity::{
    link_key, link_key_with_public, session_route_key, PrivateKey, Psk, PublicKey, KEY_LEN,
};
pub use keys::{FrameKeys, Opened, ReceiveKeys, SlotState};
pub(crate) use message::mac as message_mac;
pub use message::{is_handshake, Kind, Message, INITIATION_LEN, RESPONSE_LEN};

use crate::tunnel::KeyPhase;
use crate::{AeadAlg, Epoch, Mode, Opener, ProtoError, Sealer, SessionKey, UnixTime};

/// The Noise protocol name (WireGuard's).
pub const NOISE_PARAMS: &str = "Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s";
/// An unanswered initiation is followed by a new one (new ephemeral key and index) after this
/// long, doubling per attempt up to [`RETRY_MAX`], plus up to a quarter more of random jitter.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest wait between two initiations of one handshake.
pub const RETRY_MAX: Duration = Duration::from_secs(4);
/// The longest wait between two initiations of a handshake started because the peer stopped
/// answering our data ([`Handshake::liveness_failed`], docs/PROTOCOL.md §9.9): a restarted peer
/// is answered again within this (plus the quarter of jitter) of being back.
pub const RECOVERY_RETRY_MAX: Duration = Duration::from_secs(2);
/// An initiation stays answerable this long after it was sent, whatever newer ones followed, so a
/// round trip longer than the retry interval still completes (with the first answer that
/// arrives).
pub const PENDING_LIFETIME: Duration = Duration::from_secs(10);
/// At most this many initiations are answerable at once (the oldest is forgotten first).
pub const MAX_PENDING: usize = 8;
/// How far in the future a peer's initiation timestamp may be. A later one is refused
/// (`hs_future_timestamp`): accepted, it would block every initiation of the peer after a
/// restart until the peer's clock passed it. The two gateways' clocks must agree much better
/// than this anyway for their epochs to match.
pub const MAX_FUTURE_SKEW: Duration = Duration::from_secs(60);
/// A packet naming an empty key slot asks for a handshake at most this often (it may be forged:
/// 32 bytes with the other phase bit cost an attacker nothing).
pub const EMPTY_SLOT_HOLDOFF: Duration = Duration::from_secs(5);
/// The side that loses simultaneous initiations rekeys this much later.
const NON_PREFERRED_REKEY_DELAY: Duration = Duration::from_secs(2);
/// How long a receive key stays usable after a newer one is confirmed, for packets in flight: the
/// peer keeps sending under it for up to a round trip after our side confirmed, and those packets
/// take another one-way trip. 5 s covers the round trips [`PENDING_LIFETIME`] lets handshakes
/// complete at (finding: 2 s lost packets at a 2 s round trip).
pub const OLD_KEY_GRACE: Duration = Duration::from_secs(5);
/// Keys are no longer used this many rekey intervals after their handshake if no newer handshake
/// succeeded (WireGuard's reject-after-time, scaled to `rekey_after`).
pub const REJECT_AFTER_REKEYS: u32 = 3;
/// Initiations a responder processes (one Diffie-Hellman each) per second and peer, burst included.
pub const RESPONSES_PER_SEC: u32 = 10;
/// Ephemeral keys remembered (each for the lifetime of the route it arrived on) to reject replayed
/// messages before any Diffie-Hellman. Only messages with a valid MAC are remembered, which only
/// the peer can produce, so this bound is never reached in practice; if it is, the oldest epochs
/// are forgotten first and the rate limit still bounds DH work.
const SEEN_EPHEMERALS: usize = 4096;

/// The handshake settings of one peer.
#[derive(Debug, Clone)]
pub struct HandshakeConfig {
    /// This gateway's identity key.
    pub local_private: PrivateKey,
    /// The peer's identity key.
    pub remote_public: PublicKey,
    /// Optional extra pre-shared key ([`Psk::none`] if not configured).
    pub psk: Psk,
    /// Auth or encrypt (plain has no counter or tag, so it has no session keys).
    pub mode: Mode,
    /// AEAD of the data keys.
    pub aead: AeadAlg,
    /// The local protected host (the stream's local true address).
    pub local_true: Ipv6Addr,
    /// The remote protected host.
    pub remote_true: Ipv6Addr,
    /// Rekey interval (thesis `regen_interval`, 000 Table 3.1).
    pub rekey_after: Duration,
    /// Rekey after this many packets under one send key.
    pub rekey_after_packets: u64,
}

/// Why a handshake message was rejected. Each variant is a counter label ([`HandshakeError::reason`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// First byte is not a known handshake type.
    #[error("unknown handshake message type")]
    UnknownType,
    /// Wrong length or non-zero reserved bytes.
    #[error("handshake message has the wrong length or reserved bits")]
    BadLength,
    /// The route-bound MAC did not verify: not from a holder of this pair's keys, or replayed on
    /// another route (epoch).
    #[error("handshake MAC did not verify")]
    BadMac,
    /// A message whose ephemeral key was already processed (a replay), rejected before any DH.
    #[error("replayed handshake message")]
    Replayed,
    /// An initiation whose timestamp is not newer than the newest accepted one (a replay).
    #[error("initiation timestamp not newer than the last one accepted")]
    StaleTimestamp,
    /// An initiation dated more than [`MAX_FUTURE_SKEW`] after our clock.
    #[error("initiation timestamp too far in the future")]
    FutureTimestamp,
    /// Noise processing failed (wrong static key, tampering, or a response to an older attempt).
    #[error("Noise handshake message did not decrypt")]
    Decrypt,
    /// The decrypted payload is malformed.
    #[error("handshake payload malformed")]
    BadPayload,
    /// More initiations than [`RESPONSES_PER_SEC`]: dropped before any DH.
    #[error("initiation rate limit reached")]
    RateLimited,
    /// Both sides initiated; this side's initiation wins (lower public key), the peer's is ignored.
    #[error("simultaneous initiation: ours wins")]
    Simultaneous,
    /// A response whose index names no initiation of ours in flight (checked before any DH).
    #[error("response without a pending initiation")]
    UnexpectedResponse,
    /// The caller had no randomness for the response's ephemeral key.
    #[error("no randomness for a response")]
    NoEntropy,
    /// A handshake message for a peer keyed by a pre-shared key, which makes no handshakes.
    #[error("handshake message for a peer with a pre-shared key")]
    NotKeyed,
}

impl HandshakeError {
    /// Every variant, in counter order.
    pub const ALL: [HandshakeError; 13] = [
        Self::UnknownType,
        Self::BadLength,
        Self::BadMac,
        Self::Replayed,
        Self::StaleTimestamp,
        Self::FutureTimestamp,
        Self::Decrypt,
        Self::BadPayload,
        Self::RateLimited,
        Self::Simultaneous,
        Self::UnexpectedResponse,
        Self::NoEntropy,
        Self::NotKeyed,
    ];
    /// A stable label for counters.
    pub const fn reason(self) -> &'static str {
        match self {
            Self::UnknownType => "hs_unknown_type",
            Self::BadLength => "hs_bad_length",
            Self::BadMac => "hs_bad_mac",
            Self::Replayed => "hs_replayed",
            Self::StaleTimestamp => "hs_stale_timestamp",
            Self::FutureTimestamp => "hs_future_timestamp",
            Self::Decrypt => "hs_decrypt",
            Self::BadPayload => "hs_bad_payload",
            Self::RateLimited => "hs_rate_limited",
            Self::Simultaneous => "hs_simultaneous",
            Self::UnexpectedResponse => "hs_unexpected_response",
            Self::NoEntropy => "hs_no_entropy",
            Self::NotKeyed => "hs_not_keyed",
        }
    }
    const fn index(self) -> usize {
        match self {
            Self::UnknownType => 0,
            Self::BadLength => 1,
            Self::BadMac => 2,
            Self::Replayed => 3,
            Self::StaleTimestamp => 4,
            Self::FutureTimestamp => 5,
            Self::Decrypt => 6,
            Self::BadPayload => 7,
            Self::RateLimited => 8,
            Self::Simultaneous => 9,
            Self::UnexpectedResponse => 10,
            Self::NoEntropy => 11,
            Self::NotKeyed => 12,
        }
    }
}

/// What a peer's handshakes have done, for `mt6d status`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandshakeStats {
    /// Handshakes completed (as initiator, or confirmed as responder).
    pub completed: u64,
    /// Of those, the ones that replaced existing keys.
    pub rekeys: u64,
    /// Initiations sent (retries included).
    pub initiations_sent: u64,
    /// Responses sent.
    pub responses_sent: u64,
    /// When the newest keys were established.
    pub last_completed: Option<UnixTime>,
    /// Handshakes started because the peer answered none of our data (§9.9).
    pub liveness_failures: u64,
    /// Rejected messages per [`HandshakeError::ALL`] entry.
    pub failures: [u64; HandshakeError::ALL.len()],
}

impl HandshakeStats {
    /// `(reason, count)` for every reason with a non-zero count.
    pub fn failures_by_reason(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        HandshakeError::ALL
            .iter()
            .zip(self.failures)
            .filter(|(_, n)| *n > 0)
            .map(|(e, n)| (e.reason(), n))
    }
}

/// New data keys from a handshake.
#[derive(Debug)]
pub struct SessionKeys {
    /// Seals this gateway's packets (under the peer's chosen receive phase).
    pub send: Sealer,
    /// Opens the peer's packets (under our chosen receive phase).
    pub recv: Opener,
    /// The session's route key ([`session_route_key`]): the key of the route set the session's
    /// data travels on from its activation epoch (docs/PROTOCOL.md §9.8).
    pub route: SessionKey,
    /// The epoch of the route the answered initiation travelled on: the session's route set is
    /// activated two epochs later (§9.8). Both sides know it without a byte on the wire.
    pub initiation_epoch: Epoch,
}

/// What handling a handshake message produced.
#[derive(Debug)]
pub enum Outcome {
    /// We answered an initiation: send `reply` on the current send route; install `keys.recv` now;
    /// use `keys.send` only once the peer confirmed (a packet opened with `keys.recv`); until then
    /// keep sending with the old key, if any.
    Responded {
        /// The response to send.
        reply: [u8; RESPONSE_LEN],
        /// The new keys.
        keys: SessionKeys,
    },
    /// Our initiation was answered: install both keys now and send a keepalive (or data) with
    /// `keys.send` so the peer confirms.
    Completed {
        /// The new keys.
        keys: SessionKeys,
        /// Whether these keys replace earlier ones.
        rekey: bool,
    },
}

/// The handshake state of one peer.
pub struct Handshake {
    cfg: HandshakeConfig,
    params: NoiseParams,
    link: SessionKey,
    mac_key: MacKey,
    prologue: [u8; 64],
    /// Our initiation wins a simultaneous exchange (our public key is the lower one).
    preferred: bool,
    /// Our initiations still answerable, oldest first.
    pending: Vec<Pending>,
    /// Initiations made since the last completed handshake (sets the retry interval).
    attempts: u32,
    /// When the next initiation of an unfinished handshake is due.
    retry_at: Option<UnixTime>,
    /// When a packet for an empty key slot last asked for a handshake.
    empty_slot_at: Option<UnixTime>,
    /// The newest initiation timestamp accepted from the peer.
    peer_timestamp: u64,
    /// The newest timestamp we sent (kept strictly increasing).
    own_timestamp: u64,
    /// Every ephemeral key sent or received with a valid MAC, with the epoch of its route.
    seen: HashMap<[u8; 32], Epoch>,
    /// Phase of our newest confirmed receive key.
    confirmed_recv: Option<KeyPhase>,
    /// Responder: the receive phase installed and not yet confirmed.
    awaiting: Option<KeyPhase>,
    /// Responder: whether the awaited keys replace earlier ones.
    awaiting_rekey: bool,
    /// Responder: when we last answered an initiation (the peer's handshake is under way).
    answered_at: Option<UnixTime>,
    /// When the newest confirmed keys were established.
    established: Option<UnixTime>,
    want: bool,
    /// Never initiates ([`Handshake::set_responder_only`]).
    responder_only: bool,
    /// The handshake under way was started because the peer stopped answering
    /// ([`Handshake::liveness_failed`]): its initiations go on the link set, retried sooner.
    recovering: bool,
    bucket: Bucket,
    stats: HandshakeStats,
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake")
            .field("local", &self.cfg.local_private.public_key())
            .field("remote", &self.cfg.remote_public)
            .field("preferred", &self.preferred)
            .field("pending", &self.pending.len())
            .field("established", &self.established)
            .finish_non_exhaustive()
    }
}

impl Handshake {
    /// Validates the keys and derives the link and MAC keys.
    pub fn new(cfg: HandshakeConfig) -> Result<Handshake, ProtoError> {
        let link = link_key(
            &cfg.local_private,
            &cfg.remote_public,
            &cfg.psk,
            (cfg.local_true, cfg.remote_true),
        )?;
        Handshake::with_link_key(cfg, link)
    }

    /// [`Handshake::new`] with the link key already computed ([`link_key`] of the same
    /// `cfg`): saves its X25519 where the caller keeps the link key anyway (a server's
    /// million clients, each indexed by its link set, docs/ARCHITECTURE.md "The server role").
    /// A link key of other keys gives MACs the peer refuses: nothing completes.
    pub fn with_link_key(cfg: HandshakeConfig, link: SessionKey) -> Result<Handshake, ProtoError> {
        if cfg.local_private.public_key() == cfg.remote_public {
            return Err(ProtoError::SamePublicKey);
        }
        if cfg.mode == Mode::Plain {
            return Err(ProtoError::HandshakeNeedsAead);
        }
        if cfg.rekey_after < Duration::from_secs(1) {
            return Err(ProtoError::RekeyTooShort {
                ms: cfg.rekey_after.as_millis(),
            });
        }
        let mac_key = MacKey::derive(&link);
        // NOISE_PARAMS is a constant the snow crate supports; a parse failure is a build defect.
        #[allow(clippy::expect_used)]
        let params: NoiseParams = NOISE_PARAMS.parse().expect("supported Noise pattern");
        // The prologue binds both true addresses (lower first), so a handshake of one stream is
        // useless for another stream between the same two gateways.
        let mut prologue = [0u8; 64];
        prologue[..32].copy_from_slice(b"mt6d-proto 2026-11-21 handshake ");
        let (lo, hi) = if cfg.local_true < cfg.remote_true {
            (cfg.local_true, cfg.remote_true)
        } else {
            (cfg.remote_true, cfg.local_true)
        };
        prologue[32..48].copy_from_slice(&lo.octets());
        prologue[48..].copy_from_slice(&hi.octets());
        let preferred = cfg.local_private.public_key() < cfg.remote_public;
        Ok(Handshake {
            cfg,
            params,
            link,
            mac_key,
            prologue,
            preferred,
            pending: Vec::new(),
            attempts: 0,
            retry_at: None,
            empty_slot_at: None,
            peer_timestamp: 0,
            own_timestamp: 0,
            seen: HashMap::new(),
            confirmed_recv: None,
            awaiting: None,
            awaiting_rekey: false,
            answered_at: None,
            established: None,
            want: true,
            responder_only: false,
            recovering: false,
            bucket: Bucket {
                milli: Bucket::FULL,
                at: UnixTime::from_nanos(0),
            },
            stats: HandshakeStats::default(),
        })
    }

    /// The key the stream derives hashed addresses, ports and jitter from (§9.1).
    pub fn link_key(&self) -> &SessionKey {
        &self.link
    }

    /// Counters and the time of the newest keys.
    pub fn stats(&self) -> &HandshakeStats {
        &self.stats
    }

    /// The index of our newest answerable initiation (for tests and fuzzing).
    pub fn pending_index(&self) -> Option<u32> {
        self.pending.last().map(|p| p.index)
    }

    /// Initiations sent since the last completed handshake (0 when none is under way).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether this side wins simultaneous initiations.
    pub fn is_preferred_initiator(&self) -> bool {
        self.preferred
    }

    /// When the newest confirmed keys were established (None before the first handshake).
    pub fn established_at(&self) -> Option<UnixTime> {
        self.established
    }

    /// Whether keys established at `established` must no longer be used at `now`.
    pub fn keys_expired(&self, now: UnixTime) -> bool {
        let limit = self.cfg.rekey_after * REJECT_AFTER_REKEYS;
        self.established.is_some_and(|at| {
            now.as_nanos().saturating_sub(at.as_nanos()) > limit.as_nanos() as u64
        })
    }

    /// This side only answers: it never initiates, neither the first handshake nor a rekey nor
    /// on a packet for an empty key slot; its keys still expire ([`Handshake::keys_expired`]).
    /// For a server whose clients always initiate (docs/ARCHITECTURE.md, "The server role"):
    /// a server initiating to a million clients, most of them idle, would be a storm of
    /// unanswered messages.
    pub fn set_responder_only(&mut self) {
        self.responder_only = true;
        self.want = false;
    }

    /// Whether [`Handshake::set_responder_only`] was called.
    pub fn is_responder_only(&self) -> bool {
        self.responder_only
    }

    /// Whether the handshake under way was started by [`Handshake::liveness_failed`].
    pub fn recovering(&self) -> bool {
        self.recovering
    }
}

fn elapsed(from: UnixTime, to: UnixTime) -> Duration {
    Duration::from_nanos(to.as_nanos().saturating_sub(from.as_nanos()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::testutil::{addr, pair, A, B};
    use crate::Epoch;

    pub(crate) fn configs(psk: Psk) -> (HandshakeConfig, HandshakeConfig) {
        let a = PrivateKey::generate([0x11; 32]);
        let b = PrivateKey::generate([0x22; 32]);
        let base = |local: &PrivateKey, remote: &PrivateKey, lt, rt| HandshakeConfig {
            local_private: local.clone(),
            remote_public: remote.public_key(),
            psk: psk.clone(),
            mode: Mode::Encrypt,
            aead: AeadAlg::Aes256Gcm,
            local_true: lt,
            remote_true: rt,
            rekey_after: Duration::from_secs(120),
            rekey_after_packets: 1 << 40,
        };
        (
            base(&a, &b, addr(A), addr(B)),
            base(&b, &a, addr(B), addr(A)),
        )
    }

    #[test]
    fn a_responder_only_side_answers_but_never_initiates_and_its_keys_expire() {
        let (ca, cb) = configs(Psk::none());
        let (mut a, mut b) = (Handshake::new(ca).unwrap(), Handshake::new(cb).unwrap());
        b.set_responder_only();
        let (sa, sb) = pair(Mode::Encrypt, AeadAlg::Aes256Gcm);
        let (ra, rb) = (sa.route(Epoch(5)), sb.route(Epoch(5)));
        let t = UnixTime::from_secs(1_800_000_000);
        // No keys, a packet for an empty slot, a forced wish: still nothing from b.
        assert!(b.packet_for_empty_slot(t));
        b.want_handshake();
        assert!(b.poll(t, &rb, 0, || Some([4; 32])).is_none());
        assert_eq!(b.poll_timeout(false), None);
        // The link MAC check a server makes before it keeps any state for a client.
        let init = a.poll(t, &ra, 0, || Some([1; 32])).unwrap();
        assert!(verify_link_mac(b.link_key(), &rb, &init));
        assert!(!verify_link_mac(b.link_key(), &sb.route(Epoch(6)), &init));
        let mut forged = init;
        forged[40] ^= 1;
        assert!(!verify_link_mac(b.link_key(), &rb, &forged));
        assert!(!verify_link_mac(b.link_key(), &rb, &init[..100]));
        let Outcome::Responded { reply, keys } =
            b.handle(t, &rb, &rb, &init, || Some([2; 32])).unwrap()
        else {
            panic!("responder answers")
        };
        assert!(matches!(
            a.handle(t, &ra, &ra, &reply, || Some([3; 32])),
            Ok(Outcome::Completed { .. })
        ));
        let phase = keys.recv.phase().unwrap();
        assert!(b.confirm(t, phase));
        // Established: the rekey time passes and b still waits for a; only expiry is timed.
        let later = UnixTime::from_secs(1_800_000_000 + 200);
        assert!(b.poll(later, &rb, 0, || Some([5; 32])).is_none());
        let expiry = b.poll_timeout(true).unwrap();
        assert!(expiry > later && !b.keys_expired(later));
        assert!(b.keys_expired(expiry));
    }

    #[test]
    fn one_round_trip_gives_matching_keys_both_ways() {
        let (ca, cb) = configs(Psk::from_bytes([3; 32]));
        let (mut a, mut b) = (Handshake::new(ca).unwrap(), Handshake::new(cb).unwrap());
        assert_eq!(a.link_key().as_bytes(), b.link_key().as_bytes());
        let (sa, sb) = pair(Mode::Encrypt, AeadAlg::Aes256Gcm);
        let (ra, rb) = (sa.route(Epoch(5)), sb.route(Epoch(5)));
        let t = UnixTime::from_secs(1_800_000_000);
        let init = a
            .poll(t, &ra, 0, || Some([1; 32]))
            .expect("no keys yet: initiate");
        assert!(
            a.poll(t, &ra, 0, || Some([1; 32])).is_none(),
            "one in flight"
        );
        let Outcome::Responded { reply, keys: kb } =
            b.handle(t, &rb, &rb, &init, || Some([2; 32])).unwrap()
        else {
            panic!("responder answers")
        };
        let Outcome::Completed { keys: ka, rekey } =
            a.handle(t, &ra, &ra, &reply, || Some([3; 32])).unwrap()
        else {
            panic!("initiator completes")
        };
        assert!(!rekey);
        let pkt = crate::testutil::udp(addr(A), addr(B), b"hello");
        let mut wire = [0u8; 256];
        let mut out = [0u8; 256];
        let n = ka.send.seal(&ra, &pkt, &mut wire).unwrap();
        let mut recv_b = kb.recv;
        assert_eq!(recv_b.open(&rb, &wire[..n], &mut out).unwrap(), pkt.len());
        assert!(b.confirm(t, recv_b.phase().unwrap()));
        let back = crate::testutil::udp(addr(B), addr(A), b"world");
        let n = kb.send.seal(&rb, &back, &mut wire).unwrap();
        let mut recv_a = ka.recv;
        assert_eq!(recv_a.open(&ra, &wire[..n], &mut out).unwrap(), back.len());
        assert_eq!(a.stats().completed, 1);
        assert_eq!(b.stats().completed, 1);
        // The same initiation again: rejected before any DH.
        assert_eq!(
            b.handle(t, &rb, &rb, &init, || Some([4; 32])).unwrap_err(),
            HandshakeError::Replayed
        );
    }

    /// A rekey on a session's route set (§9.8): the messages carry that set's MAC, a message
    /// framed with the link set's MAC on the same route is refused, and both sides learn the
    /// epoch the initiation travelled on.
    #[test]
    fn a_handshake_on_a_session_set_uses_its_mac_and_reports_the_initiation_epoch() {
        let (ca, cb) = configs(Psk::none());
        let (mut a, mut b) = (Handshake::new(ca).unwrap(), Handshake::new(cb).unwrap());
        let (sa, sb) = pair(Mode::Encrypt, AeadAlg::Aes256Gcm);
        let set = SessionKey::from_bytes(&[0x42; 32]).unwrap();
        let (sa, sb) = (sa.with_route_key(&set), sb.with_route_key(&set));
        let mac = MacKey::derive(&set);
        let (ra, rb) = (sa.route(Epoch(9)), sb.route(Epoch(9)));
        let t = UnixTime::from_secs(1_800_000_000);
        let init = a.poll_on(t, &ra, Some(&mac), 0, || Some([1; 32])).unwrap();
        assert_eq!(
            b.handle(t, &rb, &rb, &init, || Some([2; 32])).unwrap_err(),
            HandshakeError::BadMac,
            "the link set's MAC key does not verify a session set's message"
        );
        let Outcome::Responded { reply, keys: kb } = b
            .handle_on(t, &rb, &rb, Some(&mac), &init, || Some([2; 32]))
            .unwrap()
        else {
            panic!("responder answers")
        };
        assert_eq!(kb.initiation_epoch, Epoch(9));
        assert!(a.handle(t, &ra, &ra, &reply, || None).is_err());
        let Outcome::Completed { keys: ka, .. } = a
            .handle_on(t, &ra, &ra, Some(&mac), &reply, || None)
            .unwrap()
        else {
            panic!("initiator completes")
        };
        assert_eq!(ka.initiation_epoch, Epoch(9));
        assert_eq!(ka.route.as_bytes(), kb.route.as_bytes());
    }

    /// Finding 3: a response that fails (here: valid MAC, right index, garbage Noise, as only a
    /// key holder could make, or a replay of an answer to this attempt) leaves the attempt
    /// answerable; a response naming no attempt is refused before any Noise work.
    #[test]
    fn a_failed_response_keeps_the_attempt_and_indices_are_checked_first() {
        let (ca, cb) = configs(Psk::none());
        let (mut a, mut b) = (Handshake::new(ca).unwrap(), Handshake::new(cb).unwrap());
        let (sa, sb) = pair(Mode::Encrypt, AeadAlg::Aes256Gcm);
        let (ra, rb) = (sa.route(Epoch(5)), sb.route(Epoch(5)));
        let t = UnixTime::from_secs(1_800_000_000);
        let init = a.poll(t, &ra, 0, || Some([1; 32])).unwrap();
        let index = a.pending_index().unwrap();
        assert_eq!(Message::new_checked(&init).unwrap().index(), index);
        let Outcome::Responded { reply, .. } =
            b.handle(t, &rb, &rb, &init, || Some([2; 32])).unwrap()
        else {
            panic!("responder answers")
        };
        assert_eq!(Message::new_checked(&reply).unwrap().index(), index);
        let junk = a.frame_with_mac(Kind::Response, index, &[7; 49], &ra.remote, &ra.local);
        assert_eq!(
            a.handle(t, &ra, &ra, &junk, || None).unwrap_err(),
            HandshakeError::Decrypt
        );
        let stray = a.frame_with_mac(Kind::Response, index ^ 1, &[8; 49], &ra.remote, &ra.local);
        assert_eq!(
            a.handle(t, &ra, &ra, &stray, || None).unwrap_err(),
            HandshakeError::UnexpectedResponse
        );
        assert!(matches!(
            a.handle(t, &ra, &ra, &reply, || None).unwrap(),
            Outcome::Completed { .. }
        ));
    }

    /// Finding 7: an initiation dated beyond the allowed skew is refused and does not raise the
    /// timestamp a restarted peer must beat.
    #[test]
    fn future_timestamps_are_refused_and_block_nothing() {
        let (ca, cb) = configs(Psk::none());
        let (mut a, mut b) = (
            Handshake::new(ca.clone()).unwrap(),
            Handshake::new(cb).unwrap(),
        );
        let (sa, sb) = pair(Mode::Encrypt, AeadAlg::Aes256Gcm);
        let (ra, rb) = (sa.route(Epoch(5)), sb.route(Epoch(5)));
        let t = UnixTime::from_secs(1_800_000_000);
        let ahead = UnixTime::from_nanos(t.as_nanos() + MAX_FUTURE_SKEW.as_nanos() as u64 + 1);
        let init = a.poll(ahead, &ra, 0, || Some([1; 32])).unwrap();
        assert_eq!(
            b.handle(t, &rb, &rb, &init, || Some([2; 32])).unwrap_err(),
            HandshakeError::FutureTimestamp
        );
        // The peer restarts with its clock corrected: accepted at once.
        let mut a = Handshake::new(ca).unwrap();
        let init = a.poll(t, &ra, 0, || Some([3; 32])).unwrap();
        assert!(b.handle(t, &rb, &rb, &init, || Some([4; 32])).is_ok());
    }

    /// Retries back off from [`RETRY_AFTER`] doubling to [`RETRY_MAX`] with up to a quarter of
    /// jitter, and older attempts stay answerable for [`PENDING_LIFETIME`].
    #[test]
    fn retries_back_off_and_old_attempts_stay_answerable() {
        let (ca, _) = configs(Psk::none());
        let mut a = Handshake::new(ca).unwrap();
        let (sa, _) = pair(Mode::Encrypt, AeadAlg::Aes256Gcm);
        let ra = sa.route(Epoch(5));
        let t0 = 1_800_000_000_000u64;
        let mut sent = Vec::new();
        for ms in (0..40_000).step_by(10) {
            let now = UnixTime::from_millis(t0 + ms);
            if a.poll(now, &ra, 0, || Some([ms as u8; 32])).is_some() {
                sent.push(ms);
            }
        }
        let gaps: Vec<u64> = sent.windows(2).map(|w| w[1] - w[0]).collect();
        assert!((1000..=1250).contains(&gaps[0]), "{gaps:?}");
        assert!((2000..=2500).contains(&gaps[1]), "{gaps:?}");
        assert!(
            gaps[2..].iter().all(|g| (4000..=5000).contains(g)),
            "{gaps:?}"
        );
        assert!(a.pending.len() >= 2 && a.pending.len() <= MAX_PENDING);
        assert!(a
            .pending
            .iter()
            .all(|p| elapsed(p.sent_at, UnixTime::from_millis(t0 + 39_990)) < PENDING_LIFETIME));
    }

    #[test]
    fn plain_mode_and_short_rekey_are_refused() {
        let (mut c, _) = configs(Psk::none());
        c.mode = Mode::Plain;
        assert_eq!(
            Handshake::new(c).unwrap_err(),
            ProtoError::HandshakeNeedsAead
        );
        let (mut c, _) = configs(Psk::none());
        c.rekey_after = Duration::from_millis(10);
        assert!(matches!(
            Handshake::new(c).unwrap_err(),
            ProtoError::RekeyTooShort { .. }
        ));
    }

    #[test]
    fn reasons_are_distinct_and_indexed_in_order() {
        for (i, e) in HandshakeError::ALL.iter().enumerate() {
            assert_eq!(e.index(), i);
        }
        let s: std::collections::HashSet<_> =
            HandshakeError::ALL.iter().map(|e| e.reason()).collect();
        assert_eq!(s.len(), HandshakeError::ALL.len());
    }
}
