//! Router Solicitation and Router Advertisement (RFC 4861 §4.1-4.2, §4.6): a checked view for
//! the ones a gateway receives, and the bytes of the ones it sends (docs/PROTOCOL.md §5.3).
//!
//! ```text
//! Router Solicitation              Router Advertisement
//! +------+------+----------+       +------+------+----------+
//! | 133  |  0   | checksum |       | 134  |  0   | checksum |
//! +------+------+----------+       +------+------+----------+
//! |      reserved (4)      |       | hops | M O  | lifetime |
//! +------------------------+       +------+------+----------+
//! | options ...                    |   reachable time (4)   |
//!                                  |   retrans timer (4)    |
//!                                  | options ...
//! ```
//! Options are type, length in units of 8 bytes (never 0), body. The ones read or written here:
//! source link-layer address (type 1, 8 bytes for Ethernet) and MTU (type 5, 8 bytes: 2 reserved,
//! then the MTU as a 32-bit number).
//!
//! Validation follows RFC 4861 §6.1.1-6.1.2 as far as the bytes go: code 0, at least the fixed
//! part, every option length non-zero and inside the message. The hop limit (255), the
//! checksum and the source address rules need the IPv6 header, which the caller checks.

use super::ndisc::OPT_SOURCE_LLADDR;
use super::{read_u16, read_u32, WireError};

const WHAT: &str = "router discovery";

/// ICMPv6 type of a Router Solicitation.
pub const ROUTER_SOLICITATION: u8 = 133;
/// ICMPv6 type of a Router Advertisement.
pub const ROUTER_ADVERTISEMENT: u8 = 134;
/// Fixed part of a Router Solicitation.
pub const ROUTER_SOLICITATION_LEN: usize = 8;
/// Fixed part of a Router Advertisement.
const RA_FIXED_LEN: usize = 16;
/// Option: MTU.
const OPT_MTU: u8 = 5;
/// Bytes of the Router Advertisement [`router_advertisement`] writes: fixed part, source
/// link-layer address, MTU.
pub const ROUTER_ADVERTISEMENT_LEN: usize = RA_FIXED_LEN + 8 + 8;

/// A validated Router Solicitation or Router Advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouterMessage<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> RouterMessage<T> {
    /// Checks type (133 or 134), code 0, the fixed part and every option's length.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        let have = b.len();
        let malformed = |field| WireError::Malformed { what: WHAT, field };
        let fixed = match b.first() {
            Some(&ROUTER_SOLICITATION) => ROUTER_SOLICITATION_LEN,
            Some(&ROUTER_ADVERTISEMENT) => RA_FIXED_LEN,
            Some(_) => return Err(malformed("type")),
            None => {
                return Err(WireError::Truncated {
                    what: WHAT,
                    have,
                    need: ROUTER_SOLICITATION_LEN,
                })
            }
        };
        if have < fixed {
            return Err(WireError::Truncated {
                what: WHAT,
                have,
                need: fixed,
            });
        }
        if b[1] != 0 {
            return Err(malformed("code"));
        }
        let mut at = fixed;
        while at < have {
            let len = usize::from(*b.get(at + 1).ok_or(malformed("option length"))?) * 8;
            if len == 0 || at + len > have {
                return Err(malformed("option length"));
            }
            at += len;
        }
        Ok(Self { buffer })
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// True for a Router Advertisement, false for a Router Solicitation.
    pub fn is_advertisement(&self) -> bool {
        self.b()[0] == ROUTER_ADVERTISEMENT
    }

    /// Router lifetime in seconds (0 for a solicitation).
    pub fn router_lifetime(&self) -> u16 {
        if self.is_advertisement() {
            read_u16(self.b(), 6)
        } else {
            0
        }
    }

    /// The options as (type, whole option including its 2-byte header).
    pub fn options(&self) -> impl Iterator<Item = (u8, &[u8])> {
        let b = self.b();
        let mut at = if self.is_advertisement() {
            RA_FIXED_LEN
        } else {
            ROUTER_SOLICITATION_LEN
        };
        std::iter::from_fn(move || {
            // Lengths were checked by new_checked: non-zero and inside the buffer.
            let len = usize::from(*b.get(at + 1)?) * 8;
            let opt = b.get(at..at + len)?;
            at += len;
            Some((opt[0], opt))
        })
    }

    /// The source link-layer address option's address, if present and Ethernet-sized.
    pub fn source_lladdr(&self) -> Option<[u8; 6]> {
        self.options()
            .find(|(t, _)| *t == OPT_SOURCE_LLADDR)
            .and_then(|(_, o)| o.get(2..8)?.try_into().ok())
    }

    /// The MTU option's value, if present (only meaningful in an advertisement).
    pub fn mtu(&self) -> Option<u32> {
        self.options()
            .find(|(t, o)| *t == OPT_MTU && o.len() == 8)
            .map(|(_, o)| read_u32(o, 4))
    }
}

