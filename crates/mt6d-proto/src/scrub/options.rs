//! Reading a TCP option block (RFC 9293 §3.1-3.2) and classifying every option, including the
//! identity options a gateway removes: the HOST_ID forms of seed 004, RFC 7974's experimental
//! HOST_ID and the TOA option of layer-4 load balancers.
//!
//! ```text
//! EOL / NOP        +--------+            +--------+
//!                  |Kind=0  |            |Kind=1  |
//!                  +--------+            +--------+
//! any other kind   +--------+--------+--- ... ---+
//!                  |  Kind  | Length |  Length-2 data bytes (Length >= 2, RFC 9293 §3.1)
//!                  +--------+--------+--- ... ---+
//! HOST_ID_WING     |Kind=TBD|  4/6/10|  2, 4 or 8 data bytes        (004 §3.1, §6.1)
//! HOST_ID_BOUCADAIR|Kind=TBD|   10   | L | O  | 7 data bytes + pad  (004 §3.2, Fig. 3)
//! HOST_ID_ENABLED  |Kind=TBD|    2   |                              (004 §3.2, Fig. 4)
//! RFC 7974 HOST_ID | 253/254| Length | ExID = 0x0348 | HOST_ID data (RFC 6994 §3)
//! TOA              |  254   |    8   |  port (2)     | IPv4 (4)     (Linux TOA modules)
//! ```
//! 004 never prints the three kinds ("Kind=TBD" in Fig. 1, 3 and 4; §4 says they were defined in
//! a patched `tcp.h` it does not quote), so they are configuration ([`HostIdKinds`]), not
//! constants: guessing a number would misread whatever option really owns it.

use std::net::Ipv4Addr;

use crate::wire::{read_u16, read_u32};

/// Option kinds with a fixed meaning (IANA TCP option kind numbers).
#[allow(missing_docs)]
pub mod kind {
    pub const EOL: u8 = 0;
    pub const NOP: u8 = 1;
    pub const MSS: u8 = 2;
    pub const WINDOW_SCALE: u8 = 3;
    pub const SACK_PERMITTED: u8 = 4;
    pub const SACK: u8 = 5;
    pub const TIMESTAMPS: u8 = 8;
    /// RFC 4727 §7.2 / RFC 6994: the two kinds shared by experiments, told apart by an ExID.
    pub const EXPERIMENT_1: u8 = 253;
    pub const EXPERIMENT_2: u8 = 254;
}

/// RFC 7974 §2: the RFC 6994 experiment identifier of the HOST_ID option.
pub const HOST_ID_EXID: u16 = 0x0348;
/// Length of a TOA option: kind, length, port, IPv4 address.
pub const TOA_LEN: usize = 8;

/// The kinds a deployment's HOST_ID injectors use for 004's three options (004 leaves them
/// "TBD"). `None` means the form is not recognised and its kind is read as [`TcpOption::Unknown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct HostIdKinds {
    /// HOST_ID_WING (004 §3.1).
    pub wing: Option<u8>,
    /// HOST_ID_BOUCADAIR (004 §3.2).
    pub boucadair: Option<u8>,
    /// HOST_ID_ENABLED (004 §3.2, Fig. 4).
    pub enabled: Option<u8>,
}

impl HostIdKinds {
    /// The first configured kind that must not be one of 004's: EOL, NOP and the kinds read here
    /// with a standard meaning (2-8), RFC 6994's shared 253/254 (told apart by ExID, not kind),
    /// or a kind given to two forms. Configured as WING, kind 2 would make every MSS an identity
    /// option to strip. `None` when the configuration is usable; the daemon refuses it otherwise.
    pub fn conflict(&self) -> Option<u8> {
        let set = [self.wing, self.boucadair, self.enabled];
        set.iter().enumerate().find_map(|(i, k)| {
            let k = (*k)?;
            let reserved = k <= kind::TIMESTAMPS || k >= kind::EXPERIMENT_1;
            (reserved || set[i + 1..].contains(&Some(k))).then_some(k)
        })
    }
}

