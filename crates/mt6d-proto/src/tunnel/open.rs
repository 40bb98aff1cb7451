//! Decapsulation: tunnel payload -> inner IPv6 packet, restored byte for byte (000 §2.6 Fig. 2.6:
//! the true addresses are put back, so the inner TCP/UDP/ICMPv6 checksums stay valid).

use std::net::{Ipv6Addr, SocketAddrV6};
use std::ops::Range;
use std::sync::Arc;

use super::{
    aead_key_bytes, fixed_len, outer_aad, AeadKey, CounterSpace, KeyPhase, OpenError, ReplayWindow,
    TunnelPayload, COUNTER_LEN, INNER_HEADER_CARRIED, KEEPALIVE_LEN, MIN_FRAME_PAYLOAD,
    OPEN_HEADROOM, OUTER_AAD_LEN, TAG_LEN,
};
use crate::wire::relay::frame::RelayFrame;
use crate::wire::{IPV6_DST_ADDR, IPV6_HEADER_LEN, IPV6_SRC_ADDR};
use crate::{AeadAlg, Mode, Route};

/// Opens tunnel payloads of one stream, one direction. Owned by the receiving thread (`&mut self`:
/// it holds the replay window).
#[derive(Debug)]
pub struct Opener {
    mode: Mode,
    /// Shared with the [`FrameJob`]s it hands out (a relay opens frames outside its node's
    /// lock); wiped when the last holder drops it.
    key: Option<Arc<AeadKey>>,
    space: CounterSpace,
    replay: ReplayWindow,
    key_id: Option<u64>,
    local_true: Ipv6Addr,
    remote_true: Ipv6Addr,
    scratch: Vec<u8>,
}

/// A relay link payload's AEAD step, taken out of its [`Opener`] by [`Opener::frame_job`]: the
/// key, the counter and the outer AAD. [`FrameJob::open`] needs no access to the opener, so it
/// runs outside whatever lock guards it.
pub struct FrameJob {
    key: Arc<AeadKey>,
    counter: u64,
    aad: [u8; OUTER_AAD_LEN],
    /// The payload's length, checked by `frame_job` (at least a frame's minimum).
    len: usize,
}

impl std::fmt::Debug for FrameJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameJob")
            .field("counter", &self.counter)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl FrameJob {
    /// Step 8 of §4.2 on `payload`, the same bytes `frame_job` saw: verifies the tag and
    /// decrypts the frame in place, `payload[8..len - 16]`. On error `payload` is scratch.
    pub fn open(&self, payload: &mut [u8]) -> Result<(), OpenError> {
        if payload.len() != self.len {
            return Err(OpenError::Truncated {
                have: payload.len(),
                need: self.len,
            });
        }
        let clear_end = self.len - TAG_LEN;
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(&payload[clear_end..]);
        self.key
            .open(
                self.counter,
                &self.aad,
                &t,
                &mut payload[COUNTER_LEN..clear_end],
            )
            .map_err(|_| OpenError::BadTag)
    }
}

/// A tunnel payload's AEAD step and the restoration of its inner packet (steps 8-9 of §4.2),
/// taken out of its [`Opener`] by [`Opener::packet_job`]: the key, the counter, the outer AAD and
/// the true addresses. [`PacketJob::open`] needs no access to the opener, so it runs outside
/// whatever lock guards it (an edge gateway's end-to-end layer, docs/ARCHITECTURE.md "Relays").
pub struct PacketJob {
    key: Arc<AeadKey>,
    counter: u64,
    aad: [u8; OUTER_AAD_LEN],
    /// The payload's length (at [`OPEN_HEADROOM`] of the buffer) and its inner payload's,
    /// checked by `packet_job`.
    len: usize,
    inner_len: usize,
    inner_src: Ipv6Addr,
    inner_dst: Ipv6Addr,
}

impl std::fmt::Debug for PacketJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketJob")
            .field("counter", &self.counter)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl PacketJob {
    /// Steps 8 and 9 of §4.2 on `buf`, the bytes `packet_job` saw ([`OPEN_HEADROOM`] free bytes,
    /// then the payload): verifies the tag, decrypts in place and restores the inner packet as
    /// [`Opener::open_in_place`] does; returns where it is in `buf`. `Err(BadInner)` comes after
    /// the tag verified (the counter is then still taken, as `open_in_place` takes it); on any
    /// other error the tag did not verify. On error `buf` is scratch.
    pub fn open(&self, buf: &mut [u8]) -> Result<Range<usize>, OpenError> {
        let h = OPEN_HEADROOM;
        let end = h + self.len;
        if buf.len() < end {
            return Err(OpenError::BufferTooSmall {
                have: buf.len(),
                need: end,
            });
        }
        let body = h + COUNTER_LEN;
        let payload_at = body + INNER_HEADER_CARRIED;
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(&buf[end - TAG_LEN..end]);
        self.key
            .open(self.counter, &self.aad, &t, &mut buf[body..end - TAG_LEN])
            .map_err(|_| OpenError::BadTag)?;
        let m = self.inner_len;
        let start = payload_at - IPV6_HEADER_LEN;
        buf.copy_within(body..payload_at, start);
        let out = &mut buf[start..payload_at + m];
        out[IPV6_SRC_ADDR].copy_from_slice(&self.inner_src.octets());
        out[IPV6_DST_ADDR].copy_from_slice(&self.inner_dst.octets());
        if out[0] >> 4 != 6 || usize::from(u16::from_be_bytes([out[4], out[5]])) != m {
            return Err(OpenError::BadInner);
        }
        Ok(start..payload_at + m)
    }
}

/// What a relay link payload's AEAD step needs of an [`Opener`], without its replay window:
/// the key and the counter space. Taken out by [`Opener::frame_key`] for a driver that opens
/// payloads before it takes the lock guarding the opener (docs/ARCHITECTURE.md "Relays"); the
/// replay window stays with the opener, and [`Opener::commit_frame`] takes the counter.
#[derive(Clone)]
pub struct FrameKey {
    key: Arc<AeadKey>,
    space: CounterSpace,
}

impl std::fmt::Debug for FrameKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameKey")
            .field("space", &self.space)
            .finish_non_exhaustive()
    }
}

impl FrameKey {
    /// Steps 0-7 of §4.2 as [`Opener::frame_job`] takes them, but for the replay window (left
    /// to [`Opener::commit_frame`]): the length and the counter's space. `None` for a keepalive.
    pub fn frame_job(&self, route: &Route, payload: &[u8]) -> Result<Option<FrameJob>, OpenError> {
        frame_job_of(&self.key, self.space, route, payload, None)
    }

