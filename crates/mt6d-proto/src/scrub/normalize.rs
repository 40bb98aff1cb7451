//! Normalising what a protected host's packets say about its stack (SYN fingerprints), so that
//! the hosts behind one gateway show one passive fingerprint (p0f's `ver:ittl:olen:mss:wsize,
//! scale:olayout:quirks:pclass`) instead of one per operating system and configuration.
//!
//! Only what can be rewritten without per-flow state, and so consistently for a flow's whole
//! life, is rewritten (docs/ARCHITECTURE.md, "SYN fingerprint normalisation", argues each
//! choice against what it breaks):
//!
//! * [`normalize_ip`], every packet: the hop limit set to one value, the flow label replaced by
//!   a keyed hash of the flow's addresses, next header and ports ([`flow_label`]), the same for
//!   every packet of the flow.
//! * [`normalize_syn`], SYNs only: the timestamps option removed, so that it is never
//!   negotiated and no later segment of the flow carries one (RFC 7323 §3.2: only both SYNs
//!   carrying it enable it); the other options re-laid in Linux's layout; the SYN's window (never
//!   scaled, RFC 7323 §2.2) lowered to at most a given number of the SYN's own MSS (p0f prints
//!   it as `mss*N`). MSS clamping stays with [`super::clamp_mss`], which runs first.
//!
//! Not rewritten: the window scale value (the host's later windows are scaled by what its SYN
//! said; another value means rescaling every segment's window for the flow's life), whether
//! SACK and window scaling are offered at all (adding either changes what the host must do),
//! ECN (ECE/CWR), and the payload of a Fast Open SYN.

use super::{
    adjust, collect, commit, lay_out, ChecksumField, ScrubError, ScrubPolicy, MAX_OPTIONS,
};
use crate::wire::{Ipv6Packet, TcpPacket, IPV6_HEADER_LEN, NEXT_HEADER_TCP, TCP_CHECKSUM_OFFSET};

/// IPv6 next header of UDP: its ports are in the flow label's hash too.
const NEXT_HEADER_UDP: u8 = 17;
/// TCP header offset of the window field (RFC 9293 §3.1).
const WINDOW_OFFSET: usize = 14;

/// What [`normalize_syn`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NormalizeOutcome {
    /// Not TCP directly behind the IPv6 header: untouched.
    NotTcp {
        /// The IPv6 next header.
        next_header: u8,
    },
    /// Not a SYN: untouched.
    NotSyn,
    /// The SYN as it is now, `new_len` bytes (`buf[..new_len]`; it only ever shrinks).
    Normalized {
        /// The timestamps option was removed.
        timestamps: bool,
        /// The option block was rewritten (timestamps removed, or a layout other than the
        /// canonical one).
        relaid: bool,
        /// The window was lowered.
        window_lowered: bool,
        /// The packet's length now.
        new_len: usize,
    },
}

