//! The receive side's two key slots (one per key phase), owned by the receiving thread: which key
//! opens a packet, when a responder's new keys are confirmed, and when an old key is erased
//! (docs/PROTOCOL.md §9.5).

use super::OLD_KEY_GRACE;
use crate::tunnel::FrameKey;
use crate::tunnel::{KeyPhase, COUNTER_LEN, OPEN_HEADROOM, TAG_LEN};
use crate::{FrameJob, OpenError, Opener, PacketJob, Route, UnixTime};

impl Slot {
    /// Whether a failed open has other keys to try (a spare, or the retiring key in its grace).
    fn has_others(&self, now: UnixTime) -> bool {
        !self.spares.is_empty()
            || self
                .retiring
                .as_ref()
                .is_some_and(|(_, until)| now < *until)
    }
}

#[derive(Debug)]
struct Slot {
    opener: Opener,
    confirmed: bool,
    /// Erase the key at this time (set when a newer key is confirmed).
    retire_at: Option<UnixTime>,
    /// Responder: keys of earlier answered initiations of the same unconfirmed handshake, newest
    /// last. On a round trip longer than the initiator's retry interval the responder answers
    /// several attempts and the initiator completes with whichever answer reaches it first, so
    /// any of them may be the one the peer uses (docs/PROTOCOL.md §9.5).
    spares: Vec<Opener>,
    /// The confirmed key this slot held when an unconfirmed one replaced it, until its grace
    /// period ends: in a rekey race the peer may still be sending under it (§9.5).
    retiring: Option<(Opener, UnixTime)>,
}

/// Unconfirmed keys kept per slot besides the newest (bounded by the initiator's
/// [`super::MAX_PENDING`]).
const MAX_SPARES: usize = super::MAX_PENDING - 1;

/// A received packet that opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// Inner packet length (0: a keepalive, nothing to deliver).
    pub len: usize,
    /// Set the first time a packet opens under a newly installed, unconfirmed key: the peer has
    /// these keys, so a responder may now send with the matching send key.
    pub confirmed: Option<KeyPhase>,
    /// With `confirmed`: the [`Opener::key_id`] of the key that opened it, naming which of the
    /// answered initiations the peer completed (pick the send key of that response).
    pub confirmed_key: Option<u64>,
}

/// The relay frame's length in a link payload of `payload_len` bytes (0: a keepalive).
fn frame_len(frame: bool, payload_len: usize) -> usize {
    if frame {
        payload_len.saturating_sub(COUNTER_LEN + TAG_LEN)
    } else {
        0
    }
}

fn grace_end(now: UnixTime) -> UnixTime {
    UnixTime::from_nanos(now.as_nanos() + OLD_KEY_GRACE.as_nanos() as u64)
}

/// Up to two receive keys of one peer, selected by the packet's key phase. A static-key stream
/// has one key, used for every packet.
#[derive(Debug, Default)]
pub struct ReceiveKeys {
    slots: [Option<Slot>; 2],
    single: bool,
    /// Moves on at every change of which key opens what (installed, confirmed, a spare won,
    /// retired, erased): a copy made by [`ReceiveKeys::frame_keys`] is current while it holds.
    version: u64,
}

/// The keys [`ReceiveKeys::frame_job`] would use, copied out for a driver that opens relay link
/// payloads before it takes the lock guarding the receive keys: per key phase, the slot's key if
/// it is the only one to try (no spare, no retiring key), else none (the payload takes the
/// locked path, which tries them all).
#[derive(Debug, Clone)]
pub struct FrameKeys {
    slots: [Result<FrameKey, SlotState>; 2],
    single: bool,
}

/// Why [`FrameKeys`] has no key for a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SlotState {
    /// No key: `open` would refuse the payload as [`OpenError::NoKey`].
    #[default]
    Empty,
    /// Other keys to try (a spare, a retiring key), or a key that opens no relay frame.
    Others,
}

