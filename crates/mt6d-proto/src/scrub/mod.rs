//! Identity scrubbing and MSS clamping of TCP segments a gateway forwards (after seed 004).
//!
//! Owns the rewriting of one IPv6+TCP packet in the caller's buffer: removing the options that
//! name a host behind the sender (004's HOST_ID forms, RFC 7974's HOST_ID, TOA) and lowering the
//! MSS of SYNs to what the tunnel carries. It does not decide which packets to scrub, count drops
//! or log: that is the daemon's policy. Every function leaves the packet byte for byte untouched
//! when it returns an error, and never indexes outside the buffer.
//!
//! Why a canonical re-layout rather than NOPs: 004 §8.3's iptables `TCPOPTSTRIP` overwrites a
//! stripped option with NOPs, leaving a `nop,nop,nop,nop` hole that passive fingerprinting (p0f's
//! option layout signature) reads as "something was removed here". [`strip`] instead rewrites the
//! kept options in the order and alignment Linux's `tcp_options_write` uses (the most common
//! layout on the Internet), shrinking the header when the block gets shorter.
//!
//! Checksums ([`ChecksumField`]): a packet from a TUN device with virtio-net offloads may carry
//! `VIRTIO_NET_HDR_F_NEEDS_CSUM` (the kernel's `CHECKSUM_PARTIAL`): its TCP checksum field then
//! holds the folded, uncomplemented sum of the IPv6 pseudo-header, and the device (or the kernel
//! when segmenting) sums the segment from `csum_start` on top of it. The caller says which.
//!
//! GSO/GRO super-packets (`gso_type` TCPV6): one TCP header stands for every segment, so scrubbing
//! its header scrubs them all; only the header moves, the payload slides down by the bytes the
//! header lost, and `gso_size` (payload bytes per segment) is unchanged. The caller must lower the
//! virtio-net header's `hdr_len` by [`StripOutcome::Stripped::removed`] (csum_start and
//! csum_offset do not change: the IPv6 header is untouched). Super-packets above 64 KiB
//! (BIG TCP jumbograms, payload length 0) fail [`crate::wire::Ipv6Packet::new_checked`] and are
//! left alone with an error.

mod hostid;
mod normalize;
mod options;

pub use hostid::{
    build_option, evaluate, identity_value, Evaluation, HostIdForm, HostIdRule, InjectData,
    InjectForm, RuleAction, MAX_RULES, REPORTED,
};
pub use normalize::{flow_label, normalize_ip, normalize_syn, NormalizeOutcome};
pub use options::{
    kind, Boucadair, BoucadairData, HostIdKinds, Located, OptionError, TcpOption, TcpOptions,
    HOST_ID_EXID, TOA_LEN,
};

use crate::wire::{
    combine, Ipv6Packet, TcpPacket, WireError, IPV6_HEADER_LEN, NEXT_HEADER_TCP,
    TCP_CHECKSUM_OFFSET, TCP_HEADER_LEN,
};

/// Largest TCP option block (data offset 15).
const MAX_OPTIONS: usize = 40;

/// What the TCP checksum field of the packet holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChecksumField {
    /// The complete checksum (a packet as it is on the wire): updated incrementally (RFC 1624
    /// eqn. 3), so a segment that arrived with a wrong checksum still has a wrong one.
    Complete,
    /// `CHECKSUM_PARTIAL`: the folded pseudo-header sum, to be completed by the device. The
    /// kernel includes the TCP length for a single segment (`tcp_v6_send_check`) and leaves it out
    /// (length 0) for a GSO super-packet (`tcp_v6_gso_csum_prep`); `includes_length` says which.
    Partial {
        /// True if the sum includes the TCP length (updated when the header shrinks).
        includes_length: bool,
    },
}

/// What to remove besides the identity options, which [`strip`] always removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ScrubPolicy {
    /// The kinds this deployment's HOST_ID injectors use for 004's forms (check them with
    /// [`HostIdKinds::conflict`] when reading the configuration).
    pub host_id_kinds: HostIdKinds,
    /// Also remove options of unknown kind and other RFC 6994 experiments. Off by default: TCP
    /// MD5 (kind 19) and TCP-AO (29) connections die without theirs, and MPTCP (30) / TFO (34)
    /// only fall back.
    pub strip_unknown: bool,
}

