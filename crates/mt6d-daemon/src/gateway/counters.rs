//! Per-peer packet counters, shared lock-free between the data-plane threads and the control
//! socket.
//!
//! The transmit and receive halves live on separate cache lines because different threads write
//! them; the hot loops add a whole batch at once rather than touching an atomic per packet.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::status::CounterSnapshot;

/// Why a packet was dropped. The labels are stable: they appear in `mt6d status --json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum DropReason {
    /// Shorter than the tunnel header, or an inner header whose length fields disagree.
    BadLength = 0,
    /// Authentication tag did not verify (forged, corrupted or wrong key).
    BadTag = 1,
    /// Counter already seen or older than the replay window.
    Replay = 2,
    /// Outer destination (address, port) or source is not one of the accepted routes.
    UnknownAddress = 3,
    /// Inner packet larger than the tunnel can carry.
    TooBig = 4,
    /// Inner packet from the protected side whose addresses belong to no configured peer.
    NoPeer = 5,
    /// The kernel refused to send or accept the packet.
    Io = 6,
    /// No key for it: no handshake completed yet (tx), or a key phase this gateway does not hold
    /// (rx; e.g. the peer restarted). Either way a handshake is requested.
    NoKey = 7,
    /// A handshake message that was rejected (the reason is in the peer's handshake failures).
    Handshake = 8,
    /// A pre-shared key that has protected as many packets as its AEAD allows
    /// (docs/PROTOCOL.md §4.3): the operator must give the peer a new key.
    KeyLimit = 9,
}

impl DropReason {
    pub const ALL: [DropReason; 10] = [
        DropReason::BadLength,
        DropReason::BadTag,
        DropReason::Replay,
        DropReason::UnknownAddress,
        DropReason::TooBig,
        DropReason::NoPeer,
        DropReason::Io,
        DropReason::NoKey,
        DropReason::Handshake,
        DropReason::KeyLimit,
    ];

    pub fn label(self) -> &'static str {
        match self {
            DropReason::BadLength => "bad_length",
            DropReason::BadTag => "bad_tag",
            DropReason::Replay => "replay",
            DropReason::UnknownAddress => "unknown_address",
            DropReason::TooBig => "too_big",
            DropReason::NoPeer => "no_peer",
            DropReason::Io => "io",
            DropReason::NoKey => "no_key",
            DropReason::Handshake => "handshake",
            DropReason::KeyLimit => "key_limit",
        }
    }
}

/// Counters written by one direction's thread.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct DirectionCounters {
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    drops: [AtomicU64; DropReason::ALL.len()],
}

impl DirectionCounters {
    pub fn add(&self, packets: u64, bytes: u64) {
        if packets != 0 {
            self.packets.fetch_add(packets, Relaxed);
            self.bytes.fetch_add(bytes, Relaxed);
        }
    }

    pub fn drop_n(&self, reason: DropReason, n: u64) {
        self.drops[reason as usize].fetch_add(n, Relaxed);
    }

    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops[reason as usize].load(Relaxed)
    }
}

/// Everything counted for one peer (and, for packets that match no peer, for the gateway).
#[derive(Debug, Default)]
pub struct PeerCounters {
    /// Inner packets from the protected side, sent into the tunnel.
    pub tx: DirectionCounters,
    /// Tunnel packets from the public side, delivered to the protected side.
    pub rx: DirectionCounters,
    pub rotations: AtomicU64,
    /// Handshake messages from the peer that were accepted (the receiving worker adds one per control
    /// datagram, never per data packet): with `rx` they tell the liveness log the peer is there
    /// without taking its link's lock.
    pub handshakes_rx: AtomicU64,
    /// ICMPv6 errors this gateway's own stack sent about the peer's packets (a hop limit that
    /// ran out here), carried back through the tunnel from the local protected host.
    pub own_errors: AtomicU64,
}

impl PeerCounters {
    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            tx_packets: self.tx.packets.load(Relaxed),
            tx_bytes: self.tx.bytes.load(Relaxed),
            rx_packets: self.rx.packets.load(Relaxed),
            rx_bytes: self.rx.bytes.load(Relaxed),
            rotations: self.rotations.load(Relaxed),
            own_errors: self.own_errors.load(Relaxed),
            drops: DropReason::ALL
                .iter()
                .map(|r| (r.label().to_string(), self.tx.drops(*r) + self.rx.drops(*r)))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_adds_both_directions_per_reason() {
        let c = PeerCounters::default();
        c.tx.add(3, 300);
        c.rx.add(2, 100);
        c.rx.add(0, 999); // an empty batch changes nothing
        c.rx.drop_n(DropReason::Replay, 4);
        c.tx.drop_n(DropReason::Replay, 1);
        c.rx.drop_n(DropReason::BadTag, 2);
        let s = c.snapshot();
        assert_eq!(
            (s.tx_packets, s.tx_bytes, s.rx_packets, s.rx_bytes),
            (3, 300, 2, 100)
        );
        assert_eq!(s.drops["replay"], 5);
        assert_eq!(s.drops["bad_tag"], 2);
        assert_eq!(s.drops["io"], 0);
        assert_eq!(s.drops.len(), DropReason::ALL.len());
    }
}
