//! Reserved IPv6 interface identifiers (RFC 5453 §3, as updated by the IANA "Reserved IPv6 Interface
//! Identifiers" registry). A hashed address must never use one of these.

/// True if `iid` (the low 64 bits of an address, big-endian) is reserved:
/// - `0000:0000:0000:0000`: Subnet-Router Anycast (RFC 4291);
/// - `0200:5EFF:FE00:0000`..=`0200:5EFF:FEFF:FFFF`: Reserved IPv6 IIDs corresponding to the IANA
///   Ethernet block, covering `..5212` (reserved), `..5213` (Proxy Mobile IPv6, RFC 6543) and
///   `..5214`..`FEFF:FFFF` (reserved);
/// - `FDFF:FFFF:FFFF:FF80`..=`FDFF:FFFF:FFFF:FFFF`: Reserved Subnet Anycast (RFC 2526).
pub fn is_reserved_iid(iid: [u8; 8]) -> bool {
    let v = u64::from_be_bytes(iid);
    v == 0
        || (0x0200_5EFF_FE00_0000..=0x0200_5EFF_FEFF_FFFF).contains(&v)
        || (0xFDFF_FFFF_FFFF_FF80..=0xFDFF_FFFF_FFFF_FFFF).contains(&v)
}

/// Deterministic never-reserved fallback for the (probability < 2^-10000) case that every attempt
/// byte produced a reserved or colliding IID: flip the lowest bit of the first byte. That moves each
/// reserved range out of itself (0x00->0x01, 0x02->0x03, 0xFD->0xFC).
pub(crate) fn unreserve(mut iid: [u8; 8]) -> [u8; 8] {
    if is_reserved_iid(iid) {
        iid[0] ^= 0x01;
    }
    iid
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iid(v: u64) -> [u8; 8] {
        v.to_be_bytes()
    }

    #[test]
    fn boundaries() {
        assert!(is_reserved_iid(iid(0)));
        assert!(!is_reserved_iid(iid(1)));
        assert!(!is_reserved_iid(iid(0x0200_5EFF_FDFF_FFFF)));
        assert!(is_reserved_iid(iid(0x0200_5EFF_FE00_0000)));
        assert!(is_reserved_iid(iid(0x0200_5EFF_FE00_5212)));
        assert!(is_reserved_iid(iid(0x0200_5EFF_FE00_5213)));
        assert!(is_reserved_iid(iid(0x0200_5EFF_FE00_5214)));
        assert!(is_reserved_iid(iid(0x0200_5EFF_FEFF_FFFF)));
        assert!(!is_reserved_iid(iid(0x0200_5EFF_FF00_0000)));
        assert!(!is_reserved_iid(iid(0xFDFF_FFFF_FFFF_FF7F)));
        assert!(is_reserved_iid(iid(0xFDFF_FFFF_FFFF_FF80)));
        assert!(is_reserved_iid(iid(0xFDFF_FFFF_FFFF_FFFF)));
        assert!(!is_reserved_iid(iid(0xFE00_0000_0000_0000)));
    }

    #[test]
    fn unreserve_leaves_ranges() {
        for v in [
            0,
            0x0200_5EFF_FE00_5213,
            0xFDFF_FFFF_FFFF_FFFF,
            0xFDFF_FFFF_FFFF_FF80,
        ] {
            assert!(!is_reserved_iid(unreserve(iid(v))));
        }
        assert_eq!(unreserve(iid(42)), iid(42));
    }
}