/// What [`strip`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StripOutcome {
    /// Not a TCP packet directly behind the fixed IPv6 header (extension headers are not walked):
    /// untouched.
    NotTcp {
        /// The IPv6 next header.
        next_header: u8,
    },
    /// Nothing to remove: untouched (the fast path, no write at all).
    Unchanged,
    /// Options removed and the rest re-laid. The packet is now `new_len` bytes (`buf[..new_len]`;
    /// the IPv6 payload length says the same); bytes after it are stale.
    Stripped {
        /// Options removed.
        options: u8,
        /// Header bytes removed (0, 4, ..., 40): how much the packet shrank.
        removed: usize,
        /// The packet's length now.
        new_len: usize,
    },
}

/// What [`clamp_mss`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClampOutcome {
    /// Not TCP directly behind the IPv6 header: untouched.
    NotTcp {
        /// The IPv6 next header.
        next_header: u8,
    },
    /// Not a SYN: the MSS option only means something there (RFC 9293 §3.7.1).
    NotSyn,
    /// A SYN without an MSS option: the peer assumes 1220 over IPv6 (RFC 9293 §3.7.1, RFC 8200
    /// §5 minimum MTU). Untouched: there is no room to add one without moving the payload.
    NoMss,
    /// The MSS was already at most the limit.
    Unchanged(u16),
    /// The MSS was lowered.
    Clamped {
        /// Value the sender offered.
        from: u16,
        /// Value written.
        to: u16,
    },
}

/// Why a packet could not be scrubbed. The packet is untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScrubError {
    /// The IPv6 header or the TCP header is malformed or truncated.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The option block cannot be read, or an option that would be kept is malformed.
    #[error(transparent)]
    Option(#[from] OptionError),
}

/// The MSS a SYN should carry so that a full segment fits `mtu` bytes of inner IPv6 packet
/// (the tunnel's inner MTU): `mtu - 40 - 20`, at least IPv6's 1220.
pub fn mss_for_mtu(mtu: u16) -> u16 {
    mtu.saturating_sub((IPV6_HEADER_LEN + TCP_HEADER_LEN) as u16)
        .max(1220)
}

/// The kept options of a block, each at most once (a later duplicate replaces an earlier one,
/// as Linux's `tcp_parse_options` does), and unknown kept options by position.
#[derive(Default)]
struct Kept {
    mss: Option<[u8; 4]>,
    ws: Option<[u8; 3]>,
    sack_permitted: bool,
    ts: Option<[u8; 10]>,
    sack: Option<(usize, usize)>,
    /// (offset, length) of kept options of other kinds, in block order.
    other: [(u8, u8); MAX_OPTIONS / 2],
    others: usize,
}

/// Removes every identity option (HOST_ID in all forms, TOA; and unknown ones if the policy says
/// so) from an IPv6 packet carrying TCP, re-lays the other options in Linux's canonical layout,
/// shrinks the header and the IPv6 payload length if the block got shorter, and fixes the
/// checksum as `csum` says. The packet is `packet` exactly (`Ipv6Packet::new_checked`).
///
/// An option that would be removed may be malformed in content (a BOUCADAIR with bad padding):
/// it is removed. A framing error (the block cannot be read) or a malformed kept option is an
/// error, and the packet is untouched: the caller drops it (an unreadable block may hide an
/// identity option).
pub fn strip(
    packet: &mut [u8],
    policy: &ScrubPolicy,
    csum: ChecksumField,
) -> Result<StripOutcome, ScrubError> {
    let ip = Ipv6Packet::new_checked(&*packet)?;
    if ip.next_header() != NEXT_HEADER_TCP {
        return Ok(StripOutcome::NotTcp {
            next_header: ip.next_header(),
        });
    }
    // The IPv6 payload length decides where the packet ends (checked against the buffer).
    let total = IPV6_HEADER_LEN + ip.payload().len();
    let tcp = TcpPacket::new_checked(ip.payload())?;
    let hl = tcp.header_len();
    if hl == TCP_HEADER_LEN {
        return Ok(StripOutcome::Unchanged);
    }
    let block = tcp.options();
    if is_clean(block, policy) {
        return Ok(StripOutcome::Unchanged);
    }
    let (kept, removed_opts) = collect(block, policy, false)?;
    if removed_opts == 0 {
        return Ok(StripOutcome::Unchanged);
    }
    let mut new_block = [0u8; MAX_OPTIONS];
    let new_len = lay_out(&kept, block, &[], &mut new_block, block.len());
    // The packed layout is never longer than the options it keeps; checked rather than trusted.
    let Some(removed) = block.len().checked_sub(new_len) else {
        return Err(ScrubError::Wire(WireError::Malformed {
            what: "TCP",
            field: "options",
        }));
    };
    let new_total = commit(packet, total, hl, &new_block[..new_len], csum);
    Ok(StripOutcome::Stripped {
        options: removed_opts,
        removed,
        new_len: new_total,
    })
}