impl FrameKeys {
    /// The slot a payload (header protection removed) names and its key, if that key alone
    /// decides whether the payload opens.
    pub fn for_payload(&self, payload: &[u8]) -> Result<(usize, &FrameKey), SlotState> {
        let i = if self.single {
            0
        } else {
            KeyPhase::of_payload(payload).map_or(0, KeyPhase::index)
        };
        self.slots[i].as_ref().map(|k| (i, k)).map_err(|s| *s)
    }
}

impl ReceiveKeys {
    /// No keys yet (handshake mode).
    pub fn new() -> ReceiveKeys {
        ReceiveKeys::default()
    }

    /// One static key for every packet (pre-shared key mode, plain included).
    pub fn single(opener: Opener) -> ReceiveKeys {
        ReceiveKeys {
            slots: [
                Some(Slot {
                    opener,
                    confirmed: true,
                    retire_at: None,
                    spares: Vec::new(),
                    retiring: None,
                }),
                None,
            ],
            single: true,
            version: 0,
        }
    }

    /// Moves on at every change of the keys ([`ReceiveKeys::frame_keys`] copies them).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The keys that alone decide whether a relay link payload opens, by slot: what
    /// [`ReceiveKeys::frame_job`] would use where it does not answer `Ok(None)`. A slot with
    /// other keys to try (spares, a retiring key, whatever the time) has none. Current until
    /// [`ReceiveKeys::version`] moves on.
    pub fn frame_keys(&self) -> FrameKeys {
        let key = |s: &Option<Slot>| match s {
            None => Err(SlotState::Empty),
            Some(s) if s.spares.is_empty() && s.retiring.is_none() => {
                s.opener.frame_key().ok_or(SlotState::Others)
            }
            Some(_) => Err(SlotState::Others),
        };
        FrameKeys {
            slots: [key(&self.slots[0]), key(&self.slots[1])],
            single: self.single,
        }
    }

    /// Installs a handshake key in its phase's slot, erasing what was there. `confirmed`: the
    /// handshake is already complete on this side (we initiated), so the other slot's key is now
    /// the old one and is erased after [`OLD_KEY_GRACE`].
    /// An unconfirmed key replacing an unconfirmed key of the same slot keeps the older one as a
    /// spare until one of them is confirmed.
    pub fn install(&mut self, opener: Opener, confirmed: bool, now: UnixTime) {
        self.version += 1;
        let i = opener.phase().map_or(0, KeyPhase::index);
        let mut spares = Vec::new();
        let mut retiring = None;
        if let Some(old) = self.slots[i].take() {
            if !confirmed && !old.confirmed {
                spares = old.spares;
                spares.push(old.opener);
                if spares.len() > MAX_SPARES {
                    spares.remove(0);
                }
                retiring = old.retiring;
            } else if !confirmed {
                let until = old.retire_at.unwrap_or_else(|| grace_end(now));
                retiring = Some((old.opener, until));
            }
        }
        self.slots[i] = Some(Slot {
            opener,
            confirmed,
            retire_at: None,
            spares,
            retiring,
        });
        if confirmed {
            self.retire_other(i, now);
        }
    }

    fn retire_other(&mut self, newest: usize, now: UnixTime) {
        if let Some(old) = &mut self.slots[1 - newest] {
            old.retire_at.get_or_insert(grace_end(now));
        }
    }

    /// How many packets the peer has sealed under its newest confirmed key as far as the
    /// packets opened show (0 with none): what an initiator holds against the packet budget
    /// besides its own count, so that a responder that never initiates (a server) is rekeyed by
    /// its client when it has sent `rekey_after_packets` (docs/PROTOCOL.md §4.3).
    pub fn newest_packets_seen(&self) -> u64 {
        self.slots
            .iter()
            .flatten()
            .filter(|s| s.confirmed && s.retire_at.is_none())
            .map(|s| s.opener.packets_seen())
            .max()
            .unwrap_or(0)
    }