    /// Whether a keepalive's tag verifies (its counter's space and tag, not the replay window,
    /// which its opener checks and takes).
    pub fn verify_keepalive(&self, route: &Route, payload: &[u8]) -> Result<(), OpenError> {
        if payload.len() != KEEPALIVE_LEN {
            return Err(OpenError::Truncated {
                have: payload.len(),
                need: KEEPALIVE_LEN,
            });
        }
        let d = Decap {
            mode: Mode::Encrypt,
            key: Some(&self.key),
            space: self.space,
            outer_src: route.remote,
            outer_dst: route.local,
            inner_src: Ipv6Addr::UNSPECIFIED,
            inner_dst: Ipv6Addr::UNSPECIFIED,
        };
        open_keepalive(&d, payload, None).map(|_| ())
    }
}

/// [`Opener::frame_job`] and [`FrameKey::frame_job`]: the length, the counter's space and, with
/// a window, its replay check (not its update).
fn frame_job_of(
    key: &Arc<AeadKey>,
    space: CounterSpace,
    route: &Route,
    payload: &[u8],
    replay: Option<&ReplayWindow>,
) -> Result<Option<FrameJob>, OpenError> {
    let len = payload.len();
    if len == KEEPALIVE_LEN {
        return Ok(None);
    }
    if len < MIN_FRAME_PAYLOAD {
        return Err(OpenError::Truncated {
            have: len,
            need: MIN_FRAME_PAYLOAD,
        });
    }
    let mut c = [0u8; COUNTER_LEN];
    c.copy_from_slice(&payload[..COUNTER_LEN]);
    let c = u64::from_be_bytes(c);
    if !space.accepts(c) {
        return Err(OpenError::BadCounter(c));
    }
    if replay.is_some_and(|w| !w.check(c)) {
        return Err(OpenError::Replay(c));
    }
    Ok(Some(FrameJob {
        key: key.clone(),
        counter: c,
        aad: outer_aad(&route.remote, &route.local, c),
        len,
    }))
}

impl Opener {
    pub(crate) fn new(
        mode: Mode,
        key: Option<AeadKey>,
        local_true: Ipv6Addr,
        remote_true: Ipv6Addr,
    ) -> Self {
        Self {
            mode,
            key: key.map(Arc::new),
            space: CounterSpace::Static,
            replay: ReplayWindow::new(),
            key_id: None,
            local_true,
            remote_true,
            scratch: Vec::new(),
        }
    }