/// What HOST_ID_BOUCADAIR's 7 data bytes hold, by its Origin (004 §3.2). Data comes first, then
/// zero padding ("padding is required").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BoucadairData {
    /// Origin 0: the internal port.
    InternalPort(u16),
    /// Origin 1: the internal IPv4 address.
    InternalIpv4(Ipv4Addr),
    /// Origin 2: internal port then internal IPv4 address.
    PortAndIpv4(u16, Ipv4Addr),
    /// Origin 3: the first 56 bits of an IPv6 prefix (004 §4: "the first 56 bits"). 004 §8.4
    /// calls this Origin 4 once; §3.2's table is followed here and 4 reads as `Other`.
    Ipv6Prefix([u8; 7]),
    /// Origin > 3: "no particular semantic".
    Other {
        /// The origin value (4..=15).
        origin: u8,
        /// The 7 data bytes as sent.
        data: [u8; 7],
    },
}

/// HOST_ID_BOUCADAIR: lifetime (high nibble of byte 2: 0 permanent, > 0 validity time), then data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Boucadair {
    /// L: 0 = permanent, > 0 = validity time (004 §3.2).
    pub lifetime: u8,
    /// The data, by origin (low nibble of byte 2).
    pub data: BoucadairData,
}

/// One classified option. Data slices borrow the option block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TcpOption<'a> {
    /// Kind 0: end of the option list.
    Eol,
    /// Kind 1: padding.
    Nop,
    /// Kind 2, length 4: maximum segment size (SYN only).
    Mss(u16),
    /// Kind 3, length 3: window scale shift (RFC 7323 §2).
    WindowScale(u8),
    /// Kind 4, length 2: SACK permitted (RFC 2018 §2).
    SackPermitted,
    /// Kind 5, length 10/18/26/34: 1..=4 SACK blocks of two sequence numbers (RFC 2018 §3).
    Sack(&'a [u8]),
    /// Kind 8, length 10: TSval, TSecr (RFC 7323 §3).
    Timestamps {
        /// TSval.
        tsval: u32,
        /// TSecr.
        tsecr: u32,
    },
    /// 004's HOST_ID_WING: 2 data bytes (§3.1), or 4 or 8 (§6.1.4's 32- and 64-bit variants).
    HostIdWing(&'a [u8]),
    /// 004's HOST_ID_BOUCADAIR.
    HostIdBoucadair(Boucadair),
    /// 004's HOST_ID_ENABLED (ACK mode announcement).
    HostIdEnabled,
    /// RFC 7974 HOST_ID: kind 253 or 254 with ExID 0x0348, then at least one data byte.
    HostIdExperimental {
        /// 253 or 254.
        kind: u8,
        /// HOST_ID data.
        data: &'a [u8],
    },
    /// TOA (kind 254, length 8): the client's port and IPv4 address, inserted by full-NAT load
    /// balancers (Linux IPVS/LVS "TCP option address"). Not RFC 6994 conformant: its ExID is the port.
    Toa {
        /// Client port.
        port: u16,
        /// Client IPv4 address.
        addr: Ipv4Addr,
    },
    /// Another RFC 6994 experiment on kind 253/254.
    Experimental {
        /// 253 or 254.
        kind: u8,
        /// Experiment identifier.
        exid: u16,
        /// Bytes after the ExID.
        data: &'a [u8],
    },
    /// Any other kind (well formed: length >= 2 and within the block).
    Unknown {
        /// Kind.
        kind: u8,
        /// Bytes after kind and length.
        data: &'a [u8],
    },
}

impl TcpOption<'_> {
    /// True for the options that identify a host behind the sender: every HOST_ID form and TOA.
    pub fn is_identity(&self) -> bool {
        matches!(
            self,
            Self::HostIdWing(_)
                | Self::HostIdBoucadair(_)
                | Self::HostIdEnabled
                | Self::HostIdExperimental { .. }
                | Self::Toa { .. }
        )
    }
}

