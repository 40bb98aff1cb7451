//! ICMPv6 errors across the tunnel, as pure functions (000 §2.6.3, §3.2.3; docs/PROTOCOL.md §5).
//!
//! * [`translate_path_error`]: a router on the public path sent an error about one of our *outer*
//!   packets. The inner host must instead see the same error about its *inner* packet, with true
//!   addresses, from the gateway, and (Packet Too Big) with the MTU reduced by the tunnel overhead.
//! * [`packet_too_big`]: an inner packet does not fit the tunnel; tell its sender (000 §3.2.4).
//!
//! What is restored from a quote depends on how much of it the router included (RFC 4443 §2.4(c):
//! as much as fits in 1280 bytes) and on the mode:
//! * plain: every quoted byte maps back to an inner byte; the quote is rebuilt as far as it goes.
//! * auth: the inner bytes are in clear. A complete quote is verified with our own send key and
//!   dropped if the tag fails; a truncated one cannot be verified and is restored as far as it goes
//!   (ICMP quotes are never authenticated anyway; hosts match them against their own connections).
//! * encrypt: a complete quote is decrypted (and verified) with our own send key. A truncated one
//!   cannot be authenticated, and ring offers no unverified decryption, so only what is known
//!   without decrypting is quoted: a synthesized 40-byte inner header (version 6, payload length from
//!   the quoted UDP length, Next Header 59, the true addresses). For Packet Too Big,
//!   [`Translated::path_mtu`] also reports the outer MTU so the daemon lowers that peer's path
//!   MTU: the next oversized inner packet then gets a full-quote error (from the gateway's kernel,
//!   or from [`packet_too_big`]).
//!
//! Forged errors (docs/PROTOCOL.md §5, "Which errors are believed"): an error is translated only
//! about a packet this gateway sent recently and no error has yet been accepted for
//! ([`SentLog`], filled by the transmit path), and a Packet Too Big only if its MTU is at least
//! 1280 and below the quoted packet's length (RFC 8201 §4). What a believed Packet Too Big
//! teaches is kept per peer by [`PathMtu`], which only ever lowers its estimate before it ages out.

use std::net::{Ipv6Addr, SocketAddrV6};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use crate::tunnel::{
    decapsulate, fixed_len, CounterSpace, Decap, OpenError, COUNTER_LEN, INNER_HEADER_CARRIED,
    TAG_LEN,
};
use crate::wire::{
    Icmpv6Packet, Icmpv6Repr, Icmpv6Type, Ipv6Packet, Ipv6Repr, UdpPacket, WireError,
    IPV6_DST_ADDR, IPV6_HEADER_LEN, IPV6_SRC_ADDR, NEXT_HEADER_ICMPV6, NEXT_HEADER_NONE,
    NEXT_HEADER_UDP, UDP_HEADER_LEN,
};
use crate::{Mode, Route, Sealer, Stream, UnixTime};

/// IPv6 minimum link MTU (RFC 8200 §5): errors never exceed it, and no MTU below it is advertised.
pub const MIN_MTU: usize = 1280;
/// Bytes of IPv6 + ICMPv6 header in an error message.
const ERROR_HEADERS: usize = IPV6_HEADER_LEN + 8;
/// Largest quote that keeps an error within [`MIN_MTU`].
pub const MAX_QUOTE: usize = MIN_MTU - ERROR_HEADERS;
/// Hop limit of errors the gateway originates.
pub const HOP_LIMIT: u8 = 64;

/// Why an ICMPv6 message was not translated (the daemon drops it and counts [`IcmpError::reason`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IcmpError {
    /// The error packet or its quote is not parseable.
    #[error("malformed: {0}")]
    Malformed(WireError),
    /// Not ICMPv6, or not one of the four translated error types.
    #[error("not a translatable ICMPv6 error")]
    NotAnError,
    /// The ICMPv6 checksum is wrong.
    #[error("ICMPv6 checksum mismatch")]
    BadChecksum,
    /// The quoted packet is not a UDP packet of `route` (addresses or ports differ).
    #[error("quoted packet does not belong to this route")]
    NotOurRoute,
    /// Too little of the tunnel payload is quoted to rebuild anything.
    #[error("quote too short to restore")]
    QuoteTooShort,
    /// A complete quote failed authentication: forged or corrupted.
    #[error("quoted tunnel payload failed authentication")]
    BadTag,
    /// The inner packet is itself an ICMPv6 error (RFC 4443 §2.4(e)), or its source is not unicast.
    #[error("no ICMPv6 error may be sent about this packet")]
    NotAllowed,
    /// A Packet Too Big whose MTU is below 1280 (RFC 8201 §4: discarded) or not below the length
    /// of the packet it quotes (that packet would have fitted): forged or broken.
    #[error("Packet Too Big MTU {mtu} impossible for a quoted packet of {quoted} bytes")]
    BogusMtu {
        /// The MTU the message reported.
        mtu: u32,
        /// The quoted packet's length (from its IPv6 header).
        quoted: usize,
    },
    /// The quoted packet is not one this gateway sent recently, or an error about it was already
    /// accepted ([`SentLog`]).
    #[error("quoted packet was not sent recently or was already reported")]
    NotSent,
    /// `out` is too small.
    #[error("output buffer of {have} bytes too small, need {need}")]
    BufferTooSmall {
        /// Bytes available.
        have: usize,
        /// Bytes required.
        need: usize,
    },
}

impl IcmpError {
    /// A stable label for drop counters.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "icmp_malformed",
            Self::NotAnError => "icmp_not_an_error",
            Self::BadChecksum => "icmp_bad_checksum",
            Self::NotOurRoute => "icmp_not_our_route",
            Self::QuoteTooShort => "icmp_quote_too_short",
            Self::BadTag => "icmp_bad_tag",
            Self::NotAllowed => "icmp_not_allowed",
            Self::BogusMtu { .. } => "icmp_bogus_mtu",
            Self::NotSent => "icmp_not_sent",
            Self::BufferTooSmall { .. } => "icmp_buffer_too_small",
        }
    }
}

impl From<WireError> for IcmpError {
    fn from(e: WireError) -> Self {
        Self::Malformed(e)
    }
}

/// How much of the inner packet the translated error quotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quote {
    /// The whole inner packet (capped at [`MAX_QUOTE`]).
    Full,
    /// A prefix, because the router's quote was cut.
    Truncated,
    /// Only a synthesized inner header (encrypt mode, truncated quote).
    HeaderOnly,
}

/// A translated error written into `out`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Translated {
    /// Bytes written (a whole IPv6 packet).
    pub len: usize,
    /// What the quote holds.
    pub quote: Quote,
    /// For Packet Too Big: the MTU the router reported for the outer path.
    pub path_mtu: Option<u32>,
}

/// Slots of each of [`SentLog`]'s two rings.
pub const SENT_LOG_SLOTS: usize = 512;
/// How long a Packet Too Big's lesson holds before the path MTU is raised again (RFC 8201 §4
/// recommends no less than 5 minutes, 10 by default).
pub const PMTU_EXPIRY_SECS: u64 = 600;
/// Bytes of the tunnel payload a [`SentLog`] fingerprint covers: in auth and encrypt modes the
/// counter (unique per packet and key) and the first 8 ciphertext or clear bytes; in plain mode
/// the inner header's first 8 bytes and the transport header's first 8 (ports, TCP sequence).
const FINGERPRINT_LEN: usize = 16;

