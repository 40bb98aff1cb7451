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
}

/// A received packet that opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// Inner packet length (0: a keepalive, nothing to deliver).
    pub len: usize,
    /// Set the first time a packet opens under a newly installed, unconfirmed key: the peer has
    /// these keys, so a responder may now send with the matching send key.
    pub confirmed: Option<KeyPhase>,
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
                }),
                None,
            ],
            single: true,
        }
    }

    /// Installs a handshake key in its phase's slot, erasing what was there. `confirmed`: the
    /// handshake is already complete on this side (we initiated), so the other slot's key is now
    /// the old one and is erased after [`OLD_KEY_GRACE`].
    pub fn install(&mut self, opener: Opener, confirmed: bool, now: UnixTime) {
        let i = opener.phase().map_or(0, KeyPhase::index);
        self.slots[i] = Some(Slot {
            opener,
            confirmed,
            retire_at: None,
        });
        if confirmed {
            self.retire_other(i, now);
        }
    }

    fn retire_other(&mut self, newest: usize, now: UnixTime) {
        if let Some(old) = &mut self.slots[1 - newest] {
            let at = UnixTime::from_nanos(now.as_nanos() + OLD_KEY_GRACE.as_nanos() as u64);
            old.retire_at.get_or_insert(at);
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
        let len = slot.opener.open(route, payload, out)?;
        let mut confirmed = None;
        if !slot.confirmed {
            slot.confirmed = true;
            confirmed = slot.opener.phase();
            self.retire_other(i, now);
        }
        Ok(Opened { len, confirmed })
    }

    /// Erases keys whose grace period is over. Cheap; call it once per receive batch or tick.
    pub fn expire(&mut self, now: UnixTime) {
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
