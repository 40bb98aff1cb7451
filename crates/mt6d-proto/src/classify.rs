//! The first step of every received tunnel payload, for every role: header protection removed
//! (docs/PROTOCOL.md §4.5), then the payload's class read from its first byte (§4.2, §5.2,
//! §9.3). Each class has its own next step: a data packet or keepalive goes to the opener, a
//! handshake message to the link's handshake, a route move notice to the link's route sets, a
//! link-layer address announcement to the neighbour pinning of a shared segment.
//!
//! ```text
//! byte 0 (after unmasking)   class
//! 0x83                       Notice            (route move notice or its ack, §5.2)
//! 0x84                       LinkAnnouncement  (pinned neighbours, §5.2)
//! other, high bit set        Handshake         (§9.3)
//! high bit clear             Data              (a data packet's or keepalive's counter, §4.2)
//! ```
//!
//! Garbage unmasks to garbage and lands in some class; each class's own check (tag, MAC) refuses
//! it there. Only a payload too short to carry protection at all is refused here.

use crate::handshake::is_handshake;
use crate::moves::{is_link_announcement, is_notice};
use crate::tunnel::{HeaderError, HeaderKey};

/// What a received tunnel payload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A data packet or a keepalive: for the opener.
    Data,
    /// A handshake message (initiation, response, cookie reply).
    Handshake,
    /// A route move notice or its acknowledgement.
    Notice,
    /// A link-layer address announcement.
    LinkAnnouncement,
}

/// The class of an unprotected payload.
pub fn classify(payload: &[u8]) -> Class {
    if is_notice(payload) {
        if is_link_announcement(payload) {
            Class::LinkAnnouncement
        } else {
            Class::Notice
        }
    } else if is_handshake(payload) {
        Class::Handshake
    } else {
        Class::Data
    }
}

/// Removes header protection from `payload` in place with `key` (none: plain mode, nothing to
/// remove) and classifies it.
pub fn receive(key: Option<&HeaderKey>, payload: &mut [u8]) -> Result<Class, HeaderError> {
    if let Some(key) = key {
        key.unprotect(payload)?;
    }
    Ok(classify(payload))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addressing::Role;
    use crate::SessionKey;

    #[test]
    fn every_first_byte_has_one_class() {
        for b in 0..=255u8 {
            let class = classify(&[b, 0, 0]);
            let want = match b {
                0x83 => Class::Notice,
                0x84 => Class::LinkAnnouncement,
                b if b & 0x80 != 0 => Class::Handshake,
                _ => Class::Data,
            };
            assert_eq!(class, want, "first byte {b:#04x}");
        }
        assert_eq!(classify(&[]), Class::Data, "empty: the opener refuses it");
    }

    #[test]
    fn protection_comes_off_before_the_class_is_read() {
        let key = HeaderKey::derive(
            &SessionKey::from_bytes(&[7; 32]).expect("32 bytes"),
            Role::Low,
        );
        let mut notice = [0u8; 40];
        notice[0] = 0x83;
        notice[24..].copy_from_slice(&[0x5a; 16]);
        let clear = notice;
        key.protect(&mut notice).expect("long enough");
        assert_ne!(notice[..8], clear[..8], "masked");
        assert_eq!(receive(Some(&key), &mut notice), Ok(Class::Notice));
        assert_eq!(notice, clear);
        let mut short = [0x83u8; 10];
        assert!(receive(Some(&key), &mut short).is_err());
        assert_eq!(receive(None, &mut short), Ok(Class::Notice));
    }
}
