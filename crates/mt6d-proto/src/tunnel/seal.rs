//! Encapsulation: inner IPv6 packet -> tunnel payload (UDP payload).

use std::cell::RefCell;
use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use super::HeaderKey;
use super::{
    aead_key_bytes, frame_payload_len, outer_aad, payload_len, AeadKey, CounterSpace, KeyPhase,
    SealError, COUNTER_LEN, COUNTER_LIMIT, FRAME_HEADROOM, INNER_HEADER_CARRIED, KEEPALIVE_LEN,
    OUTER_AAD_LEN, SEAL_HEADROOM, TAG_LEN,
};
use crate::wire::relay::frame::{frame_len, RelayFrame, RelayRepr};
use crate::wire::{Ipv6Packet, IPV6_HEADER_LEN};
use crate::{AeadAlg, Mode, Route};

thread_local! {
    /// Auth-mode AAD is outer fields || counter || clear bytes, which the AEAD needs contiguous. One
    /// buffer per thread: it grows to the largest packet once, then nothing is allocated per packet.
    static AAD_SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Seals inner packets of one stream, one direction. `Send + Sync`: share it between sending threads.
///
/// With a static key the counter starts at the persisted high-water mark given to
/// [`crate::Stream::sealer`] and never passes the reserved limit (raised by
/// [`Sealer::reserve_until`] once the caller has persisted a higher one), so a restarted gateway
/// never reuses a (key, nonce) pair whatever its clock says (docs/PROTOCOL.md §4.3).
/// With a handshake key (made by the handshake module) it starts at 0 under the key's phase bit: the key
/// is fresh, so no earlier run can have used it (§9.5).
#[derive(Debug)]
pub struct Sealer {
    mode: Mode,
    key: Option<AeadKey>,
    space: CounterSpace,
    /// The packet number the next packet uses.
    counter: AtomicU64,
    /// Counters at or above this are not reserved (persisted) yet: refused, never used.
    reserved: AtomicU64,
    /// Counters at or above this are past the key's packet limit ([`Sealer::with_key_limit`]).
    key_end: u64,
    /// 0: the key limit was not reached; 1: reached; 2: reached and reported.
    key_limit_state: AtomicU8,
    first: u64,
    key_id: Option<u64>,
    local_true: Ipv6Addr,
    remote_true: Ipv6Addr,
}

impl Sealer {
    pub(crate) fn new(
        mode: Mode,
        key: Option<AeadKey>,
        first: u64,
        reserved_until: u64,
        local_true: Ipv6Addr,
        remote_true: Ipv6Addr,
    ) -> Self {
        Self {
            mode,
            key,
            space: CounterSpace::Static,
            counter: AtomicU64::new(first),
            reserved: AtomicU64::new(reserved_until),
            key_end: u64::MAX,
            key_limit_state: AtomicU8::new(0),
            first,
            key_id: None,
            local_true,
            remote_true,
        }
    }

    /// A sealer under a handshake-derived key (auth or encrypt mode), packet numbers from 0 under
    /// `phase` (the peer's receive slot).
    pub(crate) fn for_session(
        mode: Mode,
        alg: AeadAlg,
        key: &[u8; 32],
        phase: KeyPhase,
        local_true: Ipv6Addr,
        remote_true: Ipv6Addr,
    ) -> Self {
        Self {
            mode,
            key: Some(aead_key_bytes(mode, alg, key)),
            space: CounterSpace::Session(phase),
            counter: AtomicU64::new(0),
            // A fresh key: every packet number is free (the phase space ends at 2^62).
            reserved: AtomicU64::new(u64::MAX),
            key_end: u64::MAX,
            key_limit_state: AtomicU8::new(0),
            first: 0,
            key_id: Some(key_id(key)),
            local_true,
            remote_true,
        }
    }

    /// Refuses every counter at or past `end` ([`SealError::KeyLimit`]): a pre-shared key has
    /// then protected as many packets as its AEAD allows (docs/PROTOCOL.md §4.3). The caller
    /// computes `end` from the counters the key has used before, in this run and earlier ones.
    #[must_use]
    pub fn with_key_limit(mut self, end: u64) -> Self {
        self.key_end = end;
        self
    }

    /// True exactly once, at the first call after a packet was refused at the key limit
    /// ([`Sealer::with_key_limit`]): lets the caller log it once, off the packet path.
    pub fn take_key_limit_notice(&self) -> bool {
        self.key_limit_state
            .compare_exchange(1, 2, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Ends this sealer's use of its key and returns the first counter it never used: every
    /// later seal is refused, so a caller that makes a new sealer for the same key from the
    /// returned counter on (a server client removed and added again, docs/PROTOCOL.md §4.3)
    /// cannot meet a counter this one sealed, even with a seal racing this call (one atomic
    /// swap orders them).
    pub fn retire(&self) -> u64 {
        self.counter.swap(COUNTER_LIMIT, Ordering::SeqCst)
    }

    /// The stream's payload format.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The counter field the next packet will use (None once exhausted).
    pub fn next_counter(&self) -> Option<u64> {
        self.space.field(self.counter.load(Ordering::Relaxed))
    }

    /// Allows counters below `limit` (a static-key sealer's caller calls this only after the new
    /// limit is on stable storage). Never lowers the limit.
    pub fn reserve_until(&self, limit: u64) {
        self.reserved.fetch_max(limit, Ordering::Release);
    }

    /// The current reserved limit: counters from here on are refused until it is raised.
    pub fn reserved_until(&self) -> u64 {
        self.reserved.load(Ordering::Acquire)
    }

    /// Packets (and keepalives) sealed so far: what a rekey budget counts.
    pub fn sealed(&self) -> u64 {
        self.counter
            .load(Ordering::Relaxed)
            .saturating_sub(self.first)
    }

    /// A one-way fingerprint of a handshake key (None for a static key): tells keys apart in logs
    /// and lets tests prove that no (key, nonce) pair repeats.
    pub fn key_id(&self) -> Option<u64> {
        self.key_id
    }

    pub(crate) fn key(&self) -> Option<&AeadKey> {
        self.key.as_ref()
    }

    pub(crate) fn space(&self) -> CounterSpace {
        self.space
    }

    /// The key phase its packets carry (None for a static key).
    pub fn phase(&self) -> Option<KeyPhase> {
        match self.space {
            CounterSpace::Static => None,
            CounterSpace::Session(p) => Some(p),
        }
    }

    /// Seals a keepalive for `route` into `out` (auth/encrypt only): counter || tag over the outer
    /// fields and counter, no body. Returns [`KEEPALIVE_LEN`].
    pub fn seal_keepalive(&self, route: &Route, out: &mut [u8]) -> Result<usize, SealError> {
        let Some(key) = &self.key else {
            return Err(SealError::NoKeepaliveInPlain);
        };
        let Some(out) = out.get_mut(..KEEPALIVE_LEN) else {
            return Err(SealError::BufferTooSmall {
                have: out.len(),
                need: KEEPALIVE_LEN,
            });
        };
        let counter = self.next()?;
        out[..COUNTER_LEN].copy_from_slice(&counter.to_be_bytes());
        let outer = outer_aad(&route.local, &route.remote, counter);
        let tag = key.seal(counter, &outer, &mut []);
        out[COUNTER_LEN..].copy_from_slice(&tag);
        Ok(KEEPALIVE_LEN)
    }

    /// Seals `inner` (one whole IPv6 packet from the local true address to the remote true address)
    /// for `route`, writing the UDP payload into `out`. Returns the payload length.
    pub fn seal(&self, route: &Route, inner: &[u8], out: &mut [u8]) -> Result<usize, SealError> {
        let pkt = Ipv6Packet::new_checked(inner).map_err(SealError::Malformed)?;
        if pkt.src_addr() != self.local_true {
            return Err(SealError::WrongSource);
        }
        if pkt.dst_addr() != self.remote_true {
            return Err(SealError::WrongDestination);
        }
        let need = payload_len(self.mode, inner.len());
        if out.len() < need {
            return Err(SealError::BufferTooSmall {
                have: out.len(),
                need,
            });
        }
        let out = &mut out[..need];
        let hdr = pkt.header_without_addrs();
        let body = &inner[IPV6_HEADER_LEN..];
        let (Some(key), Mode::Auth | Mode::Encrypt) = (&self.key, self.mode) else {
            out[..INNER_HEADER_CARRIED].copy_from_slice(hdr);
            out[INNER_HEADER_CARRIED..].copy_from_slice(body);
            return Ok(need);
        };
        let counter = self.next()?;
        out[..COUNTER_LEN].copy_from_slice(&counter.to_be_bytes());
        let clear_end = need - TAG_LEN;
        out[COUNTER_LEN..COUNTER_LEN + INNER_HEADER_CARRIED].copy_from_slice(hdr);
        out[COUNTER_LEN + INNER_HEADER_CARRIED..clear_end].copy_from_slice(body);
        let outer = outer_aad(&route.local, &route.remote, counter);
        let tag = if self.mode == Mode::Encrypt {
            key.seal(counter, &outer, &mut out[COUNTER_LEN..clear_end])
        } else {
            AAD_SCRATCH.with(|s| {
                let mut s = s.borrow_mut();
                s.clear();
                s.reserve(OUTER_AAD_LEN + clear_end);
                s.extend_from_slice(&outer[..OUTER_AAD_LEN - COUNTER_LEN]);
                s.extend_from_slice(&out[..clear_end]);
                key.seal(counter, &s, &mut [])
            })
        };
        out[clear_end..].copy_from_slice(&tag);
        Ok(need)
    }

    /// The send side's one step for a data packet, the mirror of [`crate::classify::receive`]:
    /// [`Sealer::seal`], then header protection (docs/PROTOCOL.md §4.5) with `header`, the send
    /// header key of the stream of the route set the packet travels on (None: plain mode, nothing
    /// to mask). What a role's send path calls, so that no role can forget the second step.
    /// Returns the payload length; on error nothing in `out` may be sent.
    pub fn seal_protected(
        &self,
        route: &Route,
        header: Option<&HeaderKey>,
        inner: &[u8],
        out: &mut [u8],
    ) -> Result<usize, SealError> {
        let n = self.seal(route, inner, out)?;
        protect(header, &mut out[..n])?;
        Ok(n)
    }

    /// [`Sealer::seal`] without copying the packet: `buf` holds [`SEAL_HEADROOM`] free bytes, then
    /// the inner packet (`inner_len` bytes), then room for the tag ([`TAG_LEN`] bytes; plain mode
    /// needs none). Returns the tunnel payload, a slice of `buf` that starts 24 bytes into the
    /// inner packet (32 in plain mode), byte for byte what [`Sealer::seal`] writes. The inner
    /// payload stays where it is, and in auth mode the AAD is sealed where it lies, so nothing is
    /// copied (auth mode writes the outer fields into the headroom). The bytes of `buf` in front
    /// of the returned payload are scratch afterwards; on error `buf` is unchanged.
    pub fn seal_in_place<'b>(
        &self,
        route: &Route,
        buf: &'b mut [u8],
        inner_len: usize,
    ) -> Result<&'b mut [u8], SealError> {
        let h = SEAL_HEADROOM;
        let inner = buf.get(h..h.saturating_add(inner_len)).unwrap_or_default();
        let pkt = Ipv6Packet::new_checked(inner).map_err(SealError::Malformed)?;
        if pkt.src_addr() != self.local_true {
            return Err(SealError::WrongSource);
        }
        if pkt.dst_addr() != self.remote_true {
            return Err(SealError::WrongDestination);
        }
        let keyed = match (&self.key, self.mode) {
            (Some(key), Mode::Auth | Mode::Encrypt) => Some(key),
            _ => None,
        };
        let end = h + inner_len + keyed.map_or(0, |_| TAG_LEN);
        if buf.len() < end {
            return Err(SealError::BufferTooSmall {
                have: buf.len(),
                need: end,
            });
        }
        // The carried header bytes go right in front of the inner payload (over the destination
        // address's last 8 bytes).
        let body = h + IPV6_HEADER_LEN - INNER_HEADER_CARRIED;
        let Some(key) = keyed else {
            buf.copy_within(h..h + INNER_HEADER_CARRIED, body);
            return Ok(&mut buf[body..end]);
        };
        let counter = self.next()?;
        buf.copy_within(h..h + INNER_HEADER_CARRIED, body);
        let start = body - COUNTER_LEN;
        let clear_end = end - TAG_LEN;
        buf[start..body].copy_from_slice(&counter.to_be_bytes());
        let outer = outer_aad(&route.local, &route.remote, counter);
        let tag = if self.mode == Mode::Encrypt {
            key.seal(counter, &outer, &mut buf[body..clear_end])
        } else {
            // AAD = outer fields || counter || clear bytes, contiguous from the buffer's start.
            let aad_start = start - (OUTER_AAD_LEN - COUNTER_LEN);
            buf[aad_start..start].copy_from_slice(&outer[..OUTER_AAD_LEN - COUNTER_LEN]);
            key.seal(counter, &buf[aad_start..clear_end], &mut [])
        };
        buf[clear_end..end].copy_from_slice(&tag);
        Ok(&mut buf[start..end])
    }

    /// Seals a relay frame for `route` of a relay link (docs/PROTOCOL.md §10.2): writes the
    /// header `repr`, `payload` (`repr.payload_len` bytes) and zero padding to the size class of
    /// `frame_max` (§10.4) straight into `out` behind the counter, encrypts it there and appends
    /// the tag. Returns the link payload's length ([`frame_payload_len`] of the frame's). The
    /// caller applies header protection (§4.5) as for any payload. Encrypt mode only.
    pub fn seal_frame(
        &self,
        route: &Route,
        repr: &RelayRepr,
        payload: &[u8],
        frame_max: usize,
        out: &mut [u8],
    ) -> Result<usize, SealError> {
        self.frame_key()?;
        let flen = frame_len(payload.len(), frame_max);
        let need = frame_payload_len(flen);
        let have = out.len();
        let Some(buf) = out.get_mut(..need) else {
            return Err(SealError::BufferTooSmall { have, need });
        };
        let written = repr
            .write_frame(payload, frame_max, &mut buf[FRAME_HEADROOM..])
            .map_err(SealError::BadFrame)?;
        debug_assert_eq!(written, flen);
        self.seal_frame_in_place(route, buf, flen).map(|p| p.len())
    }

    /// [`Sealer::seal_frame`], then header protection with `header` (the relay link's send set's
    /// send header key): a relay link's one step for a frame it makes, as
    /// [`Sealer::seal_protected`] is for a data packet.
    pub fn seal_frame_protected(
        &self,
        route: &Route,
        header: Option<&HeaderKey>,
        repr: &RelayRepr,
        payload: &[u8],
        frame_max: usize,
        out: &mut [u8],
    ) -> Result<usize, SealError> {
        let n = self.seal_frame(route, repr, payload, frame_max, out)?;
        protect(header, &mut out[..n])?;
        Ok(n)
    }

    /// [`Sealer::seal_frame_in_place`], then header protection with `header`: a relay's one
    /// step for a frame it forwards.
    pub fn seal_frame_in_place_protected<'b>(
        &self,
        route: &Route,
        header: Option<&HeaderKey>,
        buf: &'b mut [u8],
        frame_len: usize,
    ) -> Result<&'b mut [u8], SealError> {
        let wire = self.seal_frame_in_place(route, buf, frame_len)?;
        protect(header, wire)?;
        Ok(wire)
    }

    /// [`Sealer::seal_frame`] for a frame already laid out in `buf`: [`FRAME_HEADROOM`] free
    /// bytes, the frame (`frame_len` bytes, padding included: a relay forwards a frame it opened
    /// with only its hop limit changed, §10.3), then room for the tag ([`TAG_LEN`]). The frame is
    /// checked first ([`RelayFrame::new_checked`]: a relay link carries frames and nothing else)
    /// and encrypted where it lies. Returns the link payload, `buf[..frame_len + 24]`. On error
    /// `buf` is unchanged.
    pub fn seal_frame_in_place<'b>(
        &self,
        route: &Route,
        buf: &'b mut [u8],
        frame_len: usize,
    ) -> Result<&'b mut [u8], SealError> {
        let key = self.frame_key()?;
        let end = frame_payload_len(frame_len);
        if buf.len() < end {
            return Err(SealError::BufferTooSmall {
                have: buf.len(),
                need: end,
            });
        }
        let clear_end = end - TAG_LEN;
        RelayFrame::new_checked(&buf[FRAME_HEADROOM..clear_end]).map_err(SealError::BadFrame)?;
        let counter = self.next()?;
        buf[..COUNTER_LEN].copy_from_slice(&counter.to_be_bytes());
        let outer = outer_aad(&route.local, &route.remote, counter);
        let tag = key.seal(counter, &outer, &mut buf[COUNTER_LEN..clear_end]);
        buf[clear_end..end].copy_from_slice(&tag);
        Ok(&mut buf[..end])
    }

    /// The AEAD key of an encrypt-mode sealer, the only kind that carries relay frames.
    fn frame_key(&self) -> Result<&AeadKey, SealError> {
        match (&self.key, self.mode) {
            (Some(key), Mode::Encrypt) => Ok(key),
            _ => Err(SealError::NotEncrypt { mode: self.mode }),
        }
    }

    fn next(&self) -> Result<u64, SealError> {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        if n >= self.key_end {
            // A retired sealer's numbers (>= COUNTER_LIMIT) are no key limit to report.
            if n < COUNTER_LIMIT {
                let _ = self.key_limit_state.compare_exchange(
                    0,
                    1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
            return Err(SealError::KeyLimit);
        }
        if n >= self.reserved.load(Ordering::Acquire) {
            // The number is burnt, not used: the caller's reservation fell behind the traffic.
            return Err(SealError::CounterNotReserved);
        }
        match self.space.field(n) {
            Some(field) => Ok(field),
            None => {
                // Keep it pinned so repeated calls keep failing instead of wrapping back to valid
                // values.
                self.counter.store(COUNTER_LIMIT, Ordering::Relaxed);
                Err(SealError::CounterExhausted)
            }
        }
    }
}

pub(crate) fn key_id(key: &[u8; 32]) -> u64 {
    let h = blake3::derive_key("mt6d-proto 2026-11-21 key fingerprint", key);
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[..8]);
    u64::from_be_bytes(b)
}