/// What the transmit path sent lately, per peer: one 64-bit entry per tunnel payload (a 48-bit
/// fingerprint of its first 16 bytes and its 16-bit length), in two rings of
/// [`SENT_LOG_SLOTS`]: packets that can draw a Packet Too Big (outer length above 1280, which
/// every IPv6 link carries) and the rest, so a stream of small packets (TCP acknowledgements)
/// does not push out the large ones a router is about to report.
///
/// An ICMPv6 error is believed only about a packet found here, and at most once: a router
/// that drops a packet sends one error about it, so [`SentLog::take`] empties the slot and a
/// replayed or second error about the same packet is refused.
///
/// Lock-free and allocation-free: [`SentLog::record`] is two relaxed loads and two relaxed stores
/// on the transmit thread (the only writer; a second writer would at worst lose an entry, and
/// then an error about that packet is dropped), [`SentLog::take`] a scan with compare-exchange on
/// the ICMPv6 thread. "Recently" is the last 512 packets of each class: at the rate of a large
/// transfer that is milliseconds, but a path too narrow for its packets drops them all, and the
/// senders slow down until errors about their retransmissions are found.
#[derive(Debug)]
pub struct SentLog {
    small: Ring,
    large: Ring,
}

#[derive(Debug)]
struct Ring {
    slots: Box<[AtomicU64]>,
    next: AtomicUsize,
}

impl Ring {
    fn new() -> Ring {
        Ring {
            slots: (0..SENT_LOG_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            next: AtomicUsize::new(0),
        }
    }
}

impl Default for SentLog {
    fn default() -> Self {
        SentLog::new()
    }
}

/// The entry of a tunnel payload of `len` bytes starting with `prefix` (its first
/// `min(len, FINGERPRINT_LEN)` bytes). Never 0 (the empty slot): `len` > 0.
fn sent_entry(prefix: &[u8], len: usize) -> u64 {
    let mut b = [0u8; FINGERPRINT_LEN];
    let n = prefix.len().min(FINGERPRINT_LEN);
    b[..n].copy_from_slice(&prefix[..n]);
    let lo = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
    let hi = u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]);
    // Not a MAC: only a compact key for bytes the attacker this guards against (off the path)
    // cannot see. A multiply-xorshift mix keeps the counter's low bits in the top 48.
    let x = (lo ^ hi.rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((x ^ (x >> 29)) & !0xffff) | (len as u64 & 0xffff).max(1)
}

impl SentLog {
    /// An empty log (2 x [`SENT_LOG_SLOTS`] x 8 bytes).
    pub fn new() -> SentLog {
        SentLog {
            small: Ring::new(),
            large: Ring::new(),
        }
    }

    fn ring(&self, payload_len: usize) -> &Ring {
        if IPV6_HEADER_LEN + UDP_HEADER_LEN + payload_len > MIN_MTU {
            &self.large
        } else {
            &self.small
        }
    }

    /// Records a tunnel payload (the UDP payload) as it is sent: sealed and header-protected
    /// (§4.5), since a quote holds the wire bytes.
    pub fn record(&self, payload: &[u8]) {
        if payload.is_empty() {
            return;
        }
        let ring = self.ring(payload.len());
        let i = ring.next.load(Relaxed);
        ring.next.store(i.wrapping_add(1), Relaxed);
        ring.slots[i % SENT_LOG_SLOTS].store(sent_entry(payload, payload.len()), Relaxed);
    }

    /// If a tunnel payload starting with `prefix` (a quote, possibly truncated) whose UDP
    /// header claims `len` bytes was recorded and not yet taken: takes it and returns the length
    /// it was sent with. That is `len`, or less when the quoted packet is several of our
    /// datagrams in one: a UDP segmentation-offload run that reached a router unsegmented (as
    /// over veth) or was coalesced on the way (GRO forwarding) carries one UDP header whose
    /// length covers the whole run, and the router quotes it whole; its first bytes are still
    /// those of the first datagram.
    pub fn take(&self, prefix: &[u8], len: usize) -> Option<usize> {
        if len == 0 || prefix.len() < len.min(FINGERPRINT_LEN) {
            return None;
        }
        let exact = sent_entry(prefix, len);
        let first = (prefix.len() >= FINGERPRINT_LEN).then(|| sent_entry(prefix, 1) & !0xffff);
        let matches = |v: u64| {
            let sent_len = (v & 0xffff) as usize;
            v == exact
                || (sent_len >= FINGERPRINT_LEN
                    && sent_len < len
                    && first.is_some_and(|f| v & !0xffff == f))
        };
        // The datagram's own ring first; a run's first datagram may be in the other.
        let rings = if std::ptr::eq(self.ring(len), &self.large) {
            [&self.large, &self.small]
        } else {
            [&self.small, &self.large]
        };
        rings.iter().find_map(|ring| {
            ring.slots.iter().find_map(|slot| {
                let v = slot.load(Relaxed);
                (v != 0 && matches(v) && slot.compare_exchange(v, 0, Relaxed, Relaxed).is_ok())
                    .then_some((v & 0xffff) as usize)
            })
        })
    }
}

/// One peer's path MTU as Packet Too Big taught it (RFC 8201 §4-5), as the inner MTU (the outer
/// path MTU minus the tunnel overhead, at least 1280).
///
/// The estimate only goes down while it holds: a value lower than the current one replaces it
/// and restarts the [`PMTU_EXPIRY_SECS`] timer; an equal or higher one changes nothing, so a
/// message repeated (by the path or by anyone who saw one) cannot hold the estimate low for
/// ever. When the timer runs out the estimate is forgotten, and the next oversized packet's
/// error (if the path is still narrow) sets it again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathMtu {
    learned: Option<(u32, UnixTime)>,
}

impl PathMtu {
    /// A believed Packet Too Big says the inner MTU is `inner`. True if the estimate went down.
    pub fn on_packet_too_big(&mut self, now: UnixTime, inner: u32) -> bool {
        self.expire(now);
        let inner = inner.max(MIN_MTU as u32);
        match self.learned {
            Some((m, _)) if inner >= m => false,
            _ => {
                self.learned = Some((inner, now));
                true
            }
        }
    }

    /// The estimate at `now`, if one holds.
    pub fn get(&mut self, now: UnixTime) -> Option<u32> {
        self.expire(now);
        self.learned.map(|(m, _)| m)
    }

    fn expire(&mut self, now: UnixTime) {
        let expiry = PMTU_EXPIRY_SECS * 1_000_000_000;
        if self
            .learned
            .is_some_and(|(_, at)| now.as_nanos().saturating_sub(at.as_nanos()) >= expiry)
        {
            self.learned = None;
        }
    }
}

/// The outer (source, destination) of the packet an ICMPv6 error quotes, so the caller can find the
/// stream and route it belongs to before calling [`translate_path_error`].
pub fn quoted_route(error_packet: &[u8]) -> Result<(SocketAddrV6, SocketAddrV6), IcmpError> {
    let (_, _, q, udp) = parse_error(error_packet)?;
    Ok((
        SocketAddrV6::new(q.src_addr(), udp.src_port(), 0, 0),
        SocketAddrV6::new(q.dst_addr(), udp.dst_port(), 0, 0),
    ))
}