    /// Opens `payload` (arrived on `route`) with the key of its phase.
    pub fn open(
        &mut self,
        now: UnixTime,
        route: &Route,
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<Opened, OpenError> {
        let i = self.slot_of(payload);
        let Some(slot) = &mut self.slots[i] else {
            return Err(OpenError::NoKey);
        };
        let len = match slot.opener.open(route, payload, out) {
            Ok(len) => len,
            Err(e) => {
                // Only while unconfirmed: the old key of a rekey race, then the keys of earlier
                // answers, newest first.
                if let Some((old, until)) = &mut slot.retiring {
                    if now < *until {
                        if let Ok(len) = old.open(route, payload, out) {
                            return Ok(Opened {
                                len,
                                confirmed: None,
                                confirmed_key: None,
                            });
                        }
                    }
                }
                let Some((k, len)) = slot
                    .spares
                    .iter_mut()
                    .enumerate()
                    .rev()
                    .find_map(|(k, o)| o.open(route, payload, out).ok().map(|n| (k, n)))
                else {
                    return Err(e);
                };
                let won = slot.spares.swap_remove(k);
                slot.opener = won;
                len
            }
        };
        Ok(self.confirm(i, now, len))
    }

    /// A packet of `len` bytes opened under slot `i`'s current key: the first one confirms it.
    fn confirm(&mut self, i: usize, now: UnixTime, len: usize) -> Opened {
        let mut confirmed = None;
        let mut confirmed_key = None;
        if let Some(slot) = &mut self.slots[i] {
            if !slot.confirmed {
                self.version += 1;
                slot.confirmed = true;
                slot.spares.clear();
                slot.retiring = None;
                confirmed = slot.opener.phase();
                confirmed_key = slot.opener.key_id();
                self.retire_other(i, now);
            }
        }
        Opened {
            len,
            confirmed,
            confirmed_key,
        }
    }

    /// [`ReceiveKeys::open`] without the copies ([`Opener::open_in_place`]): the payload is at
    /// [`OPEN_HEADROOM`] of `buf`, `payload_len` bytes; returns what `open` returns and the
    /// restored inner packet, a slice of `buf` (empty for a keepalive). The same keys are tried
    /// in the same order. A failed try may leave the payload overwritten (encrypt mode decrypts
    /// in place), so while a slot has other keys to try (a rekey race, §9.5: rare and brief)
    /// the payload is copied first and put back before each further try.
    pub fn open_in_place<'b>(
        &mut self,
        now: UnixTime,
        route: &Route,
        buf: &'b mut [u8],
        payload_len: usize,
    ) -> Result<(Opened, &'b mut [u8]), OpenError> {
        let payload = OPEN_HEADROOM..OPEN_HEADROOM.saturating_add(payload_len);
        let i = self.slot_of(buf.get(payload.clone()).unwrap_or_default());
        let Some(slot) = &mut self.slots[i] else {
            return Err(OpenError::NoKey);
        };
        let saved = if slot.has_others(now) {
            buf.get(payload.clone()).map(<[u8]>::to_vec)
        } else {
            None
        };
        let inner = match slot.opener.open_in_place_at(route, buf, payload_len) {
            Ok(r) => r,
            Err(e) => {
                let Some(saved) = saved else {
                    return Err(e);
                };
                let retry = |o: &mut Opener, buf: &mut [u8]| {
                    buf[payload.clone()].copy_from_slice(&saved);
                    o.open_in_place_at(route, buf, payload_len)
                };
                if let Some((old, until)) = &mut slot.retiring {
                    if now < *until {
                        if let Ok(r) = retry(old, buf) {
                            let opened = Opened {
                                len: r.len(),
                                confirmed: None,
                                confirmed_key: None,
                            };
                            return Ok((opened, &mut buf[r]));
                        }
                    }
                }
                let Some((k, r)) = slot
                    .spares
                    .iter_mut()
                    .enumerate()
                    .rev()
                    .find_map(|(k, o)| retry(o, buf).ok().map(|r| (k, r)))
                else {
                    return Err(e);
                };
                let won = slot.spares.swap_remove(k);
                slot.opener = won;
                r
            }
        };
        let opened = self.confirm(i, now, inner.len());
        Ok((opened, &mut buf[inner]))
    }