/// What [`inject`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InjectOutcome {
    /// Not TCP directly behind the IPv6 header: untouched.
    NotTcp {
        /// The IPv6 next header.
        next_header: u8,
    },
    /// The option is in; the packet is now `new_len` bytes (`buf[..new_len]`).
    Injected {
        /// Identity options the segment already carried, replaced by the injected one.
        replaced: u8,
        /// The packet's length now.
        new_len: usize,
    },
    /// The kept options and the new one do not fit 40 bytes, or the packet would not fit the
    /// buffer or `max_len`: untouched.
    NoRoom,
}

/// Adds the identity option `option` (built by [`build_option`]) to the TCP segment in
/// `buf[..len]`, replacing any identity option it carries (004 §7.2: the AFTR injects its
/// option and removes the host's), re-laid in the canonical layout with the new option after
/// the standard ones. The header grows by a multiple of 4 and the payload moves up; the result
/// must fit `max_len` (the inner MTU) and the buffer. Which segments get an option (SYNs, or
/// the ACK of 004 §3.2.2's ACK mode) is the caller's decision. Errors as [`strip`]; on error
/// or [`InjectOutcome::NoRoom`] the packet is untouched.
pub fn inject(
    buf: &mut [u8],
    len: usize,
    max_len: usize,
    option: &[u8],
    policy: &ScrubPolicy,
    csum: ChecksumField,
) -> Result<InjectOutcome, ScrubError> {
    let Some(packet) = buf.get(..len) else {
        return Err(ScrubError::Wire(WireError::Truncated {
            what: "IPv6",
            have: buf.len(),
            need: len,
        }));
    };
    let ip = Ipv6Packet::new_checked(packet)?;
    if ip.next_header() != NEXT_HEADER_TCP {
        return Ok(InjectOutcome::NotTcp {
            next_header: ip.next_header(),
        });
    }
    let tcp = TcpPacket::new_checked(ip.payload())?;
    let hl = tcp.header_len();
    let block = tcp.options();
    let (kept, replaced) = collect(block, policy, false)?;
    if room_for(&kept, option.len(), false) > MAX_OPTIONS {
        return Ok(InjectOutcome::NoRoom);
    }
    let mut new_block = [0u8; MAX_OPTIONS];
    let new_blen = lay_out(&kept, block, option, &mut new_block, MAX_OPTIONS);
    let total = IPV6_HEADER_LEN + tcp.into_inner().len();
    let new_total = total + new_blen - hl + TCP_HEADER_LEN;
    if new_total > buf.len().min(max_len) {
        return Ok(InjectOutcome::NoRoom);
    }
    let new_total = commit(buf, total, hl, &new_block[..new_blen], csum);
    Ok(InjectOutcome::Injected {
        replaced,
        new_len: new_total,
    })
}