    /// An opener under a handshake-derived key for packets of key phase `phase`.
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
            key: Some(Arc::new(aead_key_bytes(mode, alg, key))),
            space: CounterSpace::Session(phase),
            replay: ReplayWindow::new(),
            key_id: Some(super::seal::key_id(key)),
            local_true,
            remote_true,
            scratch: Vec::new(),
        }
    }

    /// A one-way fingerprint of a handshake key (None for a static key), as
    /// [`crate::Sealer::key_id`].
    pub fn key_id(&self) -> Option<u64> {
        self.key_id
    }

    /// How many packets the peer has sealed under this key as far as the packets opened show:
    /// the highest packet number accepted plus one (the phase bit left out), 0 before the first.
    pub fn packets_seen(&self) -> u64 {
        self.replay
            .top()
            .map_or(0, |top| (top & (super::SESSION_COUNTER_LIMIT - 1)) + 1)
    }

    /// The key phase it opens (None for a static key).
    pub fn phase(&self) -> Option<KeyPhase> {
        match self.space {
            CounterSpace::Static => None,
            CounterSpace::Session(p) => Some(p),
        }
    }

    /// Opens `udp_payload`, received on `route` (the accept route its outer addresses and ports
    /// matched), writing the restored inner packet (remote true -> local true) into `out`.
    /// Returns the inner packet length, or 0 for a valid keepalive (nothing to deliver).
    pub fn open(
        &mut self,
        route: &Route,
        udp_payload: &[u8],
        out: &mut [u8],
    ) -> Result<usize, OpenError> {
        let d = Decap {
            mode: self.mode,
            key: self.key.as_deref(),
            space: self.space,
            outer_src: route.remote,
            outer_dst: route.local,
            inner_src: self.remote_true,
            inner_dst: self.local_true,
        };
        decapsulate(
            &d,
            udp_payload,
            out,
            &mut self.scratch,
            Some(&mut self.replay),
        )
    }

    /// [`Opener::open`] without copying the packet: `buf` holds [`OPEN_HEADROOM`] free bytes,
    /// then the tunnel payload (`payload_len` bytes, header protection already removed). Returns
    /// the restored inner packet, a slice of `buf` that starts 24 bytes in front of the payload
    /// (32 in plain mode), byte for byte what [`Opener::open`] writes; empty for a valid
    /// keepalive. The inner payload stays where it is, and in auth mode the AAD is verified
    /// where it lies (the outer fields are written into the headroom), so nothing is copied.
    /// The same checks, in the same order, as [`Opener::open`]; on error `buf` is scratch.
    pub fn open_in_place<'b>(
        &mut self,
        route: &Route,
        buf: &'b mut [u8],
        payload_len: usize,
    ) -> Result<&'b mut [u8], OpenError> {
        let r = self.open_in_place_at(route, buf, payload_len)?;
        Ok(&mut buf[r])
    }

    /// Opens a relay link payload received on `route` (docs/PROTOCOL.md §10.2): receive steps
    /// 0-8 of §4.2 exactly as [`Opener::open`] (the caller has removed header protection), then
    /// the plaintext is checked as a relay frame (§10.3) in place of step 9. The frame is
    /// decrypted where it lies, `payload[8..len - 16]`, and returned as a checked view over it
    /// (mutable, so a relay can lower the hop limit and seal it again for the next link with
    /// [`crate::Sealer::seal_frame_in_place`] on the same buffer). `None` for a valid keepalive.
    ///
    /// The replay window takes the counter as soon as the tag verified, before the frame is
    /// checked: an authentic payload whose frame is refused is not accepted twice. An inner
    /// packet sealed by a peer that takes the link for a direct stream opens (same keys) and is
    /// refused as `relay_bad_kind` (its first byte is `0x6?`). Encrypt mode only; on error
    /// `payload` is scratch.
    pub fn open_frame<'b>(
        &mut self,
        route: &Route,
        payload: &'b mut [u8],
    ) -> Result<Option<RelayFrame<&'b mut [u8]>>, OpenError> {
        // Its three steps in a row: the checks, the AEAD, the replay window and the frame.
        let Some(job) = self.frame_job(route, payload)? else {
            let d = Decap {
                mode: self.mode,
                key: self.key.as_deref(),
                space: self.space,
                outer_src: route.remote,
                outer_dst: route.local,
                inner_src: self.remote_true,
                inner_dst: self.local_true,
            };
            open_keepalive(&d, payload, Some(&mut self.replay))?;
            return Ok(None);
        };
        job.open(payload)?;
        self.commit_frame(&job, payload)
    }

    /// [`Opener::open_frame`] in three steps, so that the AEAD runs without the opener (a relay's
    /// workers share one node behind a lock; docs/ARCHITECTURE.md "Relays"): this one takes
    /// steps 0-7 of §4.2 (the mode, the length, the counter's key phase and the replay window,
    /// checked, not yet updated) and returns what [`FrameJob::open`] needs; then
    /// [`Opener::commit_frame`]. `None` for a keepalive (open it with `open_frame`).
    pub fn frame_job(&self, route: &Route, payload: &[u8]) -> Result<Option<FrameJob>, OpenError> {
        match (&self.key, self.mode) {
            (Some(key), Mode::Encrypt) => {
                frame_job_of(key, self.space, route, payload, Some(&self.replay))
            }
            (_, mode) => Err(OpenError::NotEncrypt { mode }),
        }
    }

    /// The key and counter space [`Opener::frame_job`] uses, for a driver that opens relay link
    /// payloads before it takes the lock guarding this opener ([`FrameKey::frame_job`]; the
    /// jobs it makes pass [`Opener::made`]). None but in encrypt mode with a key.
    pub fn frame_key(&self) -> Option<FrameKey> {
        match (&self.key, self.mode) {
            (Some(key), Mode::Encrypt) => Some(FrameKey {
                key: key.clone(),
                space: self.space,
            }),
            _ => None,
        }
    }

    /// The last step of [`Opener::frame_job`]'s open, after [`FrameJob::open`] verified
    /// `payload`: the counter into the replay window (refused if another packet took it in the
    /// meantime: a replay that raced the original through another worker), then the frame
    /// check in place of step 9, as [`Opener::open_frame`]. `Ok(None)`: `job` was not made under
    /// this opener's key (a handshake replaced it meanwhile), nothing taken.
    pub fn commit_frame<'b>(
        &mut self,
        job: &FrameJob,
        payload: &'b mut [u8],
    ) -> Result<Option<RelayFrame<&'b mut [u8]>>, OpenError> {
        if !self.made(job) {
            return Ok(None);
        }
        if payload.len() != job.len {
            return Err(OpenError::Truncated {
                have: payload.len(),
                need: job.len,
            });
        }
        if !self.replay.check(job.counter) {
            return Err(OpenError::Replay(job.counter));
        }
        self.replay.update(job.counter);
        let clear_end = job.len - TAG_LEN;
        RelayFrame::new_checked(&mut payload[COUNTER_LEN..clear_end])
            .map(Some)
            .map_err(OpenError::BadFrame)
    }

    /// [`Opener::open_in_place`] in three steps, so that the AEAD runs without the opener (an edge
    /// gateway's end-to-end layer, whose opener its relay node holds behind a lock): this one
    /// takes steps 0-7 of §4.2 on the payload at [`OPEN_HEADROOM`] of `buf` (`payload_len`
    /// bytes: the mode, the length, the counter's space and the replay window, checked, not yet
    /// updated) and returns what [`PacketJob::open`] needs; then [`Opener::commit_packet`].
    /// `None` for a keepalive (open it with `open_in_place`). Encrypt mode only.
    pub fn packet_job(
        &self,
        route: &Route,
        buf: &[u8],
        payload_len: usize,
    ) -> Result<Option<PacketJob>, OpenError> {
        let key = match (&self.key, self.mode) {
            (Some(key), Mode::Encrypt) => key,
            (_, mode) => return Err(OpenError::NotEncrypt { mode }),
        };
        let h = OPEN_HEADROOM;
        let end = h.saturating_add(payload_len);
        let Some(payload) = buf.get(h..end) else {
            return Err(OpenError::BufferTooSmall {
                have: buf.len(),
                need: end,
            });
        };
        if payload_len == KEEPALIVE_LEN {
            return Ok(None);
        }
        let view = TunnelPayload::new_checked(payload, self.mode)?;
        let Some(c) = view.counter() else {
            // Encrypt mode always carries one: cannot happen, never panics.
            return Err(OpenError::BadTag);
        };
        if !self.space.accepts(c) {
            return Err(OpenError::BadCounter(c));
        }
        if !self.replay.check(c) {
            return Err(OpenError::Replay(c));
        }
        Ok(Some(PacketJob {
            key: key.clone(),
            counter: c,
            aad: outer_aad(&route.remote, &route.local, c),
            len: payload_len,
            inner_len: view.inner_payload_len(),
            inner_src: self.remote_true,
            inner_dst: self.local_true,
        }))
    }

    /// The last step of [`Opener::packet_job`]'s open, after [`PacketJob::open`] verified the
    /// tag (returned the inner packet or `BadInner`): the counter into the replay window,
    /// refused if another packet took it in the meantime (a replay that raced the original
    /// through another worker). `Ok(false)`: `job` was not made under this opener's key (a
    /// handshake replaced it meanwhile), nothing taken.
    pub fn commit_packet(&mut self, job: &PacketJob) -> Result<bool, OpenError> {
        if !self.key.as_ref().is_some_and(|k| Arc::ptr_eq(k, &job.key)) {
            return Ok(false);
        }
        if !self.replay.check(job.counter) {
            return Err(OpenError::Replay(job.counter));
        }
        self.replay.update(job.counter);
        Ok(true)
    }

    /// Whether `job` was made under this opener's key.
    pub fn made(&self, job: &FrameJob) -> bool {
        self.key.as_ref().is_some_and(|k| Arc::ptr_eq(k, &job.key))
    }

    /// [`Opener::open_in_place`], returning where the inner packet is (a range, so that a caller
    /// can try another key on the same buffer after an error).
    pub(crate) fn open_in_place_at(
        &mut self,
        route: &Route,
        buf: &mut [u8],
        payload_len: usize,
    ) -> Result<Range<usize>, OpenError> {
        let d = Decap {
            mode: self.mode,
            key: self.key.as_deref(),
            space: self.space,
            outer_src: route.remote,
            outer_dst: route.local,
            inner_src: self.remote_true,
            inner_dst: self.local_true,
        };
        let h = OPEN_HEADROOM;
        let end = h.saturating_add(payload_len);
        if buf.len() < end {
            return Err(OpenError::BufferTooSmall {
                have: buf.len(),
                need: end,
            });
        }
        if d.mode != Mode::Plain && payload_len == KEEPALIVE_LEN {
            open_keepalive(&d, &buf[h..end], Some(&mut self.replay))?;
            return Ok(0..0);
        }
        let view = TunnelPayload::new_checked(&buf[h..end], d.mode)?;
        let m = view.inner_payload_len();
        let counter = view.counter();
        check_counter(&d, counter, Some(&self.replay))?;
        // Inner payload position: right after the carried header bytes.
        let body = h + view.counter().map_or(0, |_| COUNTER_LEN);
        let payload_at = body + INNER_HEADER_CARRIED;
        match (d.mode, counter, d.key) {
            (Mode::Encrypt, Some(c), Some(key)) => {
                let t = tag(&view);
                key.open(
                    c,
                    &outer_aad(&d.outer_src, &d.outer_dst, c),
                    &t,
                    &mut buf[body..end - TAG_LEN],
                )
                .map_err(|_| OpenError::BadTag)?;
            }
            (Mode::Auth, Some(c), Some(key)) => {
                let t = tag(&view);
                let aad_start = h - (OUTER_AAD_LEN - COUNTER_LEN);
                buf[aad_start..h].copy_from_slice(
                    &outer_aad(&d.outer_src, &d.outer_dst, c)[..OUTER_AAD_LEN - COUNTER_LEN],
                );
                key.open(c, &buf[aad_start..end - TAG_LEN], &t, &mut [])
                    .map_err(|_| OpenError::BadTag)?;
            }
            (Mode::Plain, _, _) => {}
            // As in `decapsulate`: cannot happen, never panics.
            _ => return Err(OpenError::BadTag),
        }
        if let Some(c) = counter {
            self.replay.update(c);
        }
        let start = payload_at - IPV6_HEADER_LEN;
        buf.copy_within(body..payload_at, start);
        restore(&d, &mut buf[start..payload_at + m], m)?;
        Ok(start..payload_at + m)
    }
}