type Parsed<'a> = (
    Ipv6Packet<&'a [u8]>,
    Icmpv6Packet<&'a [u8]>,
    Ipv6Packet<&'a [u8]>,
    UdpPacket<&'a [u8]>,
);

fn parse_error(error_packet: &[u8]) -> Result<Parsed<'_>, IcmpError> {
    let ip = Ipv6Packet::new_checked(error_packet)?;
    if ip.next_header() != NEXT_HEADER_ICMPV6 {
        return Err(IcmpError::NotAnError);
    }
    let icmp = Icmpv6Packet::new_checked(ip.into_payload())?;
    if !matches!(
        icmp.msg_type(),
        Icmpv6Type::DestinationUnreachable
            | Icmpv6Type::PacketTooBig
            | Icmpv6Type::TimeExceeded
            | Icmpv6Type::ParameterProblem
    ) {
        return Err(IcmpError::NotAnError);
    }
    if !icmp.verify_checksum(ip.src_addr(), ip.dst_addr()) {
        return Err(IcmpError::BadChecksum);
    }
    let quoted = Ipv6Packet::new_checked_header(icmp.into_payload())
        .map_err(|_| IcmpError::QuoteTooShort)?;
    // MT6D never puts extension headers on outer packets (RFC 7872), so UDP follows directly.
    if quoted.next_header() != NEXT_HEADER_UDP {
        return Err(IcmpError::NotOurRoute);
    }
    let udp = UdpPacket::new_checked_header(quoted.into_payload())
        .map_err(|_| IcmpError::QuoteTooShort)?;
    Ok((ip, icmp, quoted, udp))
}

/// Translates `error_packet` (a whole IPv6 packet carrying an ICMPv6 Destination Unreachable,
/// Packet Too Big, Time Exceeded or Parameter Problem about an outer packet this gateway sent on
/// `route`) into the error the local inner host must see, written into `out` as a whole IPv6 packet
/// from `gateway` to `stream.local_true()`.
/// The quoted packet is opened with the stream's static data key; with handshake keys use
/// [`translate_path_error_sealed`]. It must be in `sent` (and is taken from it).
pub fn translate_path_error(
    stream: &Stream,
    route: &Route,
    sent: &SentLog,
    error_packet: &[u8],
    gateway: Ipv6Addr,
    out: &mut [u8],
) -> Result<Translated, IcmpError> {
    translate_path_error_sealed(stream, None, route, sent, error_packet, gateway, out)
}

/// [`translate_path_error`] for a stream whose packets are sealed by `sealer` (a handshake key);
/// `None` means the stream's static key. A quote sealed under another key (one just replaced by
/// a rekey) fails with [`IcmpError::BadTag`].
#[allow(clippy::too_many_arguments)]
pub fn translate_path_error_sealed(
    stream: &Stream,
    sealer: Option<&Sealer>,
    route: &Route,
    sent: &SentLog,
    error_packet: &[u8],
    gateway: Ipv6Addr,
    out: &mut [u8],
) -> Result<Translated, IcmpError> {
    let (_, icmp, quoted, udp) = parse_error(error_packet)?;
    let mode = stream.mode();
    let q = check_quote(&icmp, &quoted, &udp, mode, route, sent)?;
    let out_len = out.len();
    let body = out.get_mut(ERROR_HEADERS..).unwrap_or_default();
    let (inner_len, quote) = match (mode, q.complete()) {
        (Mode::Plain, _) | (Mode::Auth, false) => {
            restore_clear(stream, mode, q.present, q.full_len, body)?
        }
        (Mode::Auth | Mode::Encrypt, true) => {
            open_quote(stream, sealer, route, mode, q.present, body, out_len)?
        }
        (Mode::Encrypt, false) => {
            let repr = Ipv6Repr {
                traffic_class: 0,
                flow_label: 0,
                payload_len: u16::try_from(q.full_len - fixed_len(mode)).unwrap_or(u16::MAX),
                next_header: NEXT_HEADER_NONE,
                hop_limit: quoted.hop_limit(),
                src_addr: stream.local_true(),
                dst_addr: stream.remote_true(),
            };
            repr.emit(body)
                .map_err(|_| too_small(out_len, ERROR_HEADERS + IPV6_HEADER_LEN))?;
            (IPV6_HEADER_LEN, Quote::HeaderOnly)
        }
    };
    // A complete quote last, after its tag was verified: a forged quote must not use up the
    // entry of a packet whose genuine error is still on its way.
    if !q.taken && sent.take(q.present, q.full_len) != Some(q.full_len) {
        return Err(IcmpError::NotSent);
    }
    build_error(stream, &icmp, mode, inner_len, quote, gateway, out)
}

/// A quoted outer datagram that passed [`check_quote`]: the bytes the error carries of its UDP
/// payload (at most the datagram's own), the datagram's own length, and whether its entry in the
/// [`SentLog`] was already taken (a truncated quote is looked up before anything else).
struct QuotedDatagram<'a> {
    present: &'a [u8],
    full_len: usize,
    taken: bool,
}

impl QuotedDatagram<'_> {
    /// Whether the error quotes the whole datagram (its tag included).
    fn complete(&self) -> bool {
        self.present.len() == self.full_len
    }
}

/// The checks on the quote of an error before any key is used: it is of a datagram this gateway
/// sent on `route`, its lengths agree and cover the fixed part of `mode`, a Packet Too Big's MTU
/// is one a router could report for it, and a truncated quote is of a datagram in `sent`.
fn check_quote<'a>(
    icmp: &Icmpv6Packet<&[u8]>,
    quoted: &Ipv6Packet<&[u8]>,
    udp: &'a UdpPacket<&[u8]>,
    mode: Mode,
    route: &Route,
    sent: &SentLog,
) -> Result<QuotedDatagram<'a>, IcmpError> {
    if quoted.src_addr() != *route.local.ip()
        || quoted.dst_addr() != *route.remote.ip()
        || udp.src_port() != route.local.port()
        || udp.dst_port() != route.remote.port()
    {
        return Err(IcmpError::NotOurRoute);
    }
    // MT6D's outer packets carry UDP right after the IPv6 header: both lengths agree.
    if usize::from(quoted.payload_len()) != usize::from(udp.len()) {
        return Err(IcmpError::Malformed(WireError::Malformed {
            what: "quoted packet",
            field: "length",
        }));
    }
    let present = udp.payload();
    let claimed = usize::from(udp.len()) - UDP_HEADER_LEN; // new_checked_header: len >= 8.
    if claimed < fixed_len(mode) || present.len() < INNER_HEADER_CARRIED {
        return Err(IcmpError::QuoteTooShort);
    }
    // RFC 8201 §4: below 1280 is discarded; and a router reports the MTU of the link the packet
    // did not fit, so a value at or above the packet's own length is no such report.
    let ptb_mtu = (icmp.msg_type() == Icmpv6Type::PacketTooBig).then(|| icmp.data());
    let bogus = |mtu: u32, payload: usize| {
        let quoted = IPV6_HEADER_LEN + UDP_HEADER_LEN + payload;
        (mtu < MIN_MTU as u32 || usize::try_from(mtu).map_or(true, |m| m >= quoted))
            .then_some(IcmpError::BogusMtu { mtu, quoted })
    };
    if let Some(e) = ptb_mtu.and_then(|m| bogus(m, claimed)) {
        return Err(e);
    }
    // A truncated quote cannot be verified: it must be of a packet in the log, which also tells
    // the datagram's own length when the quote is of an offload run (SentLog::take). A complete
    // one is verified first and looked up last (in `translate_path_error_sealed`).
    let (full_len, taken) = if present.len() >= claimed {
        (claimed, false)
    } else {
        (sent.take(present, claimed).ok_or(IcmpError::NotSent)?, true)
    };
    if let Some(e) = ptb_mtu.and_then(|m| bogus(m, full_len)) {
        return Err(e);
    }
    if full_len < fixed_len(mode) {
        return Err(IcmpError::QuoteTooShort);
    }
    Ok(QuotedDatagram {
        present: &present[..present.len().min(full_len)],
        full_len,
        taken,
    })
}