/// The options of `block` that stay, and how many identity options (also malformed ones, and
/// unknown ones if the policy says so) go; with `keep_identity`, well-formed identity options
/// stay too (after the standard ones, as unknown kept ones do). A framing error, or a malformed
/// option that would stay, is an error.
fn collect(
    block: &[u8],
    policy: &ScrubPolicy,
    keep_identity: bool,
) -> Result<(Kept, u8), ScrubError> {
    let mut kept = Kept::default();
    let mut removed_opts = 0u8;
    for item in TcpOptions::new(block, policy.host_id_kinds) {
        let o = match item {
            Ok(o) => o,
            Err(e) if !keep_identity && !e.is_framing() && removable_kind(e.kind(), policy) => {
                removed_opts += 1;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if o.option.is_identity() && !keep_identity {
            removed_opts += 1;
            continue;
        }
        match o.option {
            TcpOption::Eol | TcpOption::Nop => {}
            TcpOption::Mss(_) => kept.mss = o.raw.try_into().ok(),
            TcpOption::WindowScale(_) => kept.ws = o.raw.try_into().ok(),
            TcpOption::SackPermitted => kept.sack_permitted = true,
            TcpOption::Timestamps { .. } => kept.ts = o.raw.try_into().ok(),
            TcpOption::Sack(_) => kept.sack = Some((o.at, o.raw.len())),
            _ if policy.strip_unknown && !o.option.is_identity() => removed_opts += 1,
            _ => {
                // At most 20 options of >= 2 bytes fit in 40 bytes: `others` stays in bounds.
                if let Some(slot) = kept.other.get_mut(kept.others) {
                    *slot = (o.at as u8, o.raw.len() as u8);
                    kept.others += 1;
                }
            }
        }
    }
    Ok((kept, removed_opts))
}

/// Replaces the TCP header's option block of the packet in `buf[..total]` (header length `hl`)
/// with `new_block` (a multiple of 4, at most 40 bytes, and the packet must fit `buf` after),
/// moving the payload, and fixes the data offset, the IPv6 payload length and the checksum as
/// `csum` says. Returns the packet's new length.
///
/// Checksums from sums of what changes: the header (checksum field left out) and the TCP length
/// of the pseudo-header. The payload moves by a multiple of 4 bytes, so its 16-bit words, and
/// their sum, are unchanged.
fn commit(buf: &mut [u8], total: usize, hl: usize, new_block: &[u8], csum: ChecksumField) -> usize {
    let t = IPV6_HEADER_LEN;
    let seg_len = total - t;
    let old_sum = header_sum(&buf[t..t + hl]);
    let new_hl = TCP_HEADER_LEN + new_block.len();
    let new_seg_len = seg_len + new_hl - hl;
    if new_hl != hl {
        // The new block is in its own array: the old one may be overwritten by the move.
        buf.copy_within(t + hl..total, t + new_hl);
        buf[t + 12] = (buf[t + 12] & 0x0f) | (((new_hl / 4) as u8) << 4);
        // The caller checked that the new length fits (<= the old one, or <= the MTU).
        buf[4..6].copy_from_slice(&(new_seg_len as u16).to_be_bytes());
    }
    buf[t + TCP_HEADER_LEN..t + new_hl].copy_from_slice(new_block);
    let new_sum = header_sum(&buf[t..t + new_hl]);
    let at = t + TCP_CHECKSUM_OFFSET;
    let field = u16::from_be_bytes([buf[at], buf[at + 1]]);
    let field = match csum {
        ChecksumField::Complete => !adjust(
            !field,
            &[old_sum, seg_len as u16],
            &[new_sum, new_seg_len as u16],
        ),
        ChecksumField::Partial {
            includes_length: true,
        } => adjust(field, &[seg_len as u16], &[new_seg_len as u16]),
        ChecksumField::Partial {
            includes_length: false,
        } => field,
    };
    buf[at..at + 2].copy_from_slice(&field.to_be_bytes());
    t + new_seg_len
}

/// True if the option block has anything [`strip`] would remove, or anything malformed: an
/// identity option (of a configured kind, or on 253/254), an unknown one under `strip_unknown`,
/// or a framing or length error. False is the byte walk that most segments (no options, or
/// Linux's timestamps) end with; only true needs the classifying walk.
pub fn needs_policy(block: &[u8], policy: &ScrubPolicy) -> bool {
    !is_clean(block, policy)
}

/// The fast path of [`strip`]: true if the classifying walk would find nothing to remove and no
/// error (every option well framed, of a kind that is kept, with the length its kind requires),
/// checked on kind and length bytes alone. False sends the block to the classifying walk.
fn is_clean(block: &[u8], policy: &ScrubPolicy) -> bool {
    let mut i = 0;
    while let Some(&k) = block.get(i) {
        // Configured 004 kinds first: the classifier reads them before the standard meanings.
        if removable_kind(k, policy) {
            return false;
        }
        let ok_len = match k {
            kind::EOL => return block[i + 1..].iter().all(|&b| b == 0),
            kind::NOP => {
                i += 1;
                continue;
            }
            kind::MSS => |l: usize| l == 4,
            kind::WINDOW_SCALE => |l: usize| l == 3,
            kind::SACK_PERMITTED => |l: usize| l == 2,
            kind::SACK => |l: usize| (10..=34).contains(&l) && (l - 2) % 8 == 0,
            kind::TIMESTAMPS => |l: usize| l == 10,
            _ if policy.strip_unknown => return false,
            _ => |l: usize| l >= 2,
        };
        let Some(&len) = block.get(i + 1) else {
            return false;
        };
        let len = usize::from(len);
        if !ok_len(len) || i + len > block.len() {
            return false;
        }
        i += len;
    }
    true
}

/// True if a malformed option of this kind would have been removed anyway.
fn removable_kind(k: u8, policy: &ScrubPolicy) -> bool {
    let h = policy.host_id_kinds;
    k == kind::EXPERIMENT_1
        || k == kind::EXPERIMENT_2
        || Some(k) == h.wing
        || Some(k) == h.boucadair
        || Some(k) == h.enabled
}

/// Writes the kept options into `out` in Linux's `tcp_options_write` layout (MSS; SACK-permitted
/// and timestamps as `sackOK,ts` or `nop,nop,ts`, or `nop,nop,sackOK` without timestamps;
/// `nop,ws`; `nop,nop,sack`), then other kept options, then `extra` (an injected option), then EOL and zeros to a multiple of 4. If that does
/// not fit in `room` (the old block's length), packs them without NOPs in the same order: never
/// longer than the kept options were. Returns the block length.
fn lay_out(
    kept: &Kept,
    block: &[u8],
    extra: &[u8],
    out: &mut [u8; MAX_OPTIONS],
    room: usize,
) -> usize {
    let mut w = Writer { out, n: 0 };
    let aligned = room_for(kept, extra.len(), true) <= room;
    if let Some(m) = kept.mss {
        w.put(&m);
    }
    if let Some(ts) = kept.ts {
        if kept.sack_permitted {
            w.put(&[kind::SACK_PERMITTED, 2]);
        } else if aligned {
            w.put(&[kind::NOP, kind::NOP]);
        }
        w.put(&ts);
    } else if kept.sack_permitted {
        // Linux puts SACK-permitted without timestamps before the window scale
        // (`mss,nop,nop,sok,nop,ws`, p0f's "Linux, timestamps off").
        if aligned {
            w.put(&[kind::NOP, kind::NOP]);
        }
        w.put(&[kind::SACK_PERMITTED, 2]);
    }
    if let Some(ws) = kept.ws {
        if aligned {
            w.put(&[kind::NOP]);
        }
        w.put(&ws);
    }
    if let Some((at, len)) = kept.sack {
        if aligned {
            w.put(&[kind::NOP, kind::NOP]);
        }
        w.put(block.get(at..at + len).unwrap_or_default());
    }
    for &(at, len) in &kept.other[..kept.others] {
        let (at, len) = (usize::from(at), usize::from(len));
        w.put(block.get(at..at + len).unwrap_or_default());
    }
    w.put(extra);
    // EOL then zero padding (RFC 9293 §3.1); `out` starts zeroed.
    w.n.div_ceil(4) * 4
}

/// Bytes `lay_out` writes (with `extra` bytes of injected option), rounded up to 4.
fn room_for(kept: &Kept, extra: usize, aligned: bool) -> usize {
    let (nop1, nop2) = if aligned { (1, 2) } else { (0, 0) };
    let mut n = kept.mss.map_or(0, |_| 4);
    n += match (kept.ts.is_some(), kept.sack_permitted) {
        (true, true) => 12,
        (true, false) => 10 + nop2,
        (false, true) => 2 + nop2,
        (false, false) => 0,
    };
    n += kept.ws.map_or(0, |_| 3 + nop1);
    n += kept.sack.map_or(0, |(_, l)| l + nop2);
    n += kept.other[..kept.others]
        .iter()
        .map(|&(_, l)| usize::from(l))
        .sum::<usize>();
    n += extra;
    n.div_ceil(4) * 4
}

struct Writer<'a> {
    out: &'a mut [u8; MAX_OPTIONS],
    n: usize,
}

impl Writer<'_> {
    /// Appends `b`; silently stops at 40 bytes (unreachable: `lay_out` checks the room first and
    /// the packed layout is never longer than the options it came from).
    fn put(&mut self, b: &[u8]) {
        if let Some(dst) = self.out.get_mut(self.n..self.n + b.len()) {
            dst.copy_from_slice(b);
            self.n += b.len();
        }
    }
}