/// Normalises a SYN (SYN-ACK included) in place: removes its timestamps option, re-lays the
/// other options in the canonical layout (identity options the policy chose to keep stay, after
/// the standard ones; unknown ones go only under `strip_unknown`), and lowers its window to
/// `window_segments` times its MSS (1220 without an MSS option; at most 65,535). `u16::MAX`
/// segments never lowers a window. `packet` is the whole IPv6 packet (`Ipv6Packet::new_checked`). Errors as
/// [`super::strip`]: a framing error or a malformed option leaves the packet untouched.
pub fn normalize_syn(
    packet: &mut [u8],
    policy: &ScrubPolicy,
    window_segments: u16,
    csum: ChecksumField,
) -> Result<NormalizeOutcome, ScrubError> {
    let ip = Ipv6Packet::new_checked(&*packet)?;
    if ip.next_header() != NEXT_HEADER_TCP {
        return Ok(NormalizeOutcome::NotTcp {
            next_header: ip.next_header(),
        });
    }
    let total = IPV6_HEADER_LEN + ip.payload().len();
    let tcp = TcpPacket::new_checked(ip.payload())?;
    if !tcp.syn() {
        return Ok(NormalizeOutcome::NotSyn);
    }
    let hl = tcp.header_len();
    let block = tcp.options();
    let (mut kept, _) = collect(block, policy, true)?;
    let timestamps = kept.ts.take().is_some();
    // RFC 9293 §3.7.1: without the option the peer assumes the IPv6 minimum's 1220.
    let mss = kept.mss.map_or(1220, |m| u16::from_be_bytes([m[2], m[3]]));
    let max_window = (u32::from(mss) * u32::from(window_segments)).min(65_535) as u16;
    let mut new_block = [0u8; MAX_OPTIONS];
    let new_blen = lay_out(&kept, block, &[], &mut new_block, block.len());
    // Never longer than the block it came from (packed if the aligned layout does not fit).
    if new_blen > block.len() {
        return Err(ScrubError::Wire(crate::wire::WireError::Malformed {
            what: "TCP",
            field: "options",
        }));
    }
    let relaid = new_block[..new_blen] != *block;
    let new_len = if relaid {
        commit(packet, total, hl, &new_block[..new_blen], csum)
    } else {
        total
    };
    let t = IPV6_HEADER_LEN + WINDOW_OFFSET;
    let window = u16::from_be_bytes([packet[t], packet[t + 1]]);
    let window_lowered = window > max_window;
    if window_lowered {
        packet[t..t + 2].copy_from_slice(&max_window.to_be_bytes());
        // A partial checksum is completed over the header by the device: nothing to update.
        if csum == ChecksumField::Complete {
            let c = IPV6_HEADER_LEN + TCP_CHECKSUM_OFFSET;
            let field = u16::from_be_bytes([packet[c], packet[c + 1]]);
            let field = !adjust(!field, &[window], &[max_window]);
            packet[c..c + 2].copy_from_slice(&field.to_be_bytes());
        }
    }
    Ok(NormalizeOutcome::Normalized {
        timestamps,
        relaid,
        window_lowered,
        new_len,
    })
}

/// Sets the hop limit of an IPv6 packet to `hop_limit` and its flow label to [`flow_label`]
/// (the traffic class is kept). Neither is covered by an upper-layer checksum (RFC 8200 §8.1's
/// pseudo-header has neither). A buffer shorter than an IPv6 header, or not version 6, is left
/// alone.
pub fn normalize_ip(packet: &mut [u8], hop_limit: u8, key: &[u64; 2]) {
    let Some(label) = flow_label(packet, key) else {
        return;
    };
    packet[1] = (packet[1] & 0xf0) | (label >> 16) as u8;
    packet[2] = (label >> 8) as u8;
    packet[3] = label as u8;
    packet[7] = hop_limit;
}

/// The flow label a normalised packet carries: a keyed hash of its source and destination
/// addresses, next header and (TCP and UDP) ports, never 0 (RFC 6437: 0 means unlabelled), so
/// every packet of a flow has the same one and it says nothing of the host's stack (its
/// inputs are all in the header already). The key keeps outsiders from predicting labels
/// (RFC 6437 §6); the mix is a 128-bit multiply per word, not a MAC. `None` for a buffer
/// shorter than an IPv6 header or not version 6.
pub fn flow_label(packet: &[u8], key: &[u64; 2]) -> Option<u32> {
    let head = packet.get(..IPV6_HEADER_LEN)?;
    if head[0] >> 4 != 6 {
        return None;
    }
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&head[at..at + 8]);
        u64::from_be_bytes(w)
    };
    let next = head[6];
    let ports = match (next, packet.get(IPV6_HEADER_LEN..IPV6_HEADER_LEN + 4)) {
        (NEXT_HEADER_TCP | NEXT_HEADER_UDP, Some(p)) => {
            u64::from(u32::from_be_bytes([p[0], p[1], p[2], p[3]]))
        }
        _ => 0,
    };
    let mix = |a: u64, b: u64| {
        let m = u128::from(a) * u128::from(b);
        (m as u64) ^ ((m >> 64) as u64)
    };
    let mut h = key[0];
    for w in [
        word(8),
        word(16),
        word(24),
        word(32),
        ports << 8 | u64::from(next),
    ] {
        h = mix(h ^ w ^ key[1], (0x9e37_79b9_7f4a_7c15 ^ key[0]) | 1);
    }
    let label = ((h ^ (h >> 32)) & 0xf_ffff) as u32;
    Some(if label == 0 { 1 } else { label })
}
