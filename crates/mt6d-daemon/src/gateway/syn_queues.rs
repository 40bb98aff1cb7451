//! A TCP SYN-ACK is written into the TUN queue its SYN was read from.
//!
//! The device sends a flow's packets to the queue that last wrote a packet of that flow, and
//! before any was written, to a queue chosen by hash (`tun_automq_select_queue`;
//! docs/ARCHITECTURE.md "Workers"). The kernel records the writer only *after* the written
//! packet went through the stack, and a protected host answers a SYN-ACK inside that write:
//! its ACK still goes to the hash's queue, where the SYN was read, while its first data
//! segment, a moment later, goes to the queue the SYN-ACK was written into. When those differ,
//! two workers carry the flow's first two segments at once and may send them in either order
//! (a HOST_ID in ACK mode, 004 §3.2.2, then reaches the server after the data instead of in the
//! first ACK). Written into the SYN's queue, the SYN-ACK leaves the ACK and the data on one
//! queue, one worker, in order.
//!
//! A direct-mapped table of 256 flows, written only for SYNs and read only for SYN-ACKs: a
//! collision loses one placement (the SYN-ACK goes to the worker's usual queue, as before),
//! never moves another flow's packet (the whole key must match).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use mt6d_proto::wire::{IPV6_DST_ADDR, IPV6_SRC_ADDR};

const SLOTS: usize = 256;
/// The low byte of a slot holds the queue; bit 8 is set in every key (0 is a free slot).
const QUEUE_BITS: u64 = 0xff;

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;

/// Which queue each recent SYN was read from.
#[derive(Debug)]
pub struct SynQueues {
    slots: Box<[AtomicU64]>,
}

impl Default for SynQueues {
    fn default() -> Self {
        SynQueues::new()
    }
}

/// The TCP flags of an IPv6 packet whose next header is TCP (no extension headers), if it is
/// long enough to hold them.
fn tcp_flags(packet: &[u8]) -> Option<u8> {
    if packet.len() < 54 || packet[0] >> 4 != 6 || packet[6] != 6 {
        return None;
    }
    Some(packet[53])
}

/// The flow key of (host, host port, remote, remote port), with the queue byte clear and bit 8
/// set. FNV-1a: the key only picks a slot of a small table the whole key must match.
fn key(host: &[u8], host_port: &[u8], remote: &[u8], remote_port: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in host
        .iter()
        .chain(host_port)
        .chain(remote)
        .chain(remote_port)
    {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    (h & !QUEUE_BITS) | 0x100
}

impl SynQueues {
    pub fn new() -> SynQueues {
        SynQueues {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn slot(&self, key: u64) -> &AtomicU64 {
        &self.slots[(key >> 9) as usize % SLOTS]
    }

    /// `packet`, from the protected side, was read from `queue`: a SYN (not a SYN-ACK) records
    /// its flow. Anything else costs four byte reads.
    #[inline]
    pub fn note_read(&self, packet: &[u8], queue: usize) {
        if tcp_flags(packet).is_some_and(|f| f & (SYN | ACK) == SYN) {
            let k = key(
                &packet[IPV6_SRC_ADDR],
                &packet[40..42],
                &packet[IPV6_DST_ADDR],
                &packet[42..44],
            );
            let queue = u64::try_from(queue).unwrap_or(QUEUE_BITS) & QUEUE_BITS;
            self.slot(k).store(k | queue, Relaxed);
        }
    }

    /// `packet`, to the protected side, is about to be written: if it is a SYN-ACK answering a
    /// SYN recorded here, the queue that SYN was read from (once: the record is cleared).
    #[inline]
    pub fn queue_for(&self, packet: &[u8]) -> Option<usize> {
        if tcp_flags(packet).is_none_or(|f| f & (SYN | ACK) != SYN | ACK) {
            return None;
        }
        // The SYN-ACK goes remote -> host: the host's side is its destination.
        let k = key(
            &packet[IPV6_DST_ADDR],
            &packet[42..44],
            &packet[IPV6_SRC_ADDR],
            &packet[40..42],
        );
        let slot = self.slot(k);
        let v = slot.load(Relaxed);
        if v & !QUEUE_BITS != k {
            return None;
        }
        // Another SYN may have taken the slot since: then that one stays.
        slot.compare_exchange(v, 0, Relaxed, Relaxed).ok()?;
        usize::try_from(v & QUEUE_BITS).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP segment between [2001:db8::a]:`sport` and [2001:db8::b]:`dport` with `flags`.
    fn segment(from_a: bool, sport: u16, dport: u16, flags: u8) -> Vec<u8> {
        let mut p = vec![0u8; 60];
        p[0] = 0x60;
        p[6] = 6;
        let a: std::net::Ipv6Addr = "2001:db8::a".parse().expect("literal");
        let b: std::net::Ipv6Addr = "2001:db8::b".parse().expect("literal");
        let (src, dst) = if from_a { (a, b) } else { (b, a) };
        p[8..24].copy_from_slice(&src.octets());
        p[24..40].copy_from_slice(&dst.octets());
        p[40..42].copy_from_slice(&sport.to_be_bytes());
        p[42..44].copy_from_slice(&dport.to_be_bytes());
        p[53] = flags;
        p
    }

    #[test]
    fn a_syn_ack_finds_the_queue_of_its_syn_once() {
        let q = SynQueues::new();
        q.note_read(&segment(true, 40000, 80, SYN), 3);
        assert_eq!(q.queue_for(&segment(false, 80, 40000, SYN | ACK)), Some(3));
        // A retransmitted SYN-ACK goes where the worker writes anyway.
        assert_eq!(q.queue_for(&segment(false, 80, 40000, SYN | ACK)), None);
    }

    #[test]
    fn only_a_syn_records_and_only_its_own_syn_ack_finds_it() {
        let q = SynQueues::new();
        // Neither an ACK nor a SYN-ACK from the protected side records anything.
        q.note_read(&segment(true, 40001, 80, ACK), 1);
        q.note_read(&segment(true, 40001, 80, SYN | ACK), 1);
        assert_eq!(q.queue_for(&segment(false, 80, 40001, SYN | ACK)), None);
        q.note_read(&segment(true, 40002, 80, SYN), 1);
        // Another flow's SYN-ACK, a segment of the flow that is not a SYN-ACK, and one of the
        // same ports in the wrong direction find nothing.
        assert_eq!(q.queue_for(&segment(false, 80, 40003, SYN | ACK)), None);
        assert_eq!(q.queue_for(&segment(false, 80, 40002, ACK)), None);
        assert_eq!(q.queue_for(&segment(true, 40002, 80, SYN | ACK)), None);
        assert_eq!(q.queue_for(&segment(false, 80, 40002, SYN | ACK)), Some(1));
    }

    #[test]
    fn short_or_foreign_packets_are_ignored() {
        let q = SynQueues::new();
        let mut udp = segment(true, 40004, 80, SYN);
        udp[6] = 17;
        q.note_read(&udp, 1);
        q.note_read(&segment(true, 40004, 80, SYN)[..50], 1);
        let mut v4 = segment(true, 40004, 80, SYN);
        v4[0] = 0x45;
        q.note_read(&v4, 1);
        assert!(q.slots.iter().all(|s| s.load(Relaxed) == 0));
        assert_eq!(q.queue_for(&[0x60; 20]), None);
    }
}