/// Folded one's-complement sum of a TCP header with its checksum field left out.
fn header_sum(h: &[u8]) -> u16 {
    let s = combine(&h[..TCP_CHECKSUM_OFFSET], 0);
    combine(&h[TCP_CHECKSUM_OFFSET + 2..], u32::from(s))
}

/// RFC 1624 eqn. 3 over sums: `sum - old + new` in one's complement, as `sum + ~old + new`.
fn adjust(sum: u16, old: &[u16], new: &[u16]) -> u16 {
    let mut s = u32::from(sum);
    for &o in old {
        s += u32::from(!o);
    }
    for &n in new {
        s += u32::from(n);
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// Lowers the MSS option of a SYN (SYN-ACK included) in an IPv6 packet to `max_mss` if it offers
/// more, fixing the checksum as `csum` says (for `Partial` the field needs no change: the
/// device sums the options). Options are read with `kinds` so that 004's forms are skipped
/// correctly; a framing error is an error and the packet is untouched.
pub fn clamp_mss(
    packet: &mut [u8],
    max_mss: u16,
    kinds: HostIdKinds,
    csum: ChecksumField,
) -> Result<ClampOutcome, ScrubError> {
    let ip = Ipv6Packet::new_checked(&*packet)?;
    if ip.next_header() != NEXT_HEADER_TCP {
        return Ok(ClampOutcome::NotTcp {
            next_header: ip.next_header(),
        });
    }
    let tcp = TcpPacket::new_checked(ip.payload())?;
    if !tcp.syn() {
        return Ok(ClampOutcome::NotSyn);
    }
    let mut found = None;
    for item in TcpOptions::new(tcp.options(), kinds) {
        match item {
            Ok(Located {
                at,
                option: TcpOption::Mss(v),
                ..
            }) => found = Some((at, v)),
            Ok(_) => {}
            Err(e) if e.is_framing() => return Err(e.into()),
            Err(_) => {}
        }
    }
    let Some((at, from)) = found else {
        return Ok(ClampOutcome::NoMss);
    };
    if from <= max_mss {
        return Ok(ClampOutcome::Unchanged(from));
    }
    // The value sits at TCP offset 22 + at, maybe odd: update the checksum over the aligned
    // words that cover it.
    let t = IPV6_HEADER_LEN;
    let v = TCP_HEADER_LEN + at + 2;
    let (lo, hi) = (v & !1, (v + 2).div_ceil(2) * 2);
    let old = combine(&packet[t + lo..t + hi], 0);
    packet[t + v..t + v + 2].copy_from_slice(&max_mss.to_be_bytes());
    let new = combine(&packet[t + lo..t + hi], 0);
    if csum == ChecksumField::Complete {
        let c = t + TCP_CHECKSUM_OFFSET;
        let field = u16::from_be_bytes([packet[c], packet[c + 1]]);
        packet[c..c + 2].copy_from_slice(&(!adjust(!field, &[old], &[new])).to_be_bytes());
    }
    Ok(ClampOutcome::Clamped { from, to: max_mss })
}

#[cfg(test)]
mod tests;