/// Why an option block could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum OptionError {
    /// A kind other than EOL/NOP in the last byte: no room for its length byte.
    #[error("TCP option kind {kind} at {at}: no length byte")]
    NoLength {
        /// Offset in the option block.
        at: usize,
        /// Kind.
        kind: u8,
    },
    /// Length byte < 2: the option would not cover its own kind and length (RFC 9293 §3.1).
    #[error("TCP option kind {kind} at {at}: length {len} < 2")]
    LengthTooSmall {
        /// Offset in the option block.
        at: usize,
        /// Kind.
        kind: u8,
        /// Length byte.
        len: u8,
    },
    /// The option runs past the end of the block.
    #[error("TCP option kind {kind} at {at}: length {len} runs past the {block}-byte block")]
    PastEnd {
        /// Offset in the option block.
        at: usize,
        /// Kind.
        kind: u8,
        /// Length byte.
        len: u8,
        /// Block length.
        block: usize,
    },
    /// A length the option's definition does not allow (MSS != 4, WING not 4/6/10, ...).
    #[error("TCP option kind {kind} at {at}: bad length {len}")]
    BadLength {
        /// Offset in the option block.
        at: usize,
        /// Kind.
        kind: u8,
        /// Length byte.
        len: u8,
    },
    /// Non-zero padding: bytes after EOL (RFC 9293 §3.1: "padding ... is composed of zeros"), or
    /// after the data of HOST_ID_BOUCADAIR's origin. `kind` is 0 for padding after EOL.
    #[error("TCP option kind {kind} at {at}: non-zero padding")]
    BadPadding {
        /// Offset in the option block.
        at: usize,
        /// Kind.
        kind: u8,
    },
}

impl OptionError {
    /// True if the block cannot be read past this error (the option's extent is unknown).
    /// Other errors are about one option's content; the iterator goes on after them.
    pub fn is_framing(&self) -> bool {
        matches!(
            self,
            Self::NoLength { .. } | Self::LengthTooSmall { .. } | Self::PastEnd { .. }
        ) || matches!(self, Self::BadPadding { kind: 0, .. })
    }
    /// The kind of the option in error (0 for padding after EOL).
    pub fn kind(&self) -> u8 {
        match *self {
            Self::NoLength { kind, .. }
            | Self::LengthTooSmall { kind, .. }
            | Self::PastEnd { kind, .. }
            | Self::BadLength { kind, .. }
            | Self::BadPadding { kind, .. } => kind,
        }
    }
}

/// One option as found in the block: where, its raw bytes, and what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Located<'a> {
    /// Offset in the option block.
    pub at: usize,
    /// The option's bytes (1 for EOL/NOP, else its length).
    pub raw: &'a [u8],
    /// The classified option.
    pub option: TcpOption<'a>,
}

/// An iterator over a TCP option block (`TcpPacket::options`). Yields every option in order, EOL
/// included; an error about one option's content is yielded and reading goes on; a framing error
/// ([`OptionError::is_framing`]) is yielded once and ends the iteration. Never panics.
#[derive(Debug, Clone)]
pub struct TcpOptions<'a> {
    block: &'a [u8],
    at: usize,
    kinds: HostIdKinds,
    done: bool,
}

impl<'a> TcpOptions<'a> {
    /// Reads `block` with 004's kinds as configured.
    pub fn new(block: &'a [u8], kinds: HostIdKinds) -> Self {
        Self {
            block,
            at: 0,
            kinds,
            done: false,
        }
    }
}