/// Header protection of a sealed payload (§4.5), None: plain mode.
fn protect(header: Option<&HeaderKey>, payload: &mut [u8]) -> Result<(), SealError> {
    match header {
        Some(hk) => hk.protect(payload).map_err(SealError::HeaderProtection),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{addr, pair, udp, A, B};
    use crate::{AeadAlg, Epoch};

    #[test]
    fn refuses_foreign_and_malformed_packets() {
        let (a, _) = pair(Mode::Encrypt, AeadAlg::Aes256Gcm);
        let s = a.sealer(0, u64::MAX);
        let r = a.route(Epoch(1));
        let mut out = [0u8; 2048];
        let ok = udp(addr(A), addr(B), b"hi");
        assert!(s.seal(&r, &ok, &mut out).is_ok());
        assert_eq!(
            s.seal(&r, &udp(addr(B), addr(B), b"x"), &mut out),
            Err(SealError::WrongSource)
        );
        assert_eq!(
            s.seal(&r, &udp(addr(A), addr(A), b"x"), &mut out),
            Err(SealError::WrongDestination)
        );
        assert!(matches!(
            s.seal(&r, &ok[..39], &mut out),
            Err(SealError::Malformed(_))
        ));
        assert!(matches!(
            s.seal(&r, &ok[..ok.len() - 1], &mut out),
            Err(SealError::Malformed(_))
        ));
        assert_eq!(
            s.seal(&r, &ok, &mut out[..ok.len() - 9]),
            Err(SealError::BufferTooSmall {
                have: ok.len() - 9,
                need: ok.len() - 8
            })
        );
    }

    /// The one-call seal writes byte for byte what sealing and then protecting writes (the wire
    /// format is §4.5's), and what `classify::receive` and the opener take back.
    #[test]
    fn a_protected_seal_is_the_seal_then_the_header_protection() {
        use crate::classify::{receive, Class};
        for mode in [Mode::Plain, Mode::Auth, Mode::Encrypt] {
            let (a, b) = pair(mode, AeadAlg::Aes256Gcm);
            let r = a.route(Epoch(1));
            let pkt = udp(addr(A), addr(B), b"protected in one call");
            let (one, two) = (a.sealer(0, u64::MAX), a.sealer(0, u64::MAX));
            let hk = a.send_header_key();
            assert_eq!(hk.is_none(), mode == Mode::Plain);
            let mut got = [0u8; 256];
            let n = one.seal_protected(&r, hk, &pkt, &mut got).unwrap();
            let mut want = [0u8; 256];
            let m = two.seal(&r, &pkt, &mut want).unwrap();
            if let Some(hk) = hk {
                assert_ne!(got[..8], want[..8], "{mode}: the counter is masked");
                hk.protect(&mut want[..m]).unwrap();
            }
            assert_eq!(got[..n], want[..m], "{mode}");
            let wire = &mut got[..n];
            assert_eq!(receive(b.recv_header_key(), wire), Ok(Class::Data));
            let mut inner = [0u8; 256];
            let len = b
                .opener()
                .open(&b.route(Epoch(1)), wire, &mut inner)
                .unwrap();
            assert_eq!(inner[..len], pkt[..], "{mode}");
        }
    }

    #[test]
    fn counter_starts_at_the_mark_and_never_reaches_the_high_bit() {
        let (a, _) = pair(Mode::Auth, AeadAlg::ChaCha20Poly1305);
        let mark = 5 << 26;
        let s = a.sealer(mark, u64::MAX);
        let r = a.route(Epoch(1));
        let mut out = [0u8; 256];
        let pkt = udp(addr(A), addr(B), b"hi");
        s.seal(&r, &pkt, &mut out).unwrap();
        assert_eq!(u64::from_be_bytes(out[..8].try_into().unwrap()), mark);
        assert_eq!(s.next_counter(), Some(mark + 1));
        let s = a.sealer(COUNTER_LIMIT - 1, u64::MAX);
        assert!(s.seal(&r, &pkt, &mut out).is_ok());
        assert_eq!(s.seal(&r, &pkt, &mut out), Err(SealError::CounterExhausted));
        assert_eq!(s.seal(&r, &pkt, &mut out), Err(SealError::CounterExhausted));
    }

    #[test]
    fn static_counters_never_pass_the_reserved_limit() {
        let (a, _) = pair(Mode::Encrypt, AeadAlg::Aes256Gcm);
        let s = a.sealer(100, 102);
        let r = a.route(Epoch(1));
        let pkt = udp(addr(A), addr(B), b"hi");
        let mut out = [0u8; 256];
        let mut used = Vec::new();
        for _ in 0..5 {
            if s.seal(&r, &pkt, &mut out).is_ok() {
                used.push(u64::from_be_bytes(out[..8].try_into().unwrap()));
            }
        }
        assert_eq!(used, vec![100, 101], "only reserved counters are used");
        assert_eq!(
            s.seal(&r, &pkt, &mut out),
            Err(SealError::CounterNotReserved)
        );
        s.reserve_until(90);
        assert_eq!(s.reserved_until(), 102, "a reservation never shrinks");
        s.reserve_until(200);
        let n = s.seal(&r, &pkt, &mut out).unwrap();
        assert!(n > 0);
        let c = u64::from_be_bytes(out[..8].try_into().unwrap());
        assert!((102..200).contains(&c), "{c}");
    }

    #[test]
    fn a_key_limit_refuses_and_is_reported_once() {
        let (a, _) = pair(Mode::Encrypt, AeadAlg::Aes256Gcm);
        let s = a.sealer(10, u64::MAX).with_key_limit(12);
        let r = a.route(Epoch(1));
        let mut out = [0u8; 64];
        assert!(!s.take_key_limit_notice(), "not reached yet");
        assert_eq!(s.seal_keepalive(&r, &mut out), Ok(KEEPALIVE_LEN));
        assert_eq!(s.seal_keepalive(&r, &mut out), Ok(KEEPALIVE_LEN));
        assert_eq!(s.seal_keepalive(&r, &mut out), Err(SealError::KeyLimit));
        assert_eq!(s.seal_keepalive(&r, &mut out), Err(SealError::KeyLimit));
        assert!(s.take_key_limit_notice());
        assert!(!s.take_key_limit_notice(), "once");
        assert_eq!(SealError::KeyLimit.reason(), "seal_key_limit");
    }

    #[test]
    fn a_retired_sealer_seals_nothing_more() {
        let (a, _) = pair(Mode::Encrypt, AeadAlg::Aes256Gcm);
        let s = a.sealer(7, u64::MAX).with_key_limit(1 << 23);
        let r = a.route(Epoch(1));
        let mut out = [0u8; 64];
        s.seal_keepalive(&r, &mut out).unwrap();
        s.seal_keepalive(&r, &mut out).unwrap();
        assert_eq!(s.retire(), 9, "the first counter never used");
        assert!(s.seal_keepalive(&r, &mut out).is_err());
        assert!(!s.take_key_limit_notice(), "retiring is no key limit");
        // Its successor starts there and never meets a counter the retired one used.
        let next = a.sealer(9, u64::MAX);
        next.seal_keepalive(&r, &mut out).unwrap();
        assert_eq!(u64::from_be_bytes(out[..8].try_into().unwrap()), 9);
    }

    #[test]
    fn session_counters_carry_the_phase_and_stop_below_it() {
        let (a, _) = pair(Mode::Encrypt, AeadAlg::Aes256Gcm);
        let r = a.route(Epoch(1));
        let pkt = udp(addr(A), addr(B), b"hi");
        let mut out = [0u8; 256];
        let k = [7u8; 32];
        for phase in [KeyPhase::Zero, KeyPhase::One] {
            let s = Sealer::for_session(
                Mode::Encrypt,
                AeadAlg::Aes256Gcm,
                &k,
                phase,
                addr(A),
                addr(B),
            );
            s.seal(&r, &pkt, &mut out).unwrap();
            let field = u64::from_be_bytes(out[..8].try_into().unwrap());
            assert_eq!(KeyPhase::of_counter(field), phase);
            assert_eq!(field & !(1 << 62), 0, "packet numbers start at 0");
            assert_eq!(s.seal_keepalive(&r, &mut out), Ok(KEEPALIVE_LEN));
            assert_eq!(s.sealed(), 2);
            s.counter
                .store(super::super::SESSION_COUNTER_LIMIT - 1, Ordering::Relaxed);
            assert!(s.seal(&r, &pkt, &mut out).is_ok());
            assert_eq!(s.seal(&r, &pkt, &mut out), Err(SealError::CounterExhausted));
            assert_eq!(s.seal(&r, &pkt, &mut out), Err(SealError::CounterExhausted));
        }
    }

    /// `seal_in_place` is `seal` without the copy: the same bytes, for every mode and AEAD, from
    /// an empty inner payload to a jumbo one, and the same refusals, leaving `buf` untouched.
    #[test]
    fn seal_in_place_writes_what_seal_writes() {
        for (mode, alg) in [
            (Mode::Plain, AeadAlg::Aes256Gcm),
            (Mode::Auth, AeadAlg::Aes256Gcm),
            (Mode::Auth, AeadAlg::ChaCha20Poly1305),
            (Mode::Encrypt, AeadAlg::Aes256Gcm),
            (Mode::Encrypt, AeadAlg::ChaCha20Poly1305),
        ] {
            let (a, _) = pair(mode, alg);
            let (copying, in_place) = (a.sealer(1 << 26, u64::MAX), a.sealer(1 << 26, u64::MAX));
            let r = a.route(Epoch(9));
            for len in [0, 1, 7, 8, 15, 16, 17, 1360, 8960] {
                let body: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
                let pkt = udp(addr(A), addr(B), &body);
                let mut out = vec![0u8; pkt.len() + 64];
                let n = copying.seal(&r, &pkt, &mut out).unwrap();
                let mut buf = vec![0xeeu8; SEAL_HEADROOM + pkt.len() + TAG_LEN];
                buf[SEAL_HEADROOM..SEAL_HEADROOM + pkt.len()].copy_from_slice(&pkt);
                let sealed = in_place.seal_in_place(&r, &mut buf, pkt.len()).unwrap();
                assert_eq!(sealed, &out[..n], "{mode} {alg} {len}");
            }
            let pkt = udp(addr(A), addr(B), b"hi");
            let fill = |extra: usize| {
                let mut b = vec![0u8; SEAL_HEADROOM + pkt.len() + extra];
                b[SEAL_HEADROOM..SEAL_HEADROOM + pkt.len()].copy_from_slice(&pkt);
                b
            };
            let tail = if mode == Mode::Plain { 0 } else { TAG_LEN };
            if tail > 0 {
                let mut short = fill(tail - 1);
                let before = short.clone();
                assert_eq!(
                    in_place.seal_in_place(&r, &mut short, pkt.len()),
                    Err(SealError::BufferTooSmall {
                        have: before.len(),
                        need: before.len() + 1
                    })
                );
                assert_eq!(
                    short, before,
                    "a refused packet leaves the buffer as it was"
                );
            }
            let mut b = fill(tail);
            assert!(matches!(
                in_place.seal_in_place(&r, &mut b, pkt.len() - 1),
                Err(SealError::Malformed(_))
            ));
            assert!(matches!(
                in_place.seal_in_place(&r, &mut b, usize::MAX),
                Err(SealError::Malformed(_))
            ));
            let mut foreign = fill(tail);
            foreign[SEAL_HEADROOM + 8..SEAL_HEADROOM + 24].copy_from_slice(&addr(B).octets());
            assert_eq!(
                in_place.seal_in_place(&r, &mut foreign, pkt.len()),
                Err(SealError::WrongSource)
            );
            assert!(in_place.seal_in_place(&r, &mut b, pkt.len()).is_ok());
        }
    }

    #[test]
    fn plain_is_exactly_the_thesis_layout() {
        let (a, _) = pair(Mode::Plain, AeadAlg::Aes256Gcm);
        let s = a.sealer(0, 0);
        let pkt = udp(addr(A), addr(B), b"payload");
        let mut out = [0u8; 256];
        let n = s.seal(&a.route(Epoch(3)), &pkt, &mut out).unwrap();
        assert_eq!(n, pkt.len() - 32);
        assert_eq!(&out[..8], &pkt[..8]);
        assert_eq!(&out[8..n], &pkt[40..]);
    }
}
