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

mod identity;
mod keys;
mod message;
mod rng;
mod state;

use std::collections::HashMap;
use std::net::Ipv6Addr;
use std::time::Duration;

use snow::params::NoiseParams;
use zeroize::Zeroizing;

use state::NoiseState;

pub use identity::{
    link_key, link_key_with_public, session_route_key, PrivateKey, Psk, PublicKey, KEY_LEN,
};
pub use keys::{FrameKeys, Opened, ReceiveKeys, SlotState};
pub(crate) use message::mac as message_mac;
pub use message::{is_handshake, Kind, Message, INITIATION_LEN, RESPONSE_LEN};

use crate::tunnel::KeyPhase;
use crate::{AeadAlg, Epoch, Mode, Opener, ProtoError, Route, Sealer, SessionKey, UnixTime};
use message::{frame, INITIATION_PAYLOAD_LEN, NOISE_INITIATION_LEN, NOISE_RESPONSE_LEN};

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

/// The key of the route-bound MAC on handshake messages (docs/PROTOCOL.md §9.3), one per route
/// set (§9.8): a message travels on a route of one set and carries that set's MAC.
#[derive(Clone)]
pub struct MacKey(Zeroizing<[u8; 32]>);

impl MacKey {
    /// The MAC key of the route set keyed by `key` (the link key, or a session's route key).
    pub fn derive(key: &SessionKey) -> MacKey {
        MacKey(Zeroizing::new(blake3::derive_key(
            identity::context::MAC,
            key.as_bytes(),
        )))
    }
}

impl std::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MacKey([redacted])")
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

struct Pending {
    index: u32,
    /// The epoch of the route the initiation was sent on.
    epoch: Epoch,
    state: NoiseState,
    recv_phase: KeyPhase,
    sent_at: UnixTime,
}

/// A token bucket over [`RESPONSES_PER_SEC`], in milli-tokens.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    milli: u64,
    at: UnixTime,
}

impl Bucket {
    const FULL: u64 = RESPONSES_PER_SEC as u64 * 1000;
    fn take(&mut self, now: UnixTime) -> bool {
        let elapsed_ms = now.as_millis().saturating_sub(self.at.as_millis());
        self.milli = (self.milli + elapsed_ms * u64::from(RESPONSES_PER_SEC)).min(Self::FULL);
        self.at = now;
        if self.milli >= 1000 {
            self.milli -= 1000;
            true
        } else {
            false
        }
    }
}