    /// [`Opener::open_frame`] with the key of the payload's phase (a relay link keyed by
    /// handshakes, docs/PROTOCOL.md §10.1): the same keys in the same order as
    /// [`ReceiveKeys::open`], the payload copied first while a slot has other keys to try (a
    /// failed try decrypts in place). Returns what was opened (its `len`: the frame's, 0 for a
    /// keepalive) and whether it is a frame; the caller reads the frame, checked, at
    /// `payload[8..len - 16]`.
    pub fn open_frame(
        &mut self,
        now: UnixTime,
        route: &Route,
        payload: &mut [u8],
    ) -> Result<(Opened, bool), OpenError> {
        let i = self.slot_of(payload);
        let Some(slot) = &mut self.slots[i] else {
            return Err(OpenError::NoKey);
        };
        let saved = slot.has_others(now).then(|| payload.to_vec());
        let frame = match slot.opener.open_frame(route, payload).map(|f| f.is_some()) {
            Ok(frame) => frame,
            // Another key cannot make a refused frame valid: its tag verified under this one.
            Err(e @ OpenError::BadFrame(_)) => return Err(e),
            Err(e) => {
                let Some(saved) = saved else {
                    return Err(e);
                };
                let mut retry = |o: &mut Opener| {
                    payload.copy_from_slice(&saved);
                    o.open_frame(route, payload).map(|f| f.is_some())
                };
                if let Some((old, until)) = &mut slot.retiring {
                    if now < *until {
                        if let Ok(frame) = retry(old) {
                            let opened = Opened {
                                len: frame_len(frame, payload.len()),
                                confirmed: None,
                                confirmed_key: None,
                            };
                            return Ok((opened, frame));
                        }
                    }
                }
                let Some((k, frame)) = slot
                    .spares
                    .iter_mut()
                    .enumerate()
                    .rev()
                    .find_map(|(k, o)| retry(o).ok().map(|f| (k, f)))
                else {
                    return Err(e);
                };
                let won = slot.spares.swap_remove(k);
                slot.opener = won;
                frame
            }
        };
        Ok((self.confirm(i, now, frame_len(frame, payload.len())), frame))
    }

    /// [`ReceiveKeys::open_frame`] in three steps, for a driver that opens outside the lock
    /// guarding these keys ([`Opener::frame_job`]): the AEAD job of the payload's slot and the
    /// slot's index. `Ok(None)` where the slot has other keys to try (a rekey race, §9.5: rare and
    /// brief) or the payload is a keepalive: open it with `open_frame` instead.
    pub fn frame_job(
        &self,
        now: UnixTime,
        route: &Route,
        payload: &[u8],
    ) -> Result<Option<(usize, FrameJob)>, OpenError> {
        let i = self.slot_of(payload);
        let Some(slot) = &self.slots[i] else {
            return Err(OpenError::NoKey);
        };
        if slot.has_others(now) {
            return Ok(None);
        }
        Ok(slot.opener.frame_job(route, payload)?.map(|j| (i, j)))
    }