/// One decapsulation's parameters (shared with ICMPv6 quote restoration, which opens our own packets).
pub(crate) struct Decap<'a> {
    pub mode: Mode,
    pub key: Option<&'a AeadKey>,
    pub space: CounterSpace,
    pub outer_src: SocketAddrV6,
    pub outer_dst: SocketAddrV6,
    pub inner_src: Ipv6Addr,
    pub inner_dst: Ipv6Addr,
}

pub(crate) fn decapsulate(
    d: &Decap<'_>,
    payload: &[u8],
    out: &mut [u8],
    scratch: &mut Vec<u8>,
    replay: Option<&mut ReplayWindow>,
) -> Result<usize, OpenError> {
    if d.mode != Mode::Plain && payload.len() == KEEPALIVE_LEN {
        return open_keepalive(d, payload, replay);
    }
    let view = TunnelPayload::new_checked(payload, d.mode)?;
    let m = view.inner_payload_len();
    let inner_len = IPV6_HEADER_LEN + m;
    let counter = view.counter();
    check_counter(d, counter, replay.as_deref())?;
    if out.len() < inner_len {
        return Err(OpenError::BufferTooSmall {
            have: out.len(),
            need: inner_len,
        });
    }
    let out = &mut out[..inner_len];
    match (d.mode, counter, d.key) {
        (Mode::Encrypt, Some(c), Some(key)) => {
            // Decrypt in place at offset 32 so the plaintext payload lands at 40, where it belongs;
            // then move the 8 header bytes to the front.
            let ct = &mut out[IPV6_HEADER_LEN - INNER_HEADER_CARRIED..];
            ct.copy_from_slice(view.body());
            key.open(
                c,
                &outer_aad(&d.outer_src, &d.outer_dst, c),
                &tag(&view),
                ct,
            )
            .map_err(|_| OpenError::BadTag)?;
            out.copy_within(IPV6_HEADER_LEN - INNER_HEADER_CARRIED..IPV6_HEADER_LEN, 0);
        }
        (Mode::Auth, Some(c), Some(key)) => {
            scratch.clear();
            scratch.reserve(OUTER_AAD_LEN + payload.len());
            scratch.extend_from_slice(
                &outer_aad(&d.outer_src, &d.outer_dst, c)[..OUTER_AAD_LEN - COUNTER_LEN],
            );
            scratch.extend_from_slice(view.authenticated());
            key.open(c, scratch, &tag(&view), &mut [])
                .map_err(|_| OpenError::BadTag)?;
            copy_clear(view.body(), out);
        }
        (Mode::Plain, _, _) => copy_clear(view.body(), out),
        // Stream::new always gives auth/encrypt openers a key and TunnelPayload gives them a counter;
        // treat the impossible combination as an unauthenticated packet rather than panic.
        _ => return Err(OpenError::BadTag),
    }
    if let (Some(w), Some(c)) = (replay, counter) {
        w.update(c);
    }
    restore(d, out, m)?;
    Ok(inner_len)
}

/// Steps 5 and 6 of §4.2: the counter belongs to the key's space and is not a replay (the window
/// is not changed).
fn check_counter(
    d: &Decap<'_>,
    counter: Option<u64>,
    replay: Option<&ReplayWindow>,
) -> Result<(), OpenError> {
    if let Some(c) = counter {
        if !d.space.accepts(c) {
            return Err(OpenError::BadCounter(c));
        }
        if let Some(w) = replay {
            if !w.check(c) {
                return Err(OpenError::Replay(c));
            }
        }
    }
    Ok(())
}

/// Step 9 of §4.2: puts the true addresses back into `out` (the inner packet, header bytes 0..8
/// and payload of `m` bytes already in place) and validates the restored header.
fn restore(d: &Decap<'_>, out: &mut [u8], m: usize) -> Result<(), OpenError> {
    out[IPV6_SRC_ADDR].copy_from_slice(&d.inner_src.octets());
    out[IPV6_DST_ADDR].copy_from_slice(&d.inner_dst.octets());
    if out[0] >> 4 != 6 || usize::from(u16::from_be_bytes([out[4], out[5]])) != m {
        return Err(OpenError::BadInner);
    }
    Ok(())
}

/// counter(8) || tag(16): the tag covers the outer fields and the counter, nothing else.
fn open_keepalive(
    d: &Decap<'_>,
    payload: &[u8],
    replay: Option<&mut ReplayWindow>,
) -> Result<usize, OpenError> {
    let (counter, tag_bytes) = payload.split_at(COUNTER_LEN);
    let mut c = [0u8; COUNTER_LEN];
    c.copy_from_slice(counter);
    let c = u64::from_be_bytes(c);
    if !d.space.accepts(c) {
        return Err(OpenError::BadCounter(c));
    }
    if let Some(w) = &replay {
        if !w.check(c) {
            return Err(OpenError::Replay(c));
        }
    }
    let Some(key) = d.key else {
        return Err(OpenError::BadTag);
    };
    let mut t = [0u8; TAG_LEN];
    t.copy_from_slice(tag_bytes);
    key.open(c, &outer_aad(&d.outer_src, &d.outer_dst, c), &t, &mut [])
        .map_err(|_| OpenError::BadTag)?;
    if let Some(w) = replay {
        w.update(c);
    }
    Ok(0)
}