/// Whether `bytes` (header protection removed) is a well-formed handshake message carrying a
/// valid MAC of the link set keyed by `link` for the route it `arrived_on` (§9.3): one BLAKE3,
/// no state. Lets a server with a million idle clients keep no handshake state for a client
/// until one of its messages proves to come from a holder of the link key.
pub fn verify_link_mac(link: &SessionKey, arrived_on: &Route, bytes: &[u8]) -> bool {
    let Ok(msg) = Message::new_checked(bytes) else {
        return false;
    };
    let key = MacKey::derive(link);
    msg.verify_mac(&key.0, &arrived_on.remote, &arrived_on.local)
        .is_ok()
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
        let link = link_key(&cfg.local_private, &cfg.remote_public, &cfg.psk)?;
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

    /// Frames arbitrary Noise bytes as a message of `kind` with `index` from `src` to `dst` with
    /// this pair's valid MAC: for fuzzing and tests, which must reach the Noise layer behind the
    /// MAC. The bytes are cut or zero-padded to the kind's Noise length.
    pub fn frame_with_mac(
        &self,
        kind: Kind,
        index: u32,
        noise: &[u8],
        src: &std::net::SocketAddrV6,
        dst: &std::net::SocketAddrV6,
    ) -> Vec<u8> {
        let (len, noise_len) = match kind {
            Kind::Initiation => (INITIATION_LEN, NOISE_INITIATION_LEN),
            Kind::Response => (RESPONSE_LEN, NOISE_RESPONSE_LEN),
        };
        let mut body = vec![0u8; noise_len];
        let n = noise.len().min(noise_len);
        body[..n].copy_from_slice(&noise[..n]);
        let mut out = vec![0u8; len];
        frame(kind, index, &body, &self.mac_key.0, src, dst, &mut out);
        out
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

    /// The peer answered none of our data for the liveness bound (docs/PROTOCOL.md §9.9): it
    /// probably lost our session (a restart). An initiation is due at once, and this handshake's
    /// initiations go on the link set ([`Handshake::recovering`]) with retries at most
    /// [`RECOVERY_RETRY_MAX`] apart, until one completes. Returns whether it started one (not
    /// when answering only, nor while such a handshake is already under way).
    pub fn liveness_failed(&mut self) -> bool {
        if self.responder_only || self.recovering {
            return false;
        }
        self.recovering = true;
        self.want = true;
        self.retry_at = None;
        self.stats.liveness_failures += 1;
        true
    }

    /// Whether the handshake under way was started by [`Handshake::liveness_failed`].
    pub fn recovering(&self) -> bool {
        self.recovering
    }

    /// Ask for a handshake at the next [`Handshake::poll`] (no send key). Retries of a handshake
    /// already under way keep their backoff.
    pub fn want_handshake(&mut self) {
        self.want = true;
    }

    /// The path to the peer just came up (over relays: the first route to its edge gateway,
    /// docs/PROTOCOL.md §10.5). Without keys, an unfinished handshake's next initiation is due
    /// at once and its backoff starts again: the attempts so far were sent where nothing could
    /// arrive. With keys, or answering only, nothing changes.
    pub fn path_up(&mut self) {
        if self.responder_only || self.established.is_some() {
            return;
        }
        self.attempts = 0;
        self.retry_at = None;
        self.want = true;
    }

    /// A packet arrived for a key phase we hold no key for (`open_no_key`). Such a packet is 32
    /// forged bytes away for anyone, so it asks for a handshake only if no fresh confirmed key
    /// exists (newer than the rekey interval) and none was asked for this way in the last
    /// [`EMPTY_SLOT_HOLDOFF`]. Returns whether it asked.
    pub fn packet_for_empty_slot(&mut self, now: UnixTime) -> bool {
        let fresh = self.confirmed_recv.is_some()
            && self
                .established
                .is_some_and(|at| elapsed(at, now) < self.cfg.rekey_after);
        let recent = self
            .empty_slot_at
            .is_some_and(|at| elapsed(at, now) < EMPTY_SLOT_HOLDOFF);
        if fresh || recent {
            return false;
        }
        self.empty_slot_at = Some(now);
        self.want = true;
        true
    }

    /// The initiation to send on `send_route` now, if one is due: no keys yet, keys wanted, the
    /// rekey interval or packet budget reached (`sent` = packets under the current send key), or
    /// the retry time of an unanswered handshake reached ([`RETRY_AFTER`] doubling to
    /// [`RETRY_MAX`], with jitter). Older initiations stay answerable for [`PENDING_LIFETIME`].
    /// `entropy` gives 32 fresh random bytes and is called only when an initiation is made (None:
    /// no randomness, no initiation).
    pub fn poll(
        &mut self,
        now: UnixTime,
        send_route: &Route,
        sent: u64,
        entropy: impl FnOnce() -> Option<[u8; 32]>,
    ) -> Option<[u8; INITIATION_LEN]> {
        self.poll_on(now, send_route, None, sent, entropy)
    }

    /// [`Handshake::poll`] for a route of the route set whose MAC key is `mac` (None: the link
    /// set's, docs/PROTOCOL.md §9.8).
    pub fn poll_on(
        &mut self,
        now: UnixTime,
        send_route: &Route,
        mac: Option<&MacKey>,
        sent: u64,
        entropy: impl FnOnce() -> Option<[u8; 32]>,
    ) -> Option<[u8; INITIATION_LEN]> {
        if !self.initiation_due(now, sent) {
            return None;
        }
        let initiation = self.initiate(now, send_route, mac, entropy()?).ok();
        // The Noise message left the ephemeral key and chaining values in frames below this one.
        crate::secrets::scrub_stack();
        initiation
    }

    /// Whether [`Handshake::poll_on`] would make an initiation at `now` (`sent`: packets under
    /// the current send key). Forgets initiations older than [`PENDING_LIFETIME`]. Lets a caller
    /// build the route only when one is due.
    pub fn initiation_due(&mut self, now: UnixTime, sent: u64) -> bool {
        self.pending
            .retain(|p| elapsed(p.sent_at, now) < PENDING_LIFETIME);
        if self.responder_only {
            return false;
        }
        if self.retry_at.is_some_and(|at| now < at) {
            return false;
        }
        // We answered the peer's initiation and wait for its first packet: its handshake is the
        // one under way (a second one would race it). If our answer was lost, the peer retries.
        if self.awaiting.is_some()
            && self
                .answered_at
                .is_some_and(|at| elapsed(at, now) < PENDING_LIFETIME)
        {
            return false;
        }
        self.retry_at.is_some()
            || self.want
            || sent >= self.cfg.rekey_after_packets
            || self
                .established
                .is_none_or(|at| elapsed(at, now) >= self.rekey_interval())
    }

    /// The earliest instant at which [`Handshake::initiation_due`] can turn true without a new
    /// input (a message, [`Handshake::want_handshake`]), or at which keys expire
    /// ([`Handshake::keys_expired`], counted only while `holds_keys`). `UnixTime` 0 means at
    /// once. The packet budget (`rekey_after_packets`) is not a time: callers check it when
    /// they poll.
    pub fn poll_timeout(&self, holds_keys: bool) -> Option<UnixTime> {
        let after = |at: UnixTime, d: Duration| {
            UnixTime::from_nanos(at.as_nanos().saturating_add(d.as_nanos() as u64))
        };
        if self.responder_only {
            // Only the keys' expiry is a time.
            let limit = self.cfg.rekey_after * REJECT_AFTER_REKEYS + Duration::from_nanos(1);
            return self
                .established
                .filter(|_| holds_keys)
                .map(|at| after(at, limit));
        }
        // Nothing can be due before these gates open.
        let mut gate = self.retry_at.unwrap_or(UnixTime::from_nanos(0));
        if self.awaiting.is_some() {
            if let Some(at) = self.answered_at {
                gate = gate.max(after(at, PENDING_LIFETIME));
            }
        }
        let due = match self.established {
            _ if self.retry_at.is_some() || self.want => UnixTime::from_nanos(0),
            None => UnixTime::from_nanos(0),
            Some(at) => after(at, self.rekey_interval()),
        };
        let mut next = gate.max(due);
        if holds_keys {
            if let Some(at) = self.established {
                // keys_expired is strict: the first instant past the limit.
                let limit = self.cfg.rekey_after * REJECT_AFTER_REKEYS + Duration::from_nanos(1);
                next = next.min(after(at, limit));
            }
        }
        Some(next)
    }

    /// The preferred initiator rekeys first; the other side waits a little longer so the two do
    /// not race every time.
    fn rekey_interval(&self) -> Duration {
        if self.preferred {
            self.cfg.rekey_after
        } else {
            self.cfg.rekey_after + NON_PREFERRED_REKEY_DELAY
        }
    }

    fn builder(&self, entropy: [u8; 32]) -> snow::Builder<'_> {
        snow::Builder::with_resolver(
            self.params.clone(),
            Box::new(rng::EntropyResolver::new(entropy)),
        )
    }

    fn initiate(
        &mut self,
        now: UnixTime,
        route: &Route,
        mac: Option<&MacKey>,
        entropy: [u8; 32],
    ) -> Result<[u8; INITIATION_LEN], snow::Error> {
        let private = self.cfg.local_private.to_bytes();
        let state = self
            .builder(entropy)
            .local_private_key(&private[..])?
            .remote_public_key(self.cfg.remote_public.as_bytes())?
            .prologue(&self.prologue)?
            .build_initiator()?;
        let mut state = NoiseState::new(state, self.cfg.psk.as_bytes())?;
        let recv_phase = self.next_recv_phase();
        // The index and the jitter come from the same entropy as the ephemeral key, through a
        // separate derivation (the ephemeral's own stream is `rng::EntropyResolver`'s).
        let extra =
            blake3::derive_key("mt6d-proto 2026-11-23 handshake index and jitter", &entropy);
        let index = u32::from_be_bytes([extra[0], extra[1], extra[2], extra[3]]);
        let jitter = u64::from(u16::from_be_bytes([extra[4], extra[5]]));
        self.own_timestamp = self.own_timestamp.saturating_add(1).max(now.as_nanos());
        let mut payload = [0u8; INITIATION_PAYLOAD_LEN];
        payload[..8].copy_from_slice(&self.own_timestamp.to_be_bytes());
        payload[8] = recv_phase.index() as u8;
        let mut noise = [0u8; NOISE_INITIATION_LEN];
        let n = state.write_message(&payload, &mut noise)?;
        debug_assert_eq!(n, NOISE_INITIATION_LEN);
        let mut out = [0u8; INITIATION_LEN];
        frame(
            Kind::Initiation,
            index,
            &noise,
            &mac.unwrap_or(&self.mac_key).0,
            &route.local,
            &route.remote,
            &mut out,
        );
        self.remember(&noise[..32], route.epoch);
        // An index still in use (chance 2^-32) would make the older attempt unreachable: drop it.
        self.pending.retain(|p| p.index != index);
        if self.pending.len() >= MAX_PENDING {
            self.pending.remove(0);
        }
        self.pending.push(Pending {
            index,
            epoch: route.epoch,
            state,
            recv_phase,
            sent_at: now,
        });
        self.attempts = self.attempts.saturating_add(1);
        let cap = if self.recovering {
            RECOVERY_RETRY_MAX
        } else {
            RETRY_MAX
        };
        let base = RETRY_AFTER
            .saturating_mul(1 << self.attempts.saturating_sub(1).min(8))
            .min(cap);
        // Jitter: up to a quarter of the interval, so two gateways that failed together do not
        // retry in lockstep.
        let extra_ns = (base.as_nanos() as u64 / 4).saturating_mul(jitter) / 65_536;
        self.retry_at = Some(UnixTime::from_nanos(
            now.as_nanos()
                .saturating_add(base.as_nanos() as u64)
                .saturating_add(extra_ns),
        ));
        self.want = false;
        self.stats.initiations_sent += 1;
        Ok(out)
    }

    /// The handshake is done (completed, or the peer's won): no more retries.
    fn settle(&mut self) {
        self.pending.clear();
        self.recovering = false;
        self.attempts = 0;
        self.retry_at = None;
        self.want = false;
    }

    /// New receive keys go to the slot the newest confirmed key does not use.
    fn next_recv_phase(&self) -> KeyPhase {
        self.confirmed_recv.map_or(KeyPhase::Zero, KeyPhase::flip)
    }

    /// Remembers an ephemeral key sent or received on a route of `epoch`. A route is accepted
    /// from the epoch before its own to the one after (§3), so entries two epochs older than the
    /// newest can no longer pass a MAC and are forgotten.
    fn remember(&mut self, ephemeral: &[u8], epoch: Epoch) {
        let mut key = [0u8; 32];
        key.copy_from_slice(ephemeral);
        let newest = self
            .seen
            .values()
            .map(|e| e.0)
            .max()
            .unwrap_or(0)
            .max(epoch.0);
        self.seen.retain(|_, e| e.0.saturating_add(2) >= newest);
        if self.seen.len() >= SEEN_EPHEMERALS {
            let oldest = self.seen.values().map(|e| e.0).min().unwrap_or(0);
            self.seen.retain(|_, e| e.0 != oldest);
        }
        self.seen.insert(key, epoch);
    }

    fn seen(&self, ephemeral: &[u8]) -> bool {
        <&[u8; 32]>::try_from(ephemeral).is_ok_and(|k| self.seen.contains_key(k))
    }

    /// Handles a handshake message that arrived on accept route `arrived_on` (its outer source is
    /// `arrived_on.remote`). A response, if any, is framed for `reply_route` (the current send
    /// route). `entropy` is called only for a message that passed every cheap check and needs a
    /// response. Every rejection is counted in [`Handshake::stats`].
    pub fn handle(
        &mut self,
        now: UnixTime,
        arrived_on: &Route,
        reply_route: &Route,
        bytes: &[u8],
        entropy: impl FnOnce() -> Option<[u8; 32]>,
    ) -> Result<Outcome, HandshakeError> {
        self.handle_on(now, arrived_on, reply_route, None, bytes, entropy)
    }

    /// [`Handshake::handle`] for a message that arrived on a route of the route set whose MAC
    /// key is `mac` (None: the link set's); the reply, if any, is framed with the same key, for a
    /// route of the same set (docs/PROTOCOL.md §9.8).
    pub fn handle_on(
        &mut self,
        now: UnixTime,
        arrived_on: &Route,
        reply_route: &Route,
        mac: Option<&MacKey>,
        bytes: &[u8],
        entropy: impl FnOnce() -> Option<[u8; 32]>,
    ) -> Result<Outcome, HandshakeError> {
        let r = self.handle_inner(now, arrived_on, reply_route, mac, bytes, entropy);
        // Noise reads and writes, and the new keys' schedules, left copies in frames below this
        // one (also when the message was refused half-way).
        crate::secrets::scrub_stack();
        if let Err(e) = r {
            self.stats.failures[e.index()] += 1;
        }
        r
    }

    fn handle_inner(
        &mut self,
        now: UnixTime,
        arrived_on: &Route,
        reply_route: &Route,
        mac: Option<&MacKey>,
        bytes: &[u8],
        entropy: impl FnOnce() -> Option<[u8; 32]>,
    ) -> Result<Outcome, HandshakeError> {
        let msg = Message::new_checked(bytes)?;
        // A copy (zeroized on drop): handshake messages are rare, and `self` is borrowed below.
        let mac = mac.unwrap_or(&self.mac_key).clone();
        msg.verify_mac(&mac.0, &arrived_on.remote, &arrived_on.local)?;
        if self.seen(msg.ephemeral()) {
            return Err(HandshakeError::Replayed);
        }
        // Remembered before any other check or Diffie-Hellman: whatever happens to this message
        // (stale, rate-limited, a lost race), its replays cost one hash and one lookup.
        self.remember(msg.ephemeral(), arrived_on.epoch);
        match msg.kind() {
            Kind::Initiation => {
                self.respond(now, &msg, arrived_on.epoch, reply_route, &mac, entropy)
            }
            Kind::Response => self.complete(now, &msg),
        }
    }

    fn respond(
        &mut self,
        now: UnixTime,
        msg: &Message<'_>,
        initiation_epoch: Epoch,
        reply_route: &Route,
        mac: &MacKey,
        entropy: impl FnOnce() -> Option<[u8; 32]>,
    ) -> Result<Outcome, HandshakeError> {
        if !self.pending.is_empty() && self.preferred {
            return Err(HandshakeError::Simultaneous);
        }
        if !self.bucket.take(now) {
            return Err(HandshakeError::RateLimited);
        }
        let entropy = entropy().ok_or(HandshakeError::NoEntropy)?;
        let private = self.cfg.local_private.to_bytes();
        let mut state = self
            .builder(entropy)
            .local_private_key(&private[..])
            .and_then(|b| b.prologue(&self.prologue))
            .and_then(|b| b.build_responder())
            .and_then(|state| NoiseState::new(state, self.cfg.psk.as_bytes()))
            .map_err(|_| HandshakeError::Decrypt)?;
        let mut payload = [0u8; INITIATION_PAYLOAD_LEN + 16];
        let n = state
            .read_message(msg.noise(), &mut payload)
            .map_err(|_| HandshakeError::Decrypt)?;
        if state.get_remote_static() != Some(&self.cfg.remote_public.as_bytes()[..]) {
            // The MAC key is shared by this pair only, so this takes a thief of our own key.
            return Err(HandshakeError::Decrypt);
        }
        if n != INITIATION_PAYLOAD_LEN {
            return Err(HandshakeError::BadPayload);
        }
        let mut ts = [0u8; 8];
        ts.copy_from_slice(&payload[..8]);
        let ts = u64::from_be_bytes(ts);
        let send_phase = KeyPhase::from_byte(payload[8]).ok_or(HandshakeError::BadPayload)?;
        if ts <= self.peer_timestamp {
            return Err(HandshakeError::StaleTimestamp);
        }
        if ts
            > now
                .as_nanos()
                .saturating_add(MAX_FUTURE_SKEW.as_nanos() as u64)
        {
            return Err(HandshakeError::FutureTimestamp);
        }
        self.peer_timestamp = ts;
        // Our own initiations lose (or there are none): the peer's handshake goes ahead.
        self.settle();
        let recv_phase = self.next_recv_phase();
        let mut noise = [0u8; NOISE_RESPONSE_LEN];
        let written = state
            .write_message(&[recv_phase.index() as u8], &mut noise)
            .map_err(|_| HandshakeError::Decrypt)?;
        debug_assert_eq!(written, NOISE_RESPONSE_LEN);
        self.remember(&noise[..32], reply_route.epoch);
        let hash = handshake_hash(&state);
        let (i2r, r2i) = state.dangerously_get_raw_split();
        let (i2r, r2i) = (Zeroizing::new(i2r), Zeroizing::new(r2i));
        drop(state);
        let route = session_route_key(&i2r, &r2i, &hash);
        let mut reply = [0u8; RESPONSE_LEN];
        frame(
            Kind::Response,
            msg.index(),
            &noise,
            &mac.0,
            &reply_route.local,
            &reply_route.remote,
            &mut reply,
        );
        self.awaiting = Some(recv_phase);
        self.answered_at = Some(now);
        self.awaiting_rekey = self.established.is_some();
        self.stats.responses_sent += 1;
        let keys = self.keys(&r2i, send_phase, &i2r, recv_phase, route, initiation_epoch);
        Ok(Outcome::Responded { reply, keys })
    }

    fn complete(&mut self, now: UnixTime, msg: &Message<'_>) -> Result<Outcome, HandshakeError> {
        // The index names the attempt: a response to none of ours costs no Diffie-Hellman.
        let Some(at) = self.pending.iter().position(|p| p.index == msg.index()) else {
            return Err(HandshakeError::UnexpectedResponse);
        };
        let mut payload = [0u8; 1 + 16];
        // A failed read leaves the attempt as it was (snow restores its symmetric state), so
        // the genuine response can still complete it.
        let n = self.pending[at]
            .state
            .read_message(msg.noise(), &mut payload)
            .map_err(|_| HandshakeError::Decrypt)?;
        let send_phase = match (n, KeyPhase::from_byte(payload[0])) {
            (1, Some(p)) => p,
            // Authenticated by the peer's keys yet malformed: the peer is broken; the attempt is
            // spent, retries continue on their timer.
            _ => {
                self.pending.remove(at);
                return Err(HandshakeError::BadPayload);
            }
        };
        let mut pending = self.pending.remove(at);
        let hash = handshake_hash(&pending.state);
        let (i2r, r2i) = pending.state.dangerously_get_raw_split();
        let (i2r, r2i) = (Zeroizing::new(i2r), Zeroizing::new(r2i));
        let recv_phase = pending.recv_phase;
        let initiation_epoch = pending.epoch;
        drop(pending);
        let route = session_route_key(&i2r, &r2i, &hash);
        let rekey = self.established.is_some();
        self.confirmed_recv = Some(recv_phase);
        self.awaiting = None;
        self.established = Some(now);
        self.settle();
        self.stats.completed += 1;
        self.stats.rekeys += u64::from(rekey);
        self.stats.last_completed = Some(now);
        let keys = self.keys(&i2r, send_phase, &r2i, recv_phase, route, initiation_epoch);
        Ok(Outcome::Completed { keys, rekey })
    }

    /// Responder: the peer sent a packet under the receive key of phase `phase` ([`Opened::confirmed`]
    /// reports it): the handshake is complete, the send key of [`Outcome::Responded`] may be used.
    /// Returns whether `phase` was the one awaited.
    pub fn confirm(&mut self, now: UnixTime, phase: KeyPhase) -> bool {
        if self.awaiting != Some(phase) {
            return false;
        }
        self.awaiting = None;
        self.confirmed_recv = Some(phase);
        self.established = Some(now);
        self.settle();
        self.stats.completed += 1;
        self.stats.rekeys += u64::from(self.awaiting_rekey);
        self.stats.last_completed = Some(now);
        true
    }

    fn keys(
        &self,
        send: &[u8; 32],
        send_phase: KeyPhase,
        recv: &[u8; 32],
        recv_phase: KeyPhase,
        route: SessionKey,
        initiation_epoch: Epoch,
    ) -> SessionKeys {
        let ctx = match self.cfg.aead {
            AeadAlg::Aes256Gcm => identity::context::DATA_AES,
            AeadAlg::ChaCha20Poly1305 => identity::context::DATA_CHACHA,
        };
        let s = Zeroizing::new(blake3::derive_key(ctx, send));
        let r = Zeroizing::new(blake3::derive_key(ctx, recv));
        let c = &self.cfg;
        SessionKeys {
            send: Sealer::for_session(c.mode, c.aead, &s, send_phase, c.local_true, c.remote_true),
            recv: Opener::for_session(c.mode, c.aead, &r, recv_phase, c.local_true, c.remote_true),
            route,
            initiation_epoch,
        }
    }
}

/// The Noise handshake hash `h` of a finished handshake (32 bytes with BLAKE2s).
fn handshake_hash(state: &snow::HandshakeState) -> Zeroizing<[u8; 32]> {
    let mut h = Zeroizing::new([0u8; 32]);
    let got = state.get_handshake_hash();
    let n = got.len().min(32);
    h[..n].copy_from_slice(&got[..n]);
    h
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