impl<'a> Iterator for TcpOptions<'a> {
    type Item = Result<Located<'a>, OptionError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let at = self.at;
        let b = self.block;
        let Some(&k) = b.get(at) else {
            self.done = true;
            return None;
        };
        match k {
            kind::EOL => {
                self.done = true;
                let rest = &b[at + 1..];
                if let Some(p) = rest.iter().position(|&x| x != 0) {
                    // The EOL itself is fine; report the padding behind it.
                    return Some(Err(OptionError::BadPadding {
                        at: at + 1 + p,
                        kind: kind::EOL,
                    }));
                }
                return Some(Ok(Located {
                    at,
                    raw: &b[at..at + 1],
                    option: TcpOption::Eol,
                }));
            }
            kind::NOP => {
                self.at += 1;
                return Some(Ok(Located {
                    at,
                    raw: &b[at..at + 1],
                    option: TcpOption::Nop,
                }));
            }
            _ => {}
        }
        let Some(&len) = b.get(at + 1) else {
            self.done = true;
            return Some(Err(OptionError::NoLength { at, kind: k }));
        };
        if len < 2 {
            self.done = true;
            return Some(Err(OptionError::LengthTooSmall { at, kind: k, len }));
        }
        let end = at + usize::from(len);
        if end > b.len() {
            self.done = true;
            return Some(Err(OptionError::PastEnd {
                at,
                kind: k,
                len,
                block: b.len(),
            }));
        }
        self.at = end;
        let raw = &b[at..end];
        Some(classify(at, raw, self.kinds).map(|option| Located { at, raw, option }))
    }
}

/// Classifies one option of kind >= 2 whose `raw` bytes (kind, length, data) are in bounds.
/// Inlined so the option is built where `next` returns it: returned through a call, the
/// enum was written in pieces and read back whole, a store-forwarding stall per option that
/// made up most of a SYN's walk.
#[inline(always)]
fn classify(at: usize, raw: &[u8], kinds: HostIdKinds) -> Result<TcpOption<'_>, OptionError> {
    let k = raw[0];
    let len = raw[1];
    let data = &raw[2..];
    let bad = OptionError::BadLength { at, kind: k, len };
    // RFC 6994's ExID form is checked before 004's configured kinds: a deployment that put 004's
    // options on 253/254 still has RFC 7974's option read as such.
    let experimental = k == kind::EXPERIMENT_1 || k == kind::EXPERIMENT_2;
    if experimental && data.len() >= 2 && read_u16(data, 0) == HOST_ID_EXID {
        return if data.len() > 2 {
            Ok(TcpOption::HostIdExperimental {
                kind: k,
                data: &data[2..],
            })
        } else {
            Err(bad)
        };
    }
    if Some(k) == kinds.wing {
        return match data.len() {
            2 | 4 | 8 => Ok(TcpOption::HostIdWing(data)),
            _ => Err(bad),
        };
    }
    if Some(k) == kinds.boucadair {
        return boucadair(at, raw);
    }
    if Some(k) == kinds.enabled {
        return if data.is_empty() {
            Ok(TcpOption::HostIdEnabled)
        } else {
            Err(bad)
        };
    }
    match k {
        kind::MSS if data.len() == 2 => Ok(TcpOption::Mss(read_u16(data, 0))),
        kind::WINDOW_SCALE if data.len() == 1 => Ok(TcpOption::WindowScale(data[0])),
        kind::SACK_PERMITTED if data.is_empty() => Ok(TcpOption::SackPermitted),
        kind::SACK if !data.is_empty() && data.len() <= 32 && data.len() % 8 == 0 => {
            Ok(TcpOption::Sack(data))
        }
        kind::TIMESTAMPS if data.len() == 8 => Ok(TcpOption::Timestamps {
            tsval: read_u32(data, 0),
            tsecr: read_u32(data, 4),
        }),
        kind::MSS | kind::WINDOW_SCALE | kind::SACK_PERMITTED | kind::SACK | kind::TIMESTAMPS => {
            Err(bad)
        }
        kind::EXPERIMENT_2 if raw.len() == TOA_LEN => Ok(TcpOption::Toa {
            port: read_u16(data, 0),
            addr: Ipv4Addr::from(read_u32(data, 2)),
        }),
        // RFC 6994 §3: an experimental option without room for its ExID is malformed.
        kind::EXPERIMENT_1 | kind::EXPERIMENT_2 if data.len() < 2 => Err(bad),
        kind::EXPERIMENT_1 | kind::EXPERIMENT_2 => Ok(TcpOption::Experimental {
            kind: k,
            exid: read_u16(data, 0),
            data: &data[2..],
        }),
        _ => Ok(TcpOption::Unknown { kind: k, data }),
    }
}

