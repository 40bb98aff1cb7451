//! The Internet checksum (RFC 1071) and the IPv6 pseudo-header (RFC 8200 §8.1) used by ICMPv6, UDP
//! and TCP over IPv6.

use std::net::Ipv6Addr;

/// One's-complement sum of `data` as big-endian 16-bit words (odd length padded with a zero byte),
/// folded to 16 bits, not complemented.
pub fn combine(data: &[u8], initial: u32) -> u16 {
    let mut sum = u64::from(initial);
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let v = u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        sum += (v >> 48) + ((v >> 32) & 0xffff) + ((v >> 16) & 0xffff) + (v & 0xffff);
    }
    let rest = chunks.remainder();
    let mut pairs = rest.chunks_exact(2);
    for p in &mut pairs {
        sum += u64::from(u16::from_be_bytes([p[0], p[1]]));
    }
    if let [last] = pairs.remainder() {
        sum += u64::from(*last) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The Internet checksum of `data`: complement of the one's-complement sum.
pub fn checksum(data: &[u8]) -> u16 {
    !combine(data, 0)
}

/// Unfolded sum of the IPv6 pseudo-header: source, destination, upper-layer length, next header.
pub fn pseudo_header_sum(src: Ipv6Addr, dst: Ipv6Addr, len: u32, next_header: u8) -> u32 {
    let mut sum = 0u32;
    for a in [src, dst] {
        for s in a.segments() {
            sum += u32::from(s);
        }
    }
    sum + (len >> 16) + (len & 0xffff) + u32::from(next_header)
}

/// The checksum field value for an upper-layer message `data` (with its checksum field zeroed), or,
/// over a message with the field filled in, 0 when the checksum is valid.
pub fn upper_layer_checksum(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, data: &[u8]) -> u16 {
    let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
    !combine(data, pseudo_header_sum(src, dst, len, next_header))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3: the words 0001 f203 f4f5 f6f7 sum to ddf2 (one's complement).
        assert_eq!(
            combine(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7], 0),
            0xddf2
        );
        assert_eq!(
            checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            !0xddf2
        );
    }

    #[test]
    fn odd_length_and_verification() {
        let src: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let dst: Ipv6Addr = "2001:db8::2".parse().unwrap();
        let mut msg = vec![0x80, 0, 0, 0, 0x12, 0x34, 0, 1, 0xaa, 0xbb, 0xcc];
        let c = upper_layer_checksum(src, dst, 58, &msg);
        msg[2..4].copy_from_slice(&c.to_be_bytes());
        assert_eq!(upper_layer_checksum(src, dst, 58, &msg), 0);
        let slow: u32 = msg
            .chunks(2)
            .map(|p| u32::from(p[0]) << 8 | u32::from(*p.get(1).unwrap_or(&0)))
            .sum();
        assert_eq!(combine(&msg, 0), {
            let mut s = slow;
            while s > 0xffff {
                s = (s & 0xffff) + (s >> 16);
            }
            s as u16
        });
    }
}