    /// The last step, after [`FrameJob::open`] verified `payload`: the replay window and the
    /// frame check of the key that made `job` ([`Opener::commit_frame`]): slot `i`'s key, which
    /// the first frame confirms as `open_frame` does, or the key a handshake retired from the
    /// slot in the meantime (within its grace). `Ok(None)`: neither made it (the key is gone),
    /// nothing taken.
    pub fn commit_frame(
        &mut self,
        now: UnixTime,
        i: usize,
        job: &FrameJob,
        payload: &mut [u8],
    ) -> Result<Option<Opened>, OpenError> {
        let len = frame_len(true, payload.len());
        let Some(slot) = self.slots.get_mut(i).and_then(Option::as_mut) else {
            return Ok(None);
        };
        if slot.opener.made(job) {
            if slot.opener.commit_frame(job, payload)?.is_none() {
                return Ok(None);
            }
            return Ok(Some(self.confirm(i, now, len)));
        }
        if let Some((old, until)) = &mut slot.retiring {
            if now < *until && old.made(job) && old.commit_frame(job, payload)?.is_some() {
                return Ok(Some(Opened {
                    len,
                    confirmed: None,
                    confirmed_key: None,
                }));
            }
        }
        Ok(None)
    }

    /// [`ReceiveKeys::open_in_place`] in three steps, for a driver that opens outside the lock
    /// guarding these keys ([`Opener::packet_job`]): the AEAD job of the payload's slot and the
    /// slot's index. `Ok(None)` where the slot has other keys to try (a rekey race, §9.5: rare
    /// and brief) or the payload is a keepalive: open it with `open_in_place` instead.
    pub fn packet_job(
        &self,
        now: UnixTime,
        route: &Route,
        buf: &[u8],
        payload_len: usize,
    ) -> Result<Option<(usize, PacketJob)>, OpenError> {
        let payload = OPEN_HEADROOM..OPEN_HEADROOM.saturating_add(payload_len);
        let i = self.slot_of(buf.get(payload).unwrap_or_default());
        let Some(slot) = &self.slots[i] else {
            return Err(OpenError::NoKey);
        };
        if slot.has_others(now) {
            return Ok(None);
        }
        Ok(slot
            .opener
            .packet_job(route, buf, payload_len)?
            .map(|j| (i, j)))
    }

    /// The last step, after [`PacketJob::open`] verified the tag: the replay window of the key
    /// that made `job` ([`Opener::commit_packet`]): slot `i`'s key, which the first packet
    /// confirms as `open_in_place` does, or the key a handshake retired from the slot in the
    /// meantime (within its grace). `len` is the inner packet's. `Ok(None)`: neither made it
    /// (the key is gone), nothing taken.
    pub fn commit_packet(
        &mut self,
        now: UnixTime,
        i: usize,
        job: &PacketJob,
        len: usize,
    ) -> Result<Option<Opened>, OpenError> {
        let Some(slot) = self.slots.get_mut(i).and_then(Option::as_mut) else {
            return Ok(None);
        };
        if slot.opener.commit_packet(job)? {
            return Ok(Some(self.confirm(i, now, len)));
        }
        if let Some((old, until)) = &mut slot.retiring {
            if now < *until && old.commit_packet(job)? {
                return Ok(Some(Opened {
                    len,
                    confirmed: None,
                    confirmed_key: None,
                }));
            }
        }
        Ok(None)
    }

    /// The slot a payload's key phase names (slot 0 for a static key).
    fn slot_of(&self, payload: &[u8]) -> usize {
        if self.single {
            0
        } else {
            KeyPhase::of_payload(payload).map_or(0, KeyPhase::index)
        }
    }

    /// Erases keys whose grace period is over. Cheap; call it once per receive batch or tick.
    pub fn expire(&mut self, now: UnixTime) {
        for s in self.slots.iter_mut().flatten() {
            if s.retiring.as_ref().is_some_and(|(_, until)| now >= *until) {
                s.retiring = None;
                self.version += 1;
            }
        }
        for s in &mut self.slots {
            if s.as_ref()
                .and_then(|s| s.retire_at)
                .is_some_and(|at| now >= at)
            {
                *s = None;
                self.version += 1;
            }
        }
    }