/// Opens a complete quote (auth or encrypt mode) with the key that sealed it (`sealer`, or the
/// stream's static key) and writes the inner packet, as far as `MAX_QUOTE` allows, into `body`
/// (the part of the caller's buffer of `out_len` bytes after the error's headers).
fn open_quote(
    stream: &Stream,
    sealer: Option<&Sealer>,
    route: &Route,
    mode: Mode,
    present: &[u8],
    body: &mut [u8],
    out_len: usize,
) -> Result<(usize, Quote), IcmpError> {
    let static_key;
    let (key, space) = match sealer {
        Some(s) => (s.key(), s.space()),
        None => {
            static_key = stream.data_key(stream.role());
            (static_key.as_ref(), CounterSpace::Static)
        }
    };
    let d = Decap {
        mode,
        key,
        space,
        outer_src: route.local,
        outer_dst: route.remote,
        inner_src: stream.local_true(),
        inner_dst: stream.remote_true(),
    };
    // A complete quote has its sample (the tag), so its header can be unmasked with our
    // own send key (§4.5); a truncated one has none and is handled without the counter
    // (`restore_clear`, or its header only). Errors are rare: heap buffers here keep the
    // caller's `out` at 1280 bytes.
    let mut sealed = present.to_vec();
    if let Some(hk) = stream.send_header_key() {
        hk.unprotect(&mut sealed)
            .map_err(|_| IcmpError::QuoteTooShort)?;
    }
    let mut inner = vec![0u8; IPV6_HEADER_LEN + present.len()];
    match decapsulate(&d, &sealed, &mut inner, &mut Vec::new(), None) {
        Ok(n) => {
            let q = n.min(MAX_QUOTE);
            if body.len() < q {
                return Err(too_small(out_len, q + ERROR_HEADERS));
            }
            body[..q].copy_from_slice(&inner[..q]);
            Ok((n, Quote::Full))
        }
        Err(OpenError::BadInner) => Err(IcmpError::Malformed(WireError::Malformed {
            what: "inner",
            field: "header",
        })),
        Err(_) => Err(IcmpError::BadTag),
    }
}

/// Writes into `out` the error the inner host sees, from `gateway`: the type and code of `icmp`,
/// a Packet Too Big's MTU for the inner path, a Parameter Problem's pointer moved onto the inner
/// packet, and the quote of the inner packet (`inner_len` bytes, already in place).
fn build_error(
    stream: &Stream,
    icmp: &Icmpv6Packet<&[u8]>,
    mode: Mode,
    inner_len: usize,
    quote: Quote,
    gateway: Ipv6Addr,
    out: &mut [u8],
) -> Result<Translated, IcmpError> {
    let quote_len = inner_len.min(MAX_QUOTE);
    let quote = if quote_len < inner_len && quote == Quote::Full {
        Quote::Truncated
    } else {
        quote
    };
    let msg_type = icmp.msg_type();
    let data = match msg_type {
        Icmpv6Type::PacketTooBig => {
            let mtu = usize::try_from(icmp.data()).unwrap_or(usize::MAX);
            u32::try_from(stream.inner_mtu(mtu).max(MIN_MTU)).unwrap_or(u32::MAX)
        }
        Icmpv6Type::ParameterProblem => map_pointer(mode, icmp.data(), quote_len),
        _ => 0,
    };
    let path_mtu = (msg_type == Icmpv6Type::PacketTooBig).then(|| icmp.data());
    let len = emit_error(
        out,
        gateway,
        stream.local_true(),
        Icmpv6Repr {
            msg_type,
            code: icmp.code(),
            data,
        },
        quote_len,
    )?;
    Ok(Translated {
        len,
        quote,
        path_mtu,
    })
}

/// Rebuilds the inner packet from clear tunnel bytes (plain, or auth without verification) into
/// `body`, as far as the quote goes and `MAX_QUOTE` allows.
fn restore_clear(
    stream: &Stream,
    mode: Mode,
    present: &[u8],
    full_len: usize,
    body: &mut [u8],
) -> Result<(usize, Quote), IcmpError> {
    let (start, tag) = if mode == Mode::Plain {
        (0, 0)
    } else {
        (COUNTER_LEN, TAG_LEN)
    };
    // full_len >= fixed_len(mode) >= tag (checked by the caller).
    let end_of_clear = full_len - tag;
    let clear = present
        .get(start..present.len().min(end_of_clear))
        .unwrap_or_default();
    if clear.len() < INNER_HEADER_CARRIED {
        return Err(IcmpError::QuoteTooShort);
    }
    let restorable = IPV6_HEADER_LEN + clear.len() - INNER_HEADER_CARRIED;
    let inner_len = restorable.min(MAX_QUOTE);
    if body.len() < inner_len {
        return Err(too_small(
            body.len() + ERROR_HEADERS,
            inner_len + ERROR_HEADERS,
        ));
    }
    body[..INNER_HEADER_CARRIED].copy_from_slice(&clear[..INNER_HEADER_CARRIED]);
    body[IPV6_SRC_ADDR].copy_from_slice(&stream.local_true().octets());
    body[IPV6_DST_ADDR].copy_from_slice(&stream.remote_true().octets());
    let rest = inner_len - IPV6_HEADER_LEN;
    body[IPV6_HEADER_LEN..inner_len]
        .copy_from_slice(&clear[INNER_HEADER_CARRIED..INNER_HEADER_CARRIED + rest]);
    let quote = if present.len() >= end_of_clear && inner_len == restorable {
        Quote::Full
    } else {
        Quote::Truncated
    };
    Ok((inner_len, quote))
}

/// Maps a Parameter Problem pointer into the outer packet onto the inner packet. Pointers into the
/// outer headers or the counter (which the inner host never sent) become 0.
fn map_pointer(mode: Mode, pointer: u32, inner_len: usize) -> u32 {
    let skip = (IPV6_HEADER_LEN
        + UDP_HEADER_LEN
        + if mode == Mode::Plain { 0 } else { COUNTER_LEN }) as u32;
    let Some(q) = pointer.checked_sub(skip) else {
        return 0;
    };
    let mapped = if q < INNER_HEADER_CARRIED as u32 {
        q
    } else {
        q.saturating_add(32)
    };
    if (mapped as usize) < inner_len {
        mapped
    } else {
        0
    }
}

fn too_small(have: usize, need: usize) -> IcmpError {
    IcmpError::BufferTooSmall { have, need }
}