/// 004 §3.2, Fig. 3: kind, length 10, one lifetime/origin byte, 7 data bytes (data, then zeros).
fn boucadair(at: usize, raw: &[u8]) -> Result<TcpOption<'_>, OptionError> {
    let k = raw[0];
    if raw.len() != 10 {
        return Err(OptionError::BadLength {
            at,
            kind: k,
            len: raw[1],
        });
    }
    let (lifetime, origin) = (raw[2] >> 4, raw[2] & 0x0f);
    let mut d = [0u8; 7];
    d.copy_from_slice(&raw[3..10]);
    let (data, used) = match origin {
        0 => (BoucadairData::InternalPort(read_u16(&d, 0)), 2),
        1 => (
            BoucadairData::InternalIpv4(Ipv4Addr::from(read_u32(&d, 0))),
            4,
        ),
        2 => (
            BoucadairData::PortAndIpv4(read_u16(&d, 0), Ipv4Addr::from(read_u32(&d, 2))),
            6,
        ),
        3 => (BoucadairData::Ipv6Prefix(d), 7),
        _ => (BoucadairData::Other { origin, data: d }, 7),
    };
    if let Some(p) = d[used..].iter().position(|&x| x != 0) {
        return Err(OptionError::BadPadding {
            at: at + 3 + used + p,
            kind: k,
        });
    }
    Ok(TcpOption::HostIdBoucadair(Boucadair { lifetime, data }))
}

#[cfg(test)]
mod tests {
    use super::super::super::wire::hex;
    use super::*;

    /// The kinds the tests configure for 004's options (any free numbers would do).
    const KINDS: HostIdKinds = HostIdKinds {
        wing: Some(200),
        boucadair: Some(201),
        enabled: Some(202),
    };

