//! The receive side's two key slots (one per key phase), owned by the receiving thread: which key
//! opens a packet, when a responder's new keys are confirmed, and when an old key is erased
//! (docs/PROTOCOL.md §9.5).

use super::OLD_KEY_GRACE;
use crate::tunnel::KeyPhase;
use crate::{OpenError, Opener, Route, UnixTime};

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

fn grace_end(now: UnixTime) -> UnixTime {
    UnixTime::from_nanos(now.as_nanos() + OLD_KEY_GRACE.as_nanos() as u64)
}

/// Up to two receive keys of one peer, selected by the packet's key phase. A static-key stream
/// has one key, used for every packet.
#[derive(Debug, Default)]
pub struct ReceiveKeys {
    slots: [Option<Slot>; 2],
    single: bool,
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
        }
    }

    /// Installs a handshake key in its phase's slot, erasing what was there. `confirmed`: the
    /// handshake is already complete on this side (we initiated), so the other slot's key is now
    /// the old one and is erased after [`OLD_KEY_GRACE`].
    /// An unconfirmed key replacing an unconfirmed key of the same slot keeps the older one as a
    /// spare until one of them is confirmed.
    pub fn install(&mut self, opener: Opener, confirmed: bool, now: UnixTime) {
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

    /// Opens `payload` (arrived on `route`) with the key of its phase.
    pub fn open(
        &mut self,
        now: UnixTime,
        route: &Route,
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<Opened, OpenError> {
        let i = if self.single {
            0
        } else {
            KeyPhase::of_payload(payload).map_or(0, KeyPhase::index)
        };
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
        let mut confirmed = None;
        let mut confirmed_key = None;
        if !slot.confirmed {
            slot.confirmed = true;
            slot.spares.clear();
            slot.retiring = None;
            confirmed = slot.opener.phase();
            confirmed_key = slot.opener.key_id();
            self.retire_other(i, now);
        }
        Ok(Opened {
            len,
            confirmed,
            confirmed_key,
        })
    }

    /// Erases keys whose grace period is over. Cheap; call it once per receive batch or tick.
    pub fn expire(&mut self, now: UnixTime) {
        for s in self.slots.iter_mut().flatten() {
            if s.retiring.as_ref().is_some_and(|(_, until)| now >= *until) {
                s.retiring = None;
            }
        }
        for s in &mut self.slots {
            if s.as_ref()
                .and_then(|s| s.retire_at)
                .is_some_and(|at| now >= at)
            {
                *s = None;
            }
        }
    }

    /// Erases every key (keys expired without a rekey).
    pub fn clear(&mut self) {
        self.slots = [None, None];
    }
}