    /// Erases every key (keys expired without a rekey).
    pub fn clear(&mut self) {
        self.slots = [None, None];
        self.version += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{addr, pair, udp, A, B};
    use crate::{AeadAlg, Epoch, Mode, Sealer};

    /// `open_frame` (a relay link's payloads, docs/PROTOCOL.md §10.2) in the same rekey race:
    /// the retiring key opens without confirming, an earlier answer's spare opens and confirms,
    /// and after that neither the replaced newest key nor the old one opens; a keepalive is not
    /// a frame.
    #[test]
    fn open_frame_tries_the_keys_open_tries() {
        use crate::relay::frame::MIN_FRAME_MAX;
        use crate::relay::{Kind, RelayRepr};
        use crate::tunnel::frame_payload_len;
        let (mode, alg) = (Mode::Encrypt, AeadAlg::Aes256Gcm);
        let (a, b) = pair(mode, alg);
        let (ra, rb) = (a.route(Epoch(3)), b.route(Epoch(3)));
        let now = UnixTime::from_secs(1_000);
        let phase = KeyPhase::Zero;
        let sealer = |k: u8| Sealer::for_session(mode, alg, &[k; 32], phase, addr(A), addr(B));
        let opener = |k: u8| Opener::for_session(mode, alg, &[k; 32], phase, addr(B), addr(A));
        let mut keys = ReceiveKeys::new();
        keys.install(opener(1), true, now);
        keys.install(opener(2), false, now);
        keys.install(opener(3), false, now);
        let repr = RelayRepr::link_local(Kind::Probe, 20);
        let sealers = [sealer(1), sealer(2), sealer(3)];
        let frame = |k: usize| {
            let mut out = vec![0u8; frame_payload_len(MIN_FRAME_MAX)];
            let n = sealers[k - 1]
                .seal_frame(&ra, &repr, &[7; 20], MIN_FRAME_MAX, &mut out)
                .unwrap();
            out.truncate(n);
            out
        };
        let got = |keys: &mut ReceiveKeys, mut wire: Vec<u8>| {
            keys.open_frame(now, &rb, &mut wire)
                .map(|(o, f)| (o.confirmed.is_some(), f, o.len))
        };
        assert_eq!(
            got(&mut keys, frame(1)),
            Ok((false, true, 128)),
            "the retiring key"
        );
        assert_eq!(
            got(&mut keys, frame(2)),
            Ok((true, true, 128)),
            "a spare confirms"
        );
        assert!(got(&mut keys, frame(3)).is_err(), "the replaced newest key");
        assert!(got(&mut keys, frame(1)).is_err(), "the old key, erased");
        let mut ka = vec![0u8; 64];
        let n = sealers[1].seal_keepalive(&ra, &mut ka).unwrap();
        ka.truncate(n);
        assert_eq!(got(&mut keys, ka), Ok((false, false, 0)), "a keepalive");
    }

    /// The three steps (`frame_job`, the AEAD, `commit_frame`) open what `open_frame` opens,
    /// confirm a new key as it does, refuse a replay that passed the first step twice (two
    /// workers, one counter), and take nothing from a job whose key a handshake replaced
    /// between the steps; a slot with other keys to try is left to `open_frame`.
    /// The keys copied for a receive gate: none for an empty phase, the key alone where it
    /// decides (its jobs commit under the slot's opener), none while the slot has a spare to
    /// try; every change of the keys moves the version on.
    #[test]
    fn frame_keys_are_the_keys_that_alone_decide_and_follow_the_version() {
        use crate::relay::frame::MIN_FRAME_MAX;
        use crate::relay::{Kind, RelayRepr};
        use crate::tunnel::frame_payload_len;
        let (mode, alg) = (Mode::Encrypt, AeadAlg::Aes256Gcm);
        let (a, b) = pair(mode, alg);
        let (ra, rb) = (a.route(Epoch(3)), b.route(Epoch(3)));
        let now = UnixTime::from_secs(1_000);
        let phase = KeyPhase::Zero;
        let opener = |k: u8| Opener::for_session(mode, alg, &[k; 32], phase, addr(B), addr(A));
        let sealer = Sealer::for_session(mode, alg, &[1; 32], phase, addr(A), addr(B));
        let mut wire = vec![0u8; frame_payload_len(MIN_FRAME_MAX)];
        let repr = RelayRepr::link_local(Kind::Probe, 20);
        let n = sealer
            .seal_frame(&ra, &repr, &[7; 20], MIN_FRAME_MAX, &mut wire)
            .unwrap();
        wire.truncate(n);
        let mut keys = ReceiveKeys::new();
        assert_eq!(
            keys.frame_keys().for_payload(&wire).err(),
            Some(SlotState::Empty)
        );
        let v0 = keys.version();
        keys.install(opener(1), false, now);
        assert_ne!(keys.version(), v0);
        let copy = keys.frame_keys();
        let (i, key) = copy.for_payload(&wire).unwrap();
        let job = key.frame_job(&rb, &wire).unwrap().unwrap();
        job.open(&mut wire).unwrap();
        let v1 = keys.version();
        assert!(keys
            .commit_frame(now, i, &job, &mut wire)
            .unwrap()
            .is_some());
        // The first frame confirmed the key: a change.
        assert_ne!(keys.version(), v1);
        // An unconfirmed key over an unconfirmed one keeps a spare: the locked path's.
        let mut race = ReceiveKeys::new();
        race.install(opener(1), false, now);
        race.install(opener(2), false, now);
        assert_eq!(
            race.frame_keys().for_payload(&wire).err(),
            Some(SlotState::Others)
        );
        let v = race.version();
        race.clear();
        assert_ne!(race.version(), v);
    }

    #[test]
    fn frame_jobs_open_commit_and_refuse_as_open_frame_does() {
        use crate::relay::frame::MIN_FRAME_MAX;
        use crate::relay::{Kind, RelayRepr};
        use crate::tunnel::frame_payload_len;
        let (mode, alg) = (Mode::Encrypt, AeadAlg::Aes256Gcm);
        let (a, b) = pair(mode, alg);
        let (ra, rb) = (a.route(Epoch(3)), b.route(Epoch(3)));
        let now = UnixTime::from_secs(1_000);
        let phase = KeyPhase::Zero;
        let sealer = |k: u8| Sealer::for_session(mode, alg, &[k; 32], phase, addr(A), addr(B));
        let opener = |k: u8| Opener::for_session(mode, alg, &[k; 32], phase, addr(B), addr(A));
        let repr = RelayRepr::link_local(Kind::Probe, 20);
        let sealers = [sealer(1), sealer(2)];
        let frame = |k: usize| {
            let mut out = vec![0u8; frame_payload_len(MIN_FRAME_MAX)];
            let n = sealers[k - 1]
                .seal_frame(&ra, &repr, &[7; 20], MIN_FRAME_MAX, &mut out)
                .unwrap();
            out.truncate(n);
            out
        };
        let mut keys = ReceiveKeys::new();
        keys.install(opener(1), false, now);
        // The unconfirmed key's first frame: opened in three steps, it confirms the key.
        let mut wire = frame(1);
        let (i, job) = keys.frame_job(now, &rb, &wire).unwrap().unwrap();
        job.open(&mut wire).unwrap();
        let opened = keys.commit_frame(now, i, &job, &mut wire).unwrap().unwrap();
        assert_eq!((opened.len, opened.confirmed), (128, Some(phase)));
        let at = crate::tunnel::COUNTER_LEN + crate::relay::frame::HEADER_LEN;
        assert_eq!(&wire[at..at + 20], &[7; 20]);
        // One datagram through the first step twice (a replay racing the original): one opens.
        let wire = frame(1);
        let (mut w1, mut w2) = (wire.clone(), wire);
        let (i1, j1) = keys.frame_job(now, &rb, &w1).unwrap().unwrap();
        let (i2, j2) = keys.frame_job(now, &rb, &w2).unwrap().unwrap();
        j1.open(&mut w1).unwrap();
        j2.open(&mut w2).unwrap();
        assert!(keys.commit_frame(now, i1, &j1, &mut w1).unwrap().is_some());
        assert!(matches!(
            keys.commit_frame(now, i2, &j2, &mut w2),
            Err(OpenError::Replay(_))
        ));
        // A forged payload fails the AEAD and takes nothing.
        let mut forged = frame(1);
        let (_, job) = keys.frame_job(now, &rb, &forged).unwrap().unwrap();
        forged[20] ^= 1;
        assert_eq!(job.open(&mut forged), Err(OpenError::BadTag));
        // A job made before a confirmed handshake replaced the slot's key: nothing taken.
        let mut wire = frame(1);
        let (i, job) = keys.frame_job(now, &rb, &wire).unwrap().unwrap();
        keys.install(opener(2), true, now);
        job.open(&mut wire).unwrap();
        assert_eq!(keys.commit_frame(now, i, &job, &mut wire), Ok(None));
        // An unconfirmed key over a confirmed one: the slot has the retiring key to try, so the
        // first step leaves it to `open_frame`.
        keys.install(opener(1), false, now);
        assert!(keys.frame_job(now, &rb, &frame(2)).unwrap().is_none());
    }

    /// In a rekey race (the newest key unconfirmed, the previous one retiring, an earlier answer
    /// kept as a spare), `open_in_place` tries the keys `open` tries, in the same order, with
    /// the same results and confirmations, although a failed try may have overwritten the
    /// payload it is given.
    #[test]
    fn open_in_place_tries_the_keys_open_tries() {
        for (mode, alg) in [
            (Mode::Encrypt, AeadAlg::Aes256Gcm),
            (Mode::Encrypt, AeadAlg::ChaCha20Poly1305),
            (Mode::Auth, AeadAlg::Aes256Gcm),
            (Mode::Auth, AeadAlg::ChaCha20Poly1305),
        ] {
            let (a, b) = pair(mode, alg);
            let (ra, rb) = (a.route(Epoch(3)), b.route(Epoch(3)));
            let now = UnixTime::from_secs(1_000);
            let phase = KeyPhase::Zero;
            let sealer = |k: u8| Sealer::for_session(mode, alg, &[k; 32], phase, addr(A), addr(B));
            let racing = || {
                let opener =
                    |k: u8| Opener::for_session(mode, alg, &[k; 32], phase, addr(B), addr(A));
                let mut r = ReceiveKeys::new();
                r.install(opener(1), true, now);
                r.install(opener(2), false, now);
                r.install(opener(3), false, now);
                r
            };
            let (mut copying, mut in_place) = (racing(), racing());
            let sealers = [sealer(1), sealer(2), sealer(3)];
            let pkt = udp(addr(A), addr(B), &[0x42; 300]);
            // Old key (retiring), a spare (wins, confirms), then the newest and the old key
            // again, which the confirmation erased.
            for k in [1usize, 2, 3, 1] {
                let mut wire = [0u8; 512];
                let n = sealers[k - 1].seal(&ra, &pkt, &mut wire).unwrap();
                let mut out = [0u8; 512];
                let want = copying
                    .open(now, &rb, &wire[..n], &mut out)
                    .map(|o| (o, out[..o.len].to_vec()));
                let mut buf = vec![0u8; OPEN_HEADROOM + n];
                buf[OPEN_HEADROOM..].copy_from_slice(&wire[..n]);
                let got = in_place
                    .open_in_place(now, &rb, &mut buf, n)
                    .map(|(o, inner)| (o, inner.to_vec()));
                assert_eq!(got, want, "{mode} {alg} key {k}");
                if k == 2 {
                    assert!(got.unwrap().0.confirmed.is_some(), "the spare confirms");
                }
            }
        }
    }
}