    fn one(block: &str) -> Result<TcpOption<'static>, OptionError> {
        let b: &'static [u8] = hex(block).leak();
        TcpOptions::new(b, KINDS).next().unwrap().map(|l| l.option)
    }

    fn all(block: &[u8]) -> Vec<Result<TcpOption<'_>, OptionError>> {
        TcpOptions::new(block, KINDS)
            .map(|r| r.map(|l| l.option))
            .collect()
    }

    #[test]
    fn standard_options() {
        assert_eq!(one("020405a0"), Ok(TcpOption::Mss(1440)));
        assert_eq!(one("030307"), Ok(TcpOption::WindowScale(7)));
        assert_eq!(one("0402"), Ok(TcpOption::SackPermitted));
        assert_eq!(
            one("080a 00000001 00000002"),
            Ok(TcpOption::Timestamps { tsval: 1, tsecr: 2 })
        );
        let sack = one("050a 00000010 00000020").unwrap();
        assert_eq!(sack, TcpOption::Sack(&hex("00000010 00000020")));
        assert!(
            matches!(one(&format!("0522{}", "00".repeat(32))), Ok(TcpOption::Sack(d)) if d.len() == 32)
        );
        assert_eq!(one("01"), Ok(TcpOption::Nop));
        assert_eq!(one("00 000000"), Ok(TcpOption::Eol));
        assert_eq!(
            one("1e04 abcd"),
            Ok(TcpOption::Unknown {
                kind: 30,
                data: &[0xab, 0xcd]
            })
        );
        // A Linux SYN: mss, sackOK+ts, nop+ws; then nothing after.
        let b = hex("020405b4 0402080a 00001000 00000000 01030307");
        let got = all(&b);
        assert_eq!(got.len(), 5);
        assert!(got.iter().all(Result::is_ok));
    }

    #[test]
    fn host_id_wing_each_width() {
        assert_eq!(one("c804 3039"), Ok(TcpOption::HostIdWing(&[0x30, 0x39])));
        assert_eq!(
            one("c806 c0000201"),
            Ok(TcpOption::HostIdWing(&[192, 0, 2, 1]))
        );
        assert_eq!(
            one("c80a 20010db800000001"),
            Ok(TcpOption::HostIdWing(&hex("20010db800000001")))
        );
        for bad in ["c802", "c803 00", "c805 000000", "c808 000000000000"] {
            assert!(
                matches!(one(bad), Err(OptionError::BadLength { kind: 200, .. })),
                "{bad}"
            );
        }
        assert!(TcpOption::HostIdWing(&[1, 2]).is_identity());
    }

    #[test]
    fn host_id_boucadair_each_origin() {
        let b = |x: BoucadairData, l| {
            Ok(TcpOption::HostIdBoucadair(Boucadair {
                lifetime: l,
                data: x,
            }))
        };
        assert_eq!(
            one("c90a 00 1f90 0000000000"),
            b(BoucadairData::InternalPort(8080), 0)
        );
        assert_eq!(
            one("c90a 31 0a000001 000000"),
            b(BoucadairData::InternalIpv4(Ipv4Addr::new(10, 0, 0, 1)), 3)
        );
        assert_eq!(
            one("c90a 02 1f90 0a000001 00"),
            b(
                BoucadairData::PortAndIpv4(8080, Ipv4Addr::new(10, 0, 0, 1)),
                0
            )
        );
        assert_eq!(
            one("c90a f3 20010db8000001"),
            b(
                BoucadairData::Ipv6Prefix([0x20, 1, 0x0d, 0xb8, 0, 0, 1]),
                15
            )
        );
        assert_eq!(
            one("c90a 04 01020304050607"),
            b(
                BoucadairData::Other {
                    origin: 4,
                    data: [1, 2, 3, 4, 5, 6, 7]
                },
                0
            )
        );
        // Padding must be zeros, after the data.
        assert_eq!(
            one("c90a 00 1f90 0000000001"),
            Err(OptionError::BadPadding { at: 9, kind: 201 })
        );
        assert_eq!(
            one("c90a 01 0a000001 000100"),
            Err(OptionError::BadPadding { at: 8, kind: 201 })
        );
        // 004 §6.1.4's broken injector: the padding put in front and not counted in the length.
        assert!(matches!(
            one("c909 02 1f90 0a000001"),
            Err(OptionError::BadLength { len: 9, .. })
        ));
        assert!(matches!(
            one("c90b 02 1f90 0a000001 0000"),
            Err(OptionError::BadLength { len: 11, .. })
        ));
    }

    #[test]
    fn host_id_enabled() {
        assert_eq!(one("ca02"), Ok(TcpOption::HostIdEnabled));
        assert!(matches!(one("ca03 00"), Err(OptionError::BadLength { .. })));
    }

    #[test]
    fn rfc7974_experimental_and_toa() {
        assert_eq!(
            one("fd06 0348 c633"),
            Ok(TcpOption::HostIdExperimental {
                kind: 253,
                data: &[0xc6, 0x33]
            })
        );
        assert_eq!(
            one("fe07 0348 0a0001"),
            Ok(TcpOption::HostIdExperimental {
                kind: 254,
                data: &[10, 0, 1]
            })
        );
        // ExID 0x0348 without data.
        assert!(matches!(
            one("fd04 0348"),
            Err(OptionError::BadLength { kind: 253, .. })
        ));
        // An 8-byte kind 254 whose "ExID" is 0x0348 is RFC 7974's, not TOA.
        assert!(matches!(
            one("fe08 0348 01020304"),
            Ok(TcpOption::HostIdExperimental { .. })
        ));
        assert_eq!(
            one("fe08 1f90 c0000201"),
            Ok(TcpOption::Toa {
                port: 8080,
                addr: Ipv4Addr::new(192, 0, 2, 1)
            })
        );
        // Kind 253 length 8 is another experiment, not TOA.
        assert_eq!(
            one("fd08 1f90 c0000201"),
            Ok(TcpOption::Experimental {
                kind: 253,
                exid: 0x1f90,
                data: &[192, 0, 2, 1]
            })
        );
        assert!(!one("fd04 abcd").unwrap().is_identity());
        assert!(one("fe08 1f90 c0000201").unwrap().is_identity());
        for short in ["fd02", "fe03 00"] {
            assert!(
                matches!(one(short), Err(OptionError::BadLength { .. })),
                "{short}"
            );
        }
    }

    #[test]
    fn kinds_that_cannot_be_004s() {
        assert_eq!(KINDS.conflict(), None);
        assert_eq!(HostIdKinds::default().conflict(), None);
        for (kinds, bad) in [
            (
                HostIdKinds {
                    wing: Some(2),
                    ..KINDS
                },
                2,
            ),
            (
                HostIdKinds {
                    enabled: Some(0),
                    ..KINDS
                },
                0,
            ),
            (
                HostIdKinds {
                    boucadair: Some(253),
                    ..KINDS
                },
                253,
            ),
            (
                HostIdKinds {
                    enabled: Some(200),
                    ..KINDS
                },
                200,
            ),
        ] {
            assert_eq!(kinds.conflict(), Some(bad), "{kinds:?}");
        }
    }

    #[test]
    fn unconfigured_004_kinds_are_unknown() {
        let b = hex("c804 3039");
        let o = TcpOptions::new(&b, HostIdKinds::default())
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(
            o.option,
            TcpOption::Unknown {
                kind: 200,
                data: &[0x30, 0x39]
            }
        );
        assert_eq!(o.raw, &b[..]);
    }

    #[test]
    fn bad_lengths_of_standard_options() {
        for bad in [
            "0203 05",
            "020500000000",
            "0302",
            "030400 00",
            "0403 00",
            "0502",
            "0506 00000000",
            "080800000000 0000",
        ] {
            let e = one(bad).unwrap_err();
            assert!(matches!(e, OptionError::BadLength { .. }), "{bad}: {e:?}");
            assert!(!e.is_framing());
        }
        // Reading goes on after a content error.
        let b = hex("0203 05 0402 01");
        let got = all(&b);
        assert_eq!(got.len(), 3);
        assert_eq!(got[1], Ok(TcpOption::SackPermitted));
    }

    #[test]
    fn framing_errors_end_the_block() {
        let cases: [(&str, OptionError); 5] = [
            ("02", OptionError::NoLength { at: 0, kind: 2 }),
            ("0101 08", OptionError::NoLength { at: 2, kind: 8 }),
            (
                "0200",
                OptionError::LengthTooSmall {
                    at: 0,
                    kind: 2,
                    len: 0,
                },
            ),
            (
                "c801 0000",
                OptionError::LengthTooSmall {
                    at: 0,
                    kind: 200,
                    len: 1,
                },
            ),
            (
                "080a 000000000000",
                OptionError::PastEnd {
                    at: 0,
                    kind: 8,
                    len: 10,
                    block: 8,
                },
            ),
        ];
        for (block, err) in cases {
            let b = hex(block);
            let got = all(&b);
            assert_eq!(got.last(), Some(&Err(err)), "{block}");
            assert!(err.is_framing());
        }
        // Non-zero bytes after EOL.
        let b = hex("0402 00 01");
        assert_eq!(
            all(&b),
            vec![
                Ok(TcpOption::SackPermitted),
                Err(OptionError::BadPadding { at: 3, kind: 0 })
            ]
        );
        assert!(OptionError::BadPadding { at: 3, kind: 0 }.is_framing());
        // A truncated option of every form, at every cut.
        for block in [
            "020405a0",
            "080a0000000100000002",
            "c80a20010db800000001",
            "c90a021f900a00000100",
            "fd060348c633",
            "fe081f90c0000201",
        ] {
            let b = hex(block);
            for n in 1..b.len() {
                let got = all(&b[..n]);
                assert!(
                    matches!(got.last(), Some(Err(e)) if e.is_framing()),
                    "{block}[..{n}]"
                );
            }
        }
        assert!(all(&[]).is_empty());
    }
}