fn tag<T: AsRef<[u8]>>(view: &TunnelPayload<T>) -> [u8; TAG_LEN] {
    let mut t = [0u8; TAG_LEN];
    t.copy_from_slice(view.tag());
    t
}

/// body = inner header bytes 0..8 || inner payload; out is 40 + payload bytes long.
fn copy_clear(body: &[u8], out: &mut [u8]) {
    out[..INNER_HEADER_CARRIED].copy_from_slice(&body[..INNER_HEADER_CARRIED]);
    out[IPV6_HEADER_LEN..].copy_from_slice(&body[INNER_HEADER_CARRIED..]);
}

#[allow(dead_code)]
const _: () = assert!(fixed_len(Mode::Plain) == INNER_HEADER_CARRIED);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{addr, echo, pair, tcp, transport_checksum_ok, udp, A, B};
    use crate::{AeadAlg, Epoch, UnixTime};

    const MODES: [(Mode, AeadAlg); 5] = [
        (Mode::Plain, AeadAlg::Aes256Gcm),
        (Mode::Auth, AeadAlg::Aes256Gcm),
        (Mode::Auth, AeadAlg::ChaCha20Poly1305),
        (Mode::Encrypt, AeadAlg::Aes256Gcm),
        (Mode::Encrypt, AeadAlg::ChaCha20Poly1305),
    ];

    #[test]
    fn keepalives_open_to_nothing_once_and_only_on_their_route() {
        for (mode, alg) in MODES.into_iter().filter(|(m, _)| *m != Mode::Plain) {
            let (a, b) = pair(mode, alg);
            let sealer = a.sealer(UnixTime::from_secs(1_700_000_000).as_nanos(), u64::MAX);
            let mut opener = b.opener();
            let (ra, rb) = (a.route(Epoch(7)), b.route(Epoch(7)));
            let mut wire = [0u8; 64];
            let n = sealer.seal_keepalive(&ra, &mut wire).unwrap();
            assert_eq!(n, KEEPALIVE_LEN);
            assert_eq!(
                opener.open(&b.route(Epoch(8)), &wire[..n], &mut [0u8; 64]),
                Err(OpenError::BadTag)
            );
            assert_eq!(opener.open(&rb, &wire[..n], &mut [0u8; 64]), Ok(0));
            assert!(matches!(
                opener.open(&rb, &wire[..n], &mut [0u8; 64]),
                Err(OpenError::Replay(_))
            ));
            let mut bad = wire;
            bad[n - 1] ^= 1;
            bad[7] ^= 2;
            assert_eq!(
                opener.open(&rb, &bad[..n], &mut [0u8; 64]),
                Err(OpenError::BadTag)
            );
        }
        let (a, _) = pair(Mode::Plain, AeadAlg::Aes256Gcm);
        assert_eq!(
            a.sealer(UnixTime::from_secs(1).as_nanos(), u64::MAX)
                .seal_keepalive(&a.route(Epoch(1)), &mut [0u8; 64]),
            Err(crate::SealError::NoKeepaliveInPlain)
        );
    }

    #[test]
    fn roundtrip_restores_real_packets_byte_for_byte() {
        for (mode, alg) in MODES {
            let (a, b) = pair(mode, alg);
            let sealer = a.sealer(UnixTime::from_secs(1_700_000_000).as_nanos(), u64::MAX);
            let mut opener = b.opener();
            let route_a = a.route(Epoch(42));
            let route_b = b.route(Epoch(42));
            for pkt in [
                tcp(addr(A), addr(B), b"GET / HTTP/1.1\r\n\r\n"),
                udp(addr(A), addr(B), &[0x55; 1200]),
                echo(addr(A), addr(B), b"ping"),
                udp(addr(A), addr(B), b""),
            ] {
                assert!(transport_checksum_ok(&pkt));
                let mut wire = [0u8; 2048];
                let n = sealer.seal(&route_a, &pkt, &mut wire).unwrap();
                assert_eq!(n + 48, pkt.len() + a.overhead(), "{mode}");
                if mode == Mode::Encrypt {
                    assert!(
                        wire[..n].windows(4).all(|w| w != b"ping"),
                        "plaintext leaked"
                    );
                }
                let mut inner = [0u8; 2048];
                let m = opener.open(&route_b, &wire[..n], &mut inner).unwrap();
                assert_eq!(&inner[..m], &pkt[..], "{mode} {alg}");
                assert!(transport_checksum_ok(&inner[..m]));
            }
        }
    }

    #[test]
    fn tampering_replay_and_bad_counters_are_rejected() {
        for (mode, alg) in MODES.into_iter().filter(|(m, _)| *m != Mode::Plain) {
            let (a, b) = pair(mode, alg);
            let sealer = a.sealer(UnixTime::from_secs(1_700_000_000).as_nanos(), u64::MAX);
            let mut opener = b.opener();
            let (ra, rb) = (a.route(Epoch(1)), b.route(Epoch(1)));
            let pkt = udp(addr(A), addr(B), b"sensitive");
            let mut wire = [0u8; 256];
            let n = sealer.seal(&ra, &pkt, &mut wire).unwrap();
            let mut out = [0u8; 256];
            for i in 0..n {
                let mut t = wire;
                t[i] ^= 0x01;
                let e = opener.open(&rb, &t[..n], &mut out).unwrap_err();
                assert!(
                    matches!(e, OpenError::BadTag | OpenError::Replay(_)),
                    "{mode} byte {i}: {e:?}"
                );
            }
            // Wrong route (AAD) fails too.
            assert_eq!(
                opener.open(&b.route(Epoch(2)), &wire[..n], &mut out),
                Err(OpenError::BadTag)
            );
            // The genuine packet is still accepted once, since failures did not touch the window.
            assert!(opener.open(&rb, &wire[..n], &mut out).is_ok());
            let c = u64::from_be_bytes(wire[..8].try_into().unwrap());
            assert_eq!(
                opener.open(&rb, &wire[..n], &mut out),
                Err(OpenError::Replay(c))
            );
            let mut hi = wire;
            hi[0] |= 0x80;
            assert!(matches!(
                opener.open(&rb, &hi[..n], &mut out),
                Err(OpenError::BadCounter(_))
            ));
            for k in (0..32).filter(|&k| k != KEEPALIVE_LEN) {
                assert!(matches!(
                    opener.open(&rb, &wire[..k], &mut out),
                    Err(OpenError::Truncated { .. })
                ));
            }
            // A 24-byte prefix parses as a keepalive, whose tag then fails.
            assert!(matches!(
                opener.open(&rb, &wire[..KEEPALIVE_LEN], &mut out),
                Err(OpenError::BadTag | OpenError::Replay(_))
            ));
            let n2 = sealer.seal(&ra, &pkt, &mut wire).unwrap();
            assert!(matches!(
                opener.open(&rb, &wire[..n2], &mut out[..pkt.len() - 1]),
                Err(OpenError::BufferTooSmall { .. })
            ));
            // A sealer key in the wrong direction does not open.
            let mut self_opener = a.opener();
            assert_eq!(
                self_opener.open(&ra, &wire[..n2], &mut out),
                Err(OpenError::BadTag)
            );
        }
    }

    /// The payload at [`OPEN_HEADROOM`] of a buffer, as a receiver lays it out.
    fn received(payload: &[u8]) -> Vec<u8> {
        let mut b = vec![0xeeu8; OPEN_HEADROOM + payload.len()];
        b[OPEN_HEADROOM..].copy_from_slice(payload);
        b
    }

    /// `open_in_place` is `open` without the copy: the same inner packet for every mode and
    /// AEAD, the same keepalive, and the same refusals (tampered bytes, tampered outer fields of
    /// the AAD through the wrong route, replays, truncation).
    #[test]
    fn open_in_place_restores_what_open_restores() {
        for (mode, alg) in MODES {
            let (a, b) = pair(mode, alg);
            let sealer = a.sealer(1 << 26, u64::MAX);
            let (mut copying, mut in_place) = (b.opener(), b.opener());
            let (ra, rb) = (a.route(Epoch(5)), b.route(Epoch(5)));
            for len in [0, 1, 7, 8, 15, 16, 17, 1360, 8960] {
                let body: Vec<u8> = (0..len).map(|i| (i * 5 + len) as u8).collect();
                let pkt = udp(addr(A), addr(B), &body);
                let mut wire = vec![0u8; pkt.len() + 64];
                let n = sealer.seal(&ra, &pkt, &mut wire).unwrap();
                let mut out = vec![0u8; pkt.len()];
                let m = copying.open(&rb, &wire[..n], &mut out).unwrap();
                let mut buf = received(&wire[..n]);
                let inner = in_place.open_in_place(&rb, &mut buf, n).unwrap();
                assert_eq!(inner, &out[..m], "{mode} {alg} {len}");
                assert_eq!(inner, &pkt[..]);
                if mode != Mode::Plain {
                    let c = u64::from_be_bytes(wire[..8].try_into().unwrap());
                    assert_eq!(
                        in_place.open_in_place(&rb, &mut received(&wire[..n]), n),
                        Err(OpenError::Replay(c))
                    );
                }
            }
            if mode == Mode::Plain {
                continue;
            }
            let pkt = udp(addr(A), addr(B), b"sensitive");
            let mut wire = [0u8; 256];
            let n = sealer.seal(&ra, &pkt, &mut wire).unwrap();
            for i in 0..n {
                let mut t = received(&wire[..n]);
                t[OPEN_HEADROOM + i] ^= 0x01;
                let e = in_place.open_in_place(&rb, &mut t, n).unwrap_err();
                assert!(
                    matches!(e, OpenError::BadTag | OpenError::Replay(_)),
                    "{mode} byte {i}: {e:?}"
                );
            }
            assert_eq!(
                in_place.open_in_place(&b.route(Epoch(6)), &mut received(&wire[..n]), n),
                Err(OpenError::BadTag)
            );
            // What the headroom held before is overwritten, never authenticated.
            let mut buf = received(&wire[..n]);
            buf[..OPEN_HEADROOM].fill(0x11);
            assert_eq!(
                in_place.open_in_place(&rb, &mut buf, n).map(|p| p.to_vec()),
                Ok(pkt.clone())
            );
            for k in (0..32).filter(|&k| k != KEEPALIVE_LEN) {
                assert!(matches!(
                    in_place.open_in_place(&rb, &mut received(&wire[..k]), k),
                    Err(OpenError::Truncated { .. })
                ));
            }
            assert!(matches!(
                in_place.open_in_place(&rb, &mut received(&wire[..n]), n + 1),
                Err(OpenError::BufferTooSmall { .. })
            ));
            let mut ka = [0u8; KEEPALIVE_LEN];
            sealer.seal_keepalive(&ra, &mut ka).unwrap();
            assert_eq!(
                in_place.open_in_place(&rb, &mut received(&ka), KEEPALIVE_LEN),
                Ok(&mut [][..])
            );
            assert!(matches!(
                in_place.open_in_place(&rb, &mut received(&ka), KEEPALIVE_LEN),
                Err(OpenError::Replay(_))
            ));
        }
    }

    /// A relay frame to `0x1122334455667788` carrying `len` bytes of `fill`.
    fn data_repr(len: u16) -> crate::relay::RelayRepr {
        crate::relay::RelayRepr {
            kind: crate::relay::Kind::Data,
            hops: crate::relay::HOP_LIMIT,
            payload_len: len,
            destination: crate::relay::NodeId::from_bytes([
                0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88,
            ]),
        }
    }

    /// §10.2: a frame sealed on a relay link opens on that link's route only, once, to the
    /// frame written (padding included), for both AEADs and for handshake keys; a relay lowers
    /// the hop limit and seals it again in the same buffer for its next link.
    #[test]
    fn relay_frames_seal_open_and_forward_in_place() {
        use crate::relay::{frame::DEFAULT_FRAME_MAX, frame_len, Kind, RelayRepr};
        use crate::tunnel::{frame_payload_len, FRAME_HEADROOM};
        for alg in [AeadAlg::Aes256Gcm, AeadAlg::ChaCha20Poly1305] {
            let (a, b) = pair(Mode::Encrypt, alg);
            let static_keys = (a.sealer(1 << 26, u64::MAX), b.opener());
            let k = [0x42u8; 32];
            let session = (
                crate::Sealer::for_session(Mode::Encrypt, alg, &k, KeyPhase::One, addr(A), addr(B)),
                Opener::for_session(Mode::Encrypt, alg, &k, KeyPhase::One, addr(B), addr(A)),
            );
            for (sealer, mut opener) in [static_keys, session] {
                let (ra, rb) = (a.route(Epoch(3)), b.route(Epoch(3)));
                for len in [32usize, 33, 116, 117, 500, 1416] {
                    let payload: Vec<u8> = (0..len).map(|i| (i * 3 + 1) as u8).collect();
                    let repr = data_repr(len as u16);
                    let mut wire = vec![0xeeu8; 1500];
                    let n = sealer
                        .seal_frame(&ra, &repr, &payload, DEFAULT_FRAME_MAX, &mut wire)
                        .unwrap();
                    let flen = frame_len(len, DEFAULT_FRAME_MAX);
                    assert_eq!(n, frame_payload_len(flen), "{alg} {len}");
                    assert_eq!(wire[n], 0xee, "nothing written past the payload");
                    let mut frame = vec![0u8; flen];
                    repr.write_frame(&payload, DEFAULT_FRAME_MAX, &mut frame)
                        .unwrap();
                    assert!(
                        wire[8..n - 16] != frame[..],
                        "the frame is encrypted, header and padding included"
                    );
                    assert_eq!(
                        opener.open_frame(&b.route(Epoch(4)), &mut wire[..n].to_vec()),
                        Err(OpenError::BadTag),
                        "another route's AAD"
                    );
                    let mut rx = wire[..n].to_vec();
                    let mut f = opener.open_frame(&rb, &mut rx).unwrap().unwrap();
                    assert_eq!(f.as_bytes(), &frame[..]);
                    assert_eq!(RelayRepr::parse(&f), repr);
                    assert_eq!(f.payload(), &payload[..]);
                    f.set_hops(f.hops() - 1);
                    assert_eq!(f.payload_mut().len(), len);
                    let c = u64::from_be_bytes(wire[..8].try_into().unwrap());
                    assert_eq!(
                        opener.open_frame(&rb, &mut wire[..n].to_vec()),
                        Err(OpenError::Replay(c))
                    );
                    // The next link (here: back from b to a) without a copy.
                    let next = b.sealer(1 << 26, u64::MAX);
                    let out = next.seal_frame_in_place(&rb, &mut rx, flen).unwrap();
                    assert_eq!(out.len(), n);
                    assert_eq!(rx.len(), n);
                    let mut back = a.opener();
                    let f = back.open_frame(&ra, &mut rx).unwrap().unwrap();
                    assert_eq!(f.hops(), crate::relay::HOP_LIMIT - 1);
                    assert_eq!(f.kind(), Kind::Data);
                    assert_eq!(f.payload(), &payload[..]);
                }
                // Link-local frames and keepalives on the same link.
                let probe = crate::relay::probe::ProbeRepr::request(7).to_bytes();
                let mut wire = [0u8; 256];
                let n = sealer
                    .seal_frame(
                        &ra,
                        &RelayRepr::link_local(Kind::Probe, 8),
                        &probe,
                        DEFAULT_FRAME_MAX,
                        &mut wire,
                    )
                    .unwrap();
                assert_eq!(n, 128 + 24);
                let f = opener.open_frame(&rb, &mut wire[..n]).unwrap().unwrap();
                assert_eq!((f.kind(), f.payload()), (Kind::Probe, &probe[..]));
                let n = sealer.seal_keepalive(&ra, &mut wire).unwrap();
                assert_eq!(opener.open_frame(&rb, &mut wire[..n]), Ok(None));
                assert!(matches!(
                    opener.open_frame(&rb, &mut wire[..n]),
                    Err(OpenError::Replay(_))
                ));
            }
            // Headroom and tail room are the caller's: too little is refused, buf untouched.
            let sealer = a.sealer(1, u64::MAX);
            let mut buf = vec![0u8; FRAME_HEADROOM + 128 + 15];
            data_repr(32)
                .write_frame(&[5; 32], DEFAULT_FRAME_MAX, &mut buf[FRAME_HEADROOM..])
                .unwrap();
            let before = buf.clone();
            assert_eq!(
                sealer.seal_frame_in_place(&a.route(Epoch(1)), &mut buf, 128),
                Err(crate::SealError::BufferTooSmall {
                    have: 151,
                    need: 152
                })
            );
            assert_eq!(buf, before);
            assert_eq!(
                sealer.seal_frame(
                    &a.route(Epoch(1)),
                    &data_repr(32),
                    &[5; 32],
                    DEFAULT_FRAME_MAX,
                    &mut [0u8; 151]
                ),
                Err(crate::SealError::BufferTooSmall {
                    have: 151,
                    need: 152
                })
            );
            assert_eq!(
                sealer.seal_frame(
                    &a.route(Epoch(1)),
                    &data_repr(33),
                    &[5; 32],
                    DEFAULT_FRAME_MAX,
                    &mut [0u8; 256]
                ),
                Err(crate::SealError::BadFrame(
                    crate::wire::relay::RelayError::LengthMismatch {
                        field: 33,
                        payload: 32
                    }
                ))
            );
            assert_eq!(sealer.sealed(), 0, "no counter burnt by a refusal");
        }
    }

    /// §10.1: relay links are encrypt-mode links; the other modes refuse frames both ways.
    #[test]
    fn frames_need_encrypt_mode() {
        use crate::relay::frame::DEFAULT_FRAME_MAX;
        for mode in [Mode::Plain, Mode::Auth] {
            let (a, b) = pair(mode, AeadAlg::Aes256Gcm);
            let e = a
                .sealer(1, u64::MAX)
                .seal_frame(
                    &a.route(Epoch(1)),
                    &data_repr(32),
                    &[1; 32],
                    DEFAULT_FRAME_MAX,
                    &mut [0u8; 256],
                )
                .unwrap_err();
            assert_eq!(e, crate::SealError::NotEncrypt { mode });
            assert_eq!(e.reason(), "seal_not_encrypt");
            let e = b
                .opener()
                .open_frame(&b.route(Epoch(1)), &mut [0u8; 152])
                .unwrap_err();
            assert_eq!(e, OpenError::NotEncrypt { mode });
            assert_eq!(e.reason(), "open_not_encrypt");
        }
    }

    /// §10.2: one end configured as a relay link and the other as a direct stream drop
    /// everything either way, with the spec's labels: an inner packet is never a frame
    /// (`relay_bad_kind`, its first byte is 0x6?) and a frame never an inner packet
    /// (`open_bad_inner`, its first byte is below 0x10). Header protection is applied as on the
    /// wire; keepalives mean the same on both.
    #[test]
    fn a_link_relay_at_one_end_and_direct_at_the_other_fails_closed() {
        use crate::relay::frame::DEFAULT_FRAME_MAX;
        use crate::tunnel::FRAME_HEADROOM;
        use crate::wire::relay::RelayError;
        for alg in [AeadAlg::Aes256Gcm, AeadAlg::ChaCha20Poly1305] {
            let (a, b) = pair(Mode::Encrypt, alg);
            let (ra, rb) = (a.route(Epoch(8)), b.route(Epoch(8)));
            let (hs, hr) = (a.send_header_key().unwrap(), b.recv_header_key().unwrap());
            let sealer = a.sealer(1 << 26, u64::MAX);
            for body in [&b""[..], b"x", &[0x55; 1200]] {
                // Direct sender, relay receiver.
                let pkt = udp(addr(A), addr(B), body);
                let mut wire = vec![0u8; pkt.len() + 64];
                let n = sealer.seal(&ra, &pkt, &mut wire).unwrap();
                hs.protect(&mut wire[..n]).unwrap();
                hr.unprotect(&mut wire[..n]).unwrap();
                let e = b.opener().open_frame(&rb, &mut wire[..n]).unwrap_err();
                assert_eq!(e, OpenError::BadFrame(RelayError::BadKind(pkt[0])), "{alg}");
                assert_eq!(pkt[0] >> 4, 6);
                assert_eq!(e.reason(), "relay_bad_kind");
                // Relay sender, direct receiver: copying and in place.
                let len = body.len().max(32);
                let payload = vec![0x60u8; len];
                let mut wire = vec![0u8; 1500];
                let n = sealer
                    .seal_frame(
                        &ra,
                        &data_repr(len as u16),
                        &payload,
                        DEFAULT_FRAME_MAX,
                        &mut wire,
                    )
                    .unwrap();
                hs.protect(&mut wire[..n]).unwrap();
                hr.unprotect(&mut wire[..n]).unwrap();
                let e = b
                    .opener()
                    .open(&rb, &wire[..n], &mut [0u8; 2048])
                    .unwrap_err();
                assert_eq!(e, OpenError::BadInner);
                assert_eq!(e.reason(), "open_bad_inner");
                let e = b
                    .opener()
                    .open_in_place(&rb, &mut received(&wire[..n]), n)
                    .unwrap_err();
                assert_eq!(e, OpenError::BadInner);
                // Neither sealer takes the other's plaintext either.
                assert!(matches!(
                    sealer.seal(&ra, &wire[8..n - 16], &mut [0u8; 2048]),
                    Err(crate::SealError::Malformed(_))
                ));
                let mut buf = vec![0u8; FRAME_HEADROOM + pkt.len() + 16];
                buf[FRAME_HEADROOM..FRAME_HEADROOM + pkt.len()].copy_from_slice(&pkt);
                assert_eq!(
                    sealer.seal_frame_in_place(&ra, &mut buf, pkt.len()),
                    Err(crate::SealError::BadFrame(RelayError::BadKind(pkt[0])))
                );
            }
            // An inner packet with under 4 bytes of payload is shorter than any frame's link
            // payload: refused before the AEAD.
            for m in 0..4u8 {
                let mut pkt = vec![0x60, 0, 0, 0, 0, m, 59, 64];
                pkt.extend(addr(A).octets());
                pkt.extend(addr(B).octets());
                pkt.extend(vec![0xab; usize::from(m)]);
                let n = sealer.seal(&ra, &pkt, &mut wire_buf()).unwrap();
                let e = b.opener().open_frame(&rb, &mut vec![0u8; n]).unwrap_err();
                assert_eq!(e.reason(), "open_truncated");
            }
        }
    }

    fn wire_buf() -> [u8; 128] {
        [0u8; 128]
    }

    /// Every relay link payload length below 36 bytes but the keepalive's is refused before the
    /// AEAD; any byte changed fails the tag.
    #[test]
    fn short_or_tampered_frame_payloads_are_refused() {
        use crate::relay::frame::DEFAULT_FRAME_MAX;
        let (a, b) = pair(Mode::Encrypt, AeadAlg::Aes256Gcm);
        let (ra, rb) = (a.route(Epoch(2)), b.route(Epoch(2)));
        let sealer = a.sealer(1 << 26, u64::MAX);
        let mut opener = b.opener();
        let mut wire = [0u8; 256];
        let n = sealer
            .seal_frame(&ra, &data_repr(40), &[9; 40], DEFAULT_FRAME_MAX, &mut wire)
            .unwrap();
        for k in (0..crate::tunnel::MIN_FRAME_PAYLOAD).filter(|&k| k != KEEPALIVE_LEN) {
            assert!(matches!(
                opener.open_frame(&rb, &mut wire[..k].to_vec()),
                Err(OpenError::Truncated { need: 36, .. })
            ));
        }
        assert_eq!(
            opener.open_frame(&rb, &mut wire[..KEEPALIVE_LEN].to_vec()),
            Err(OpenError::BadTag)
        );
        for i in 0..n {
            let mut t = wire[..n].to_vec();
            t[i] ^= 0x10;
            let e = opener.open_frame(&rb, &mut t).unwrap_err();
            assert!(
                matches!(e, OpenError::BadTag | OpenError::Replay(_)),
                "byte {i}: {e:?}"
            );
        }
        let mut hi = wire[..n].to_vec();
        hi[0] |= 0x80;
        assert!(matches!(
            opener.open_frame(&rb, &mut hi),
            Err(OpenError::BadCounter(_))
        ));
        assert!(opener.open_frame(&rb, &mut wire[..n]).unwrap().is_some());
    }

    #[test]
    fn plain_mode_validates_the_restored_header() {
        let (_, b) = pair(Mode::Plain, AeadAlg::Aes256Gcm);
        let mut opener = b.opener();
        let r = b.route(Epoch(1));
        let mut out = [0u8; 256];
        // Payload length field 5, but 4 bytes carried.
        let bad_len = [0x60, 0, 0, 0, 0, 5, 17, 64, 1, 2, 3, 4];
        assert_eq!(
            opener.open(&r, &bad_len, &mut out),
            Err(OpenError::BadInner)
        );
        let bad_version = [0x40, 0, 0, 0, 0, 4, 17, 64, 1, 2, 3, 4];
        assert_eq!(
            opener.open(&r, &bad_version, &mut out),
            Err(OpenError::BadInner)
        );
        let good = [0x60, 0, 0, 0, 0, 4, 17, 64, 1, 2, 3, 4];
        assert_eq!(opener.open(&r, &good, &mut out), Ok(44));
        assert_eq!(&out[8..24], &addr(A).octets());
        assert_eq!(&out[24..40], &addr(B).octets());
        for k in 0..8 {
            assert!(matches!(
                opener.open(&r, &good[..k], &mut out),
                Err(OpenError::Truncated { .. })
            ));
        }
    }
}