/// Writes the IPv6 and ICMPv6 headers in front of a quote already at `out[48..48 + quote_len]`.
fn emit_error(
    out: &mut [u8],
    src: Ipv6Addr,
    dst: Ipv6Addr,
    icmp: Icmpv6Repr,
    quote_len: usize,
) -> Result<usize, IcmpError> {
    let len = ERROR_HEADERS + quote_len;
    let Some(pkt) = out.get_mut(..len) else {
        return Err(too_small(out.len(), len));
    };
    let ip = Ipv6Repr {
        traffic_class: 0,
        flow_label: 0,
        // len <= MIN_MTU, so the ICMPv6 length fits u16.
        payload_len: (len - IPV6_HEADER_LEN) as u16,
        next_header: NEXT_HEADER_ICMPV6,
        hop_limit: HOP_LIMIT,
        src_addr: src,
        dst_addr: dst,
    };
    ip.emit(pkt)?;
    icmp.emit(&mut pkt[IPV6_HEADER_LEN..], src, dst)?;
    Ok(len)
}

/// Builds a Packet Too Big from `gateway` to the source of `inner` (an inner packet that exceeds the
/// tunnel MTU), quoting as much of it as fits in 1280 bytes (RFC 4443 §3.2). `mtu` is the inner
/// MTU to advertise; values below 1280 are raised to 1280 (RFC 8201 §4).
pub fn packet_too_big(
    gateway: Ipv6Addr,
    mtu: u32,
    inner: &[u8],
    out: &mut [u8],
) -> Result<usize, IcmpError> {
    let ip = Ipv6Packet::new_checked_header(inner)?;
    let src = ip.src_addr();
    if src.is_unspecified() || src.is_multicast() {
        return Err(IcmpError::NotAllowed);
    }
    if ip.next_header() == NEXT_HEADER_ICMPV6 {
        if let Some(&t) = ip.payload().first() {
            if Icmpv6Type::from_u8(t).is_error() {
                return Err(IcmpError::NotAllowed);
            }
        }
    }
    let quote_len = inner.len().min(MAX_QUOTE);
    let need = ERROR_HEADERS + quote_len;
    if out.len() < need {
        return Err(too_small(out.len(), need));
    }
    out[ERROR_HEADERS..need].copy_from_slice(&inner[..quote_len]);
    let repr = Icmpv6Repr {
        msg_type: Icmpv6Type::PacketTooBig,
        code: 0,
        data: mtu.max(MIN_MTU as u32),
    };
    emit_error(out, gateway, src, repr, quote_len)
}

/// An ICMPv6 error the gateway's own stack sent into the tunnel about a packet that came out of
/// it: what [`readdress_own_error`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnError {
    /// The error's source as the kernel chose it (one of the gateway's addresses, or a router
    /// between the gateway and its protected host).
    pub src: Ipv6Addr,
    /// The error's destination: the source of the quoted packet, the peer's protected host.
    pub dst: Ipv6Addr,
    /// The destination of the quoted packet: the local protected host it was going to.
    pub quoted_dst: Ipv6Addr,
}

/// The gateway's own errors about packets that came through the tunnel (docs/PROTOCOL.md §5,
/// "The gateway's own errors"): a Time Exceeded for a hop limit that ran out in this gateway, a
/// Packet Too Big or Destination Unreachable for the internal link. The kernel sends them from an
/// address of its choosing to the remote protected host, so they reach the TUN device with a
/// source that is no stream's local true address and would be dropped as from no peer. If
/// `packet` is such an error (a whole IPv6 packet, no extension header, ICMPv6 type 1-4 with a
/// valid checksum, quoting at least an IPv6 header whose source is the error's destination) and
/// `stream_of(quoted destination, error destination)` says a stream carries that pair, its
/// source is replaced by the quoted destination (the local protected host: the only source the
/// tunnel can carry, and the one that hides the gateway) and the checksum written again.
/// Returns what was found, or `None` (the packet is left untouched).
pub fn readdress_own_error(
    packet: &mut [u8],
    stream_of: impl FnOnce(Ipv6Addr, Ipv6Addr) -> bool,
) -> Option<OwnError> {
    let found = {
        let ip = Ipv6Packet::new_checked(&*packet).ok()?;
        if ip.next_header() != NEXT_HEADER_ICMPV6 {
            return None;
        }
        let icmp = Icmpv6Packet::new_checked(ip.payload()).ok()?;
        if !(1..=4).contains(&icmp.msg_type().to_u8())
            || !icmp.verify_checksum(ip.src_addr(), ip.dst_addr())
        {
            return None;
        }
        let quoted = Ipv6Packet::new_checked_header(icmp.payload()).ok()?;
        OwnError {
            src: ip.src_addr(),
            dst: ip.dst_addr(),
            quoted_dst: quoted.dst_addr(),
        }
        .into_checked(quoted.src_addr())?
    };
    if !stream_of(found.quoted_dst, found.dst) {
        return None;
    }
    let mut ip = Ipv6Packet::new_checked(&mut *packet).ok()?;
    ip.set_src_addr(found.quoted_dst);
    let msg = ip.payload_mut();
    msg[2..4].copy_from_slice(&[0, 0]);
    let sum =
        crate::wire::upper_layer_checksum(found.quoted_dst, found.dst, NEXT_HEADER_ICMPV6, msg);
    msg[2..4].copy_from_slice(&sum.to_be_bytes());
    Some(found)
}