/// The ICMPv6 part of a Router Advertisement that announces only the link MTU: router lifetime
/// 0 (the gateway does not offer itself as a default router: the protected hosts reach the
/// remote hosts on-link, through the gateway's proxy neighbour entries), no prefixes, no
/// reachable/retransmit timers, the sender's link-layer address and the MTU. The checksum is
/// left 0 for the kernel (raw ICMPv6 socket, RFC 3542 §3.1).
pub fn router_advertisement(mac: [u8; 6], mtu: u32) -> [u8; ROUTER_ADVERTISEMENT_LEN] {
    let mut m = [0u8; ROUTER_ADVERTISEMENT_LEN];
    m[0] = ROUTER_ADVERTISEMENT;
    // Bytes 4-15: cur hop limit 0 (unspecified), flags 0, lifetime 0, timers 0.
    m[16] = OPT_SOURCE_LLADDR;
    m[17] = 1;
    m[18..24].copy_from_slice(&mac);
    m[24] = OPT_MTU;
    m[25] = 1;
    m[28..32].copy_from_slice(&mtu.to_be_bytes());
    m
}

/// A Router Solicitation without options (RFC 4861 §4.1: the source link-layer address option
/// is optional, and forbidden from the unspecified address).
pub fn router_solicitation() -> [u8; ROUTER_SOLICITATION_LEN] {
    let mut m = [0u8; ROUTER_SOLICITATION_LEN];
    m[0] = ROUTER_SOLICITATION;
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::hex;

    const MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x10, 0x20, 0x30];

    #[test]
    fn advertisement_bytes_and_round_trip() {
        let ra = router_advertisement(MAC, 1436);
        assert_eq!(
            ra.to_vec(),
            hex("86000000 00000000 00000000 00000000 0101 02005e102030 0501 0000 0000059c")
        );
        let v = RouterMessage::new_checked(&ra[..]).unwrap();
        assert!(v.is_advertisement());
        assert_eq!(v.router_lifetime(), 0);
        assert_eq!(v.mtu(), Some(1436));
        assert_eq!(v.source_lladdr(), Some(MAC));
        assert_eq!(v.options().count(), 2);
    }

    #[test]
    fn solicitation_from_a_host() {
        let mut rs = router_solicitation().to_vec();
        assert_eq!(rs, hex("85000000 00000000"));
        let v = RouterMessage::new_checked(&rs[..]).unwrap();
        assert!(!v.is_advertisement());
        assert_eq!(v.source_lladdr(), None);
        rs.extend_from_slice(&[1, 1, 0x02, 0, 0, 0, 0, 9]);
        let v = RouterMessage::new_checked(&rs[..]).unwrap();
        assert_eq!(v.source_lladdr(), Some([0x02, 0, 0, 0, 0, 9]));
        assert_eq!(v.mtu(), None);
    }

    #[test]
    fn malformed_messages_are_refused() {
        let ra = router_advertisement(MAC, 1500);
        // Truncated anywhere inside the fixed part or an option.
        for cut in 0..ra.len() {
            if cut == 16 || cut == 24 {
                continue; // these are whole messages (fewer options)
            }
            assert!(RouterMessage::new_checked(&ra[..cut]).is_err(), "cut {cut}");
        }
        let mut bad = ra;
        bad[1] = 1;
        assert!(RouterMessage::new_checked(&bad[..]).is_err(), "code");
        let mut bad = ra;
        bad[25] = 0;
        assert!(RouterMessage::new_checked(&bad[..]).is_err(), "zero length");
        let mut bad = ra;
        bad[17] = 4;
        assert!(RouterMessage::new_checked(&bad[..]).is_err(), "overlong");
        let mut bad = ra;
        bad[0] = 135;
        assert!(RouterMessage::new_checked(&bad[..]).is_err(), "type");
        // An MTU option of the wrong size is ignored, not misread.
        let mut odd = ra.to_vec();
        odd[25] = 2;
        odd.extend_from_slice(&[0; 8]);
        let v = RouterMessage::new_checked(&odd[..]).unwrap();
        assert_eq!(v.mtu(), None);
    }
}