impl OwnError {
    /// Only an error about a packet from its own destination, and not already from the local
    /// host, is the gateway's.
    fn into_checked(self, quoted_src: Ipv6Addr) -> Option<OwnError> {
        (quoted_src == self.dst && self.src != self.quoted_dst).then_some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{addr, pair, tcp, transport_checksum_ok, udp, A, B};
    use crate::wire::UdpRepr;
    use crate::{AeadAlg, Epoch, UnixTime};

    const ROUTER: &str = "2001:db8:ffff::1";
    const PTB: Icmpv6Type = Icmpv6Type::PacketTooBig;
    const GATEWAY: &str = "2001:db8:a::fe";

    /// The outer packet A's gateway sends for `inner` (recorded in `sent`), and the router's
    /// error about it quoting at most `quote_max` bytes.
    fn router_error(
        stream: &Stream,
        route: &Route,
        sent: &SentLog,
        inner: &[u8],
        msg_type: Icmpv6Type,
        data: u32,
        quote_max: usize,
    ) -> Vec<u8> {
        let sealer = stream.sealer(UnixTime::from_secs(1_700_000_000).as_nanos(), u64::MAX);
        let mut payload = [0u8; 2048];
        let n = sealer.seal(route, inner, &mut payload).unwrap();
        // As on the wire: the header is masked after sealing (§4.5), and the log records the
        // bytes as sent.
        if let Some(hk) = stream.send_header_key() {
            hk.protect(&mut payload[..n]).unwrap();
        }
        sent.record(&payload[..n]);
        let mut udp_dgram = vec![0u8; 8 + n];
        udp_dgram[8..].copy_from_slice(&payload[..n]);
        let (s, d) = (*route.local.ip(), *route.remote.ip());
        UdpRepr {
            src_port: route.local.port(),
            dst_port: route.remote.port(),
        }
        .emit(&mut udp_dgram, s, d)
        .unwrap();
        let mut outer = vec![0u8; 40 + udp_dgram.len()];
        Ipv6Repr {
            traffic_class: 0,
            flow_label: 0,
            payload_len: udp_dgram.len() as u16,
            next_header: 17,
            hop_limit: 1,
            src_addr: s,
            dst_addr: d,
        }
        .emit(&mut outer)
        .unwrap();
        outer[40..].copy_from_slice(&udp_dgram);
        let q = outer.len().min(quote_max);
        let mut err = vec![0u8; 48 + q];
        err[48..].copy_from_slice(&outer[..q]);
        Icmpv6Repr {
            msg_type,
            code: 0,
            data,
        }
        .emit(&mut err[40..], addr(ROUTER), s)
        .unwrap();
        Ipv6Repr {
            traffic_class: 0,
            flow_label: 0,
            payload_len: (8 + q) as u16,
            next_header: 58,
            hop_limit: 64,
            src_addr: addr(ROUTER),
            dst_addr: s,
        }
        .emit(&mut err)
        .unwrap();
        err
    }

    fn check_output(out: &[u8], msg_type: Icmpv6Type) -> Icmpv6Packet<&[u8]> {
        let ip = Ipv6Packet::new_checked(out).unwrap();
        assert_eq!(ip.src_addr(), addr(GATEWAY));
        assert_eq!(ip.dst_addr(), addr(A));
        assert!(out.len() <= MIN_MTU);
        let icmp = Icmpv6Packet::new_checked(ip.into_payload()).unwrap();
        assert!(icmp.verify_checksum(addr(GATEWAY), addr(A)));
        assert_eq!(icmp.msg_type(), msg_type);
        icmp
    }

    #[test]
    fn full_quotes_are_restored_in_every_mode() {
        for (mode, alg) in [
            (Mode::Plain, AeadAlg::Aes256Gcm),
            (Mode::Auth, AeadAlg::Aes256Gcm),
            (Mode::Encrypt, AeadAlg::ChaCha20Poly1305),
        ] {
            let (a, _) = pair(mode, alg);
            let route = a.route(Epoch(9));
            let inner = tcp(addr(A), addr(B), &[7; 300]);
            for t in [Icmpv6Type::TimeExceeded, Icmpv6Type::DestinationUnreachable] {
                let sent = SentLog::new();
                let err = router_error(&a, &route, &sent, &inner, t, 0, 1232);
                assert_eq!(quoted_route(&err).unwrap(), (route.local, route.remote));
                let mut out = [0u8; 1280];
                let tr =
                    translate_path_error(&a, &route, &sent, &err, addr(GATEWAY), &mut out).unwrap();
                assert_eq!(tr.quote, Quote::Full, "{mode}");
                let icmp = check_output(&out[..tr.len], t);
                assert_eq!(icmp.payload(), &inner[..], "{mode}");
                assert!(transport_checksum_ok(icmp.payload()));
            }
        }
    }

    #[test]
    fn packet_too_big_reduces_the_mtu_and_handles_truncated_quotes() {
        for mode in [Mode::Plain, Mode::Auth, Mode::Encrypt] {
            let (a, _) = pair(mode, AeadAlg::Aes256Gcm);
            let route = a.route(Epoch(9));
            let inner = udp(addr(A), addr(B), &[3; 1400]);
            let sent = SentLog::new();
            // Below the outer packet's 1464 (plain) or 1488 bytes: a link it did not fit.
            let err = router_error(&a, &route, &sent, &inner, PTB, 1450, 1232);
            let mut out = [0u8; 1280];
            let tr =
                translate_path_error(&a, &route, &sent, &err, addr(GATEWAY), &mut out).unwrap();
            let icmp = check_output(&out[..tr.len], Icmpv6Type::PacketTooBig);
            assert_eq!(icmp.data() as usize, 1450 - a.overhead());
            assert_eq!(tr.path_mtu, Some(1450));
            let q = icmp.payload();
            assert_eq!(&q[8..40], &inner[8..40]);
            match mode {
                Mode::Encrypt => {
                    assert_eq!(tr.quote, Quote::HeaderOnly);
                    assert_eq!(q.len(), 40);
                    assert_eq!(
                        &q[4..6],
                        &inner[4..6],
                        "payload length recovered from UDP length"
                    );
                    assert_eq!(q[6], NEXT_HEADER_NONE);
                }
                _ => {
                    assert_eq!(tr.quote, Quote::Truncated);
                    assert_eq!(q, &inner[..q.len()]);
                    assert!(q.len() > 1100);
                }
            }
            // A low MTU is floored at 1280.
            let err = router_error(&a, &route, &sent, &inner, PTB, 1280, 1232);
            let tr =
                translate_path_error(&a, &route, &sent, &err, addr(GATEWAY), &mut out).unwrap();
            assert_eq!(
                check_output(&out[..tr.len], Icmpv6Type::PacketTooBig).data(),
                1280
            );
        }
    }

    #[test]
    fn parameter_problem_pointer_is_mapped() {
        assert_eq!(map_pointer(Mode::Plain, 48 + 6, 100), 6);
        assert_eq!(map_pointer(Mode::Plain, 48 + 8, 100), 40);
        assert_eq!(map_pointer(Mode::Encrypt, 48 + 4, 100), 0);
        assert_eq!(map_pointer(Mode::Encrypt, 56 + 9, 100), 41);
        assert_eq!(map_pointer(Mode::Auth, 6, 100), 0);
        assert_eq!(map_pointer(Mode::Auth, 5000, 100), 0);
    }

    #[test]
    fn rejects_forged_foreign_and_broken_errors() {
        let (a, _) = pair(Mode::Encrypt, AeadAlg::Aes256Gcm);
        let route = a.route(Epoch(9));
        let inner = tcp(addr(A), addr(B), b"x");
        let sent = SentLog::new();
        let err = router_error(&a, &route, &sent, &inner, Icmpv6Type::TimeExceeded, 0, 1232);
        let mut out = [0u8; 1280];
        // Other route.
        assert_eq!(
            translate_path_error(
                &a,
                &a.route(Epoch(10)),
                &sent,
                &err,
                addr(GATEWAY),
                &mut out
            ),
            Err(IcmpError::NotOurRoute)
        );
        // Bad checksum.
        let mut bad = err.clone();
        bad[42] ^= 1;
        assert_eq!(
            translate_path_error(&a, &route, &sent, &bad, addr(GATEWAY), &mut out),
            Err(IcmpError::BadChecksum)
        );
        // Tampered ciphertext with a fixed-up checksum.
        let mut forged = err.clone();
        let last = forged.len() - 1;
        forged[last] ^= 1;
        forged[42..44].copy_from_slice(&[0, 0]);
        let c =
            crate::wire::upper_layer_checksum(addr(ROUTER), *route.local.ip(), 58, &forged[40..]);
        forged[42..44].copy_from_slice(&c.to_be_bytes());
        assert_eq!(
            translate_path_error(&a, &route, &sent, &forged, addr(GATEWAY), &mut out),
            Err(IcmpError::BadTag)
        );
        // Truncated error packets never panic.
        for n in 0..err.len() {
            let _ = translate_path_error(&a, &route, &sent, &err[..n], addr(GATEWAY), &mut out);
            let _ = quoted_route(&err[..n]);
        }
        // Echo request is not an error.
        let echo = crate::testutil::echo(addr(ROUTER), *route.local.ip(), b"");
        assert_eq!(
            translate_path_error(&a, &route, &sent, &echo, addr(GATEWAY), &mut out),
            Err(IcmpError::NotAnError)
        );
    }

    /// Finding: a Packet Too Big reporting 65535 about a 1488-byte packet became one saying
    /// 65495 to the host. An MTU not below the quoted packet's length, or below 1280, is no
    /// report of a narrower link.
    #[test]
    fn packet_too_big_with_an_impossible_mtu_is_dropped() {
        for mode in [Mode::Plain, Mode::Auth, Mode::Encrypt] {
            let (a, _) = pair(mode, AeadAlg::Aes256Gcm);
            let route = a.route(Epoch(9));
            let inner = udp(addr(A), addr(B), &[3; 1400]);
            let outer_len = inner.len() + a.overhead();
            let mut out = [0u8; 1280];
            for mtu in [65535, outer_len as u32, 1279, 0] {
                let sent = SentLog::new();
                let err = router_error(&a, &route, &sent, &inner, PTB, mtu, 1232);
                assert_eq!(
                    translate_path_error(&a, &route, &sent, &err, addr(GATEWAY), &mut out),
                    Err(IcmpError::BogusMtu {
                        mtu,
                        quoted: outer_len
                    }),
                    "{mode} {mtu}"
                );
                // Refused before the log: the packet's genuine error still finds its entry.
                let err = router_error(&a, &route, &sent, &inner, PTB, outer_len as u32 - 1, 1232);
                let tr = translate_path_error(&a, &route, &sent, &err, addr(GATEWAY), &mut out);
                assert!(tr.is_ok(), "{mode} {mtu}: {tr:?}");
            }
            // A small packet can draw no Packet Too Big at all: every link carries 1280.
            let small = udp(addr(A), addr(B), &[3; 100]);
            let sent = SentLog::new();
            let err = router_error(&a, &route, &sent, &small, PTB, 1280, 1232);
            assert!(matches!(
                translate_path_error(&a, &route, &sent, &err, addr(GATEWAY), &mut out),
                Err(IcmpError::BogusMtu { mtu: 1280, .. })
            ));
        }
    }

    /// Finding: errors about packets never sent, and the same error repeated, reached the host.
    /// Only an error about a packet in the log is translated, once.
    #[test]
    fn errors_about_packets_not_sent_or_already_reported_are_dropped() {
        for mode in [Mode::Plain, Mode::Auth, Mode::Encrypt] {
            let (a, _) = pair(mode, AeadAlg::ChaCha20Poly1305);
            let route = a.route(Epoch(9));
            let mut out = [0u8; 1280];
            for (inner, t, data) in [
                (udp(addr(A), addr(B), &[3; 1400]), PTB, 1400), // truncated quote
                (
                    tcp(addr(A), addr(B), b"hello"),
                    Icmpv6Type::DestinationUnreachable,
                    0,
                ), // complete
            ] {
                let nobody = SentLog::new();
                let sent = SentLog::new();
                let err = router_error(&a, &route, &sent, &inner, t, data, 1232);
                assert_eq!(
                    translate_path_error(&a, &route, &nobody, &err, addr(GATEWAY), &mut out),
                    Err(IcmpError::NotSent),
                    "{mode}: a packet never sent"
                );
                assert!(
                    translate_path_error(&a, &route, &sent, &err, addr(GATEWAY), &mut out).is_ok()
                );
                for _ in 0..3 {
                    assert_eq!(
                        translate_path_error(&a, &route, &sent, &err, addr(GATEWAY), &mut out),
                        Err(IcmpError::NotSent),
                        "{mode}: repeated"
                    );
                }
            }
            // Another packet of the same size and route (the next counter, or other bytes in
            // plain mode) is not the one that was sent.
            let sent = SentLog::new();
            let inner = udp(addr(A), addr(B), &[3; 1400]);
            let err = router_error(&a, &route, &sent, &inner, PTB, 1400, 1232);
            let mut other = err.clone();
            other[48 + 40 + 8 + 7] ^= 1; // last byte of the counter; plain: inner hop limit
            let c = crate::wire::upper_layer_checksum(addr(ROUTER), *route.local.ip(), 58, &{
                let mut m = other[40..].to_vec();
                m[2..4].copy_from_slice(&[0, 0]);
                m
            });
            other[42..44].copy_from_slice(&c.to_be_bytes());
            assert_eq!(
                translate_path_error(&a, &route, &sent, &other, addr(GATEWAY), &mut out),
                Err(IcmpError::NotSent),
                "{mode}"
            );
        }
    }

    #[test]
    fn the_sent_log_keeps_large_packets_apart_from_small_ones_and_forgets_the_oldest() {
        let log = SentLog::new();
        let payload = |i: u64, len: usize| {
            let mut p = vec![0u8; len];
            p[..8].copy_from_slice(&i.to_be_bytes());
            p
        };
        let big = payload(1, 1400);
        log.record(&big);
        // Many small packets after it: the large one is still there.
        for i in 2..(2 + 4 * SENT_LOG_SLOTS as u64) {
            log.record(&payload(i, 60));
        }
        assert_eq!(
            log.take(&big[..1232 - 48], big.len()),
            Some(1400),
            "large survives small ones"
        );
        assert_eq!(log.take(&big, big.len()), None, "taken once");
        // The oldest of a ring are forgotten; the newest SENT_LOG_SLOTS are kept.
        for i in 0..(SENT_LOG_SLOTS as u64 + 10) {
            log.record(&payload(1000 + i, 1400));
        }
        assert!(log.take(&payload(1000, 1400), 1400).is_none());
        assert_eq!(log.take(&payload(1010, 1400), 1400), Some(1400));
        let newest = payload(1000 + SENT_LOG_SLOTS as u64 + 9, 1400);
        assert_eq!(log.take(&newest, 1400), Some(1400));
        // Same bytes, shorter: not the same packet. A quote too short to fingerprint.
        log.record(&payload(7, 1400));
        assert_eq!(log.take(&payload(7, 1399), 1399), None);
        assert_eq!(log.take(&payload(7, 1400)[..10], 1400), None);
        assert_eq!(log.take(&[], 0), None);
        assert_eq!(log.take(&payload(7, 1400), 1400), Some(1400));
        // An offload run quoted whole (one UDP header for three datagrams of 1000 and 200):
        // found by its first datagram, whose own length comes back.
        log.record(&payload(20, 1000));
        log.record(&payload(21, 1000));
        log.record(&payload(22, 200));
        assert_eq!(log.take(&payload(20, 1184), 2200), Some(1000));
        assert_eq!(log.take(&payload(20, 1184), 2200), None);
        // A run of small datagrams, quoted as one large packet: found in the small ring.
        log.record(&payload(30, 600));
        assert_eq!(log.take(&payload(30, 1184), 1800), Some(600));
    }

    /// A router that got one of our segmentation-offload runs unsegmented (veth does that) or
    /// coalesced (GRO forwarding) quotes it whole: one UDP header whose length covers the run.
    /// The Packet Too Big is believed (its first datagram was sent), the MTU is checked against
    /// that datagram, and the restored header carries the datagram's own payload length.
    #[test]
    fn packet_too_big_about_an_offload_run_is_about_its_first_datagram() {
        for mode in [Mode::Plain, Mode::Auth, Mode::Encrypt] {
            let (a, _) = pair(mode, AeadAlg::Aes256Gcm);
            let route = a.route(Epoch(9));
            let inner = udp(addr(A), addr(B), &[3; 1400]);
            let one = inner.len() + a.overhead(); // 1464 or 1488
            let mut out = [0u8; 1280];
            for (mtu, want) in [
                (1450, Ok(1450 - a.overhead() as u32)),
                (one as u32, Err(())), // below the run's length, not below the datagram's
            ] {
                let sent = SentLog::new();
                let single = router_error(&a, &route, &sent, &inner, PTB, mtu, 1232);
                // Claim a run of three datagrams in the quoted IPv6 and UDP lengths.
                let mut run = single.clone();
                let udp_len = 3 * (one - 40) - 2 * 8;
                run[48 + 4..48 + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
                run[48 + 40 + 4..48 + 40 + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
                run[42..44].copy_from_slice(&[0, 0]);
                let c = crate::wire::upper_layer_checksum(
                    addr(ROUTER),
                    *route.local.ip(),
                    58,
                    &run[40..],
                );
                run[42..44].copy_from_slice(&c.to_be_bytes());
                let tr = translate_path_error(&a, &route, &sent, &run, addr(GATEWAY), &mut out);
                match want {
                    Ok(m) => {
                        let tr = tr.unwrap_or_else(|e| panic!("{mode}: {e}"));
                        let icmp = check_output(&out[..tr.len], PTB);
                        assert_eq!(icmp.data(), m, "{mode}");
                        assert_eq!(&icmp.payload()[4..6], &inner[4..6], "{mode}: own length");
                    }
                    Err(()) => assert!(
                        matches!(tr, Err(IcmpError::BogusMtu { .. })),
                        "{mode}: {tr:?}"
                    ),
                }
            }
        }
    }

    /// Finding: a truncated quote repeated every few minutes held the MTU at 1280 for ever,
    /// because an equal value restarted the 10-minute timer. Only a lower value does now.
    #[test]
    fn path_mtu_goes_down_restarts_only_on_a_lower_value_and_ages_out() {
        let t = |s: u64| UnixTime::from_secs(1_700_000_000 + s);
        let mut p = PathMtu::default();
        assert_eq!(p.get(t(0)), None);
        assert!(p.on_packet_too_big(t(0), 1400));
        assert!(!p.on_packet_too_big(t(1), 1450), "higher: ignored");
        assert_eq!(p.get(t(1)), Some(1400));
        // The same value every 5 minutes does not keep it.
        assert!(!p.on_packet_too_big(t(300), 1400));
        assert_eq!(p.get(t(599)), Some(1400));
        assert_eq!(
            p.get(t(600)),
            None,
            "aged out 10 minutes after it was learned"
        );
        assert!(
            p.on_packet_too_big(t(601), 1400),
            "learned again if still narrow"
        );
        // Lower: replaces and restarts the timer.
        assert!(p.on_packet_too_big(t(700), 1300));
        assert_eq!(p.get(t(1200)), Some(1300));
        assert_eq!(p.get(t(1300)), None);
        // Never below 1280.
        assert!(p.on_packet_too_big(t(2000), 900));
        assert_eq!(p.get(t(2000)), Some(1280));
    }

    #[test]
    fn local_packet_too_big() {
        let inner = udp(addr(A), addr(B), &[1; 3000]);
        let mut out = [0u8; 1280];
        let n = packet_too_big(addr(GATEWAY), 1400, &inner, &mut out).unwrap();
        assert_eq!(n, 1280);
        let icmp = check_output(&out[..n], Icmpv6Type::PacketTooBig);
        assert_eq!(icmp.data(), 1400);
        assert_eq!(icmp.payload(), &inner[..MAX_QUOTE]);
        assert_eq!(
            packet_too_big(addr(GATEWAY), 1000, &inner, &mut out).map(|_| ()),
            Ok(())
        );
        assert!(Icmpv6Packet::new_checked(&out[40..]).unwrap().data() == 1280);
        // Never about an ICMPv6 error.
        let about_error = &out[..n].to_vec();
        assert_eq!(
            packet_too_big(addr(GATEWAY), 1400, about_error, &mut out),
            Err(IcmpError::NotAllowed)
        );
        assert!(matches!(
            packet_too_big(addr(GATEWAY), 1400, &inner, &mut out[..100]),
            Err(IcmpError::BufferTooSmall { .. })
        ));
        assert!(packet_too_big(addr(GATEWAY), 1400, &inner[..20], &mut out).is_err());
    }

    /// Gateway B's own Time Exceeded about A's packet, as its kernel writes it into the TUN
    /// device: from one of B's addresses to A.
    fn own_time_exceeded(gateway: Ipv6Addr, inner: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; MIN_MTU];
        let repr = Icmpv6Repr {
            msg_type: Icmpv6Type::TimeExceeded,
            code: 0,
            data: 0,
        };
        out[ERROR_HEADERS..ERROR_HEADERS + inner.len()].copy_from_slice(inner);
        let len = emit_error(&mut out, gateway, addr(A), repr, inner.len()).unwrap();
        out.truncate(len);
        out
    }

    #[test]
    fn own_error_is_readdressed_from_the_local_host_with_a_valid_checksum() {
        let inner = udp(addr(A), addr(B), b"hop limit ran out here");
        let mut pkt = own_time_exceeded(addr(GATEWAY), &inner);
        let mut asked = None;
        let found = readdress_own_error(&mut pkt, |local, remote| {
            asked = Some((local, remote));
            true
        })
        .expect("an own error");
        assert_eq!(asked, Some((addr(B), addr(A))));
        assert_eq!(
            found,
            OwnError {
                src: addr(GATEWAY),
                dst: addr(A),
                quoted_dst: addr(B),
            }
        );
        let ip = Ipv6Packet::new_checked(&pkt[..]).unwrap();
        assert_eq!((ip.src_addr(), ip.dst_addr()), (addr(B), addr(A)));
        let icmp = Icmpv6Packet::new_checked(ip.payload()).unwrap();
        assert!(icmp.verify_checksum(addr(B), addr(A)));
        assert_eq!(icmp.payload(), &inner[..], "the quote is untouched");
    }

    #[test]
    fn what_is_not_an_own_error_is_left_untouched() {
        let inner = udp(addr(A), addr(B), b"x");
        let check = |mut pkt: Vec<u8>, known: bool| {
            let before = pkt.clone();
            assert_eq!(readdress_own_error(&mut pkt, |_, _| known), None);
            assert_eq!(pkt, before);
        };
        // No stream for the pair.
        check(own_time_exceeded(addr(GATEWAY), &inner), false);
        // Already from the local host (Host B's own error: an ordinary packet).
        check(own_time_exceeded(addr(B), &inner), true);
        // About a packet that did not come from the error's destination.
        let other = udp(addr(GATEWAY), addr(B), b"x");
        check(own_time_exceeded(addr(GATEWAY), &other), true);
        // A bad checksum, an informational type, a quote shorter than a header, truncated.
        let mut bad = own_time_exceeded(addr(GATEWAY), &inner);
        bad[IPV6_HEADER_LEN + 2] ^= 1;
        check(bad, true);
        let mut echo = own_time_exceeded(addr(GATEWAY), &inner);
        echo[IPV6_HEADER_LEN] = 128;
        check(echo, true);
        check(own_time_exceeded(addr(GATEWAY), &inner[..39]), true);
        let whole = own_time_exceeded(addr(GATEWAY), &inner);
        for cut in [0, 20, 40, 47, whole.len() - 1] {
            check(whole[..cut].to_vec(), true);
        }
    }
}
