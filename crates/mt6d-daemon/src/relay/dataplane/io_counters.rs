//! What a relay worker counts around the node: datagrams and bytes in and out, refusals
//! before the node's lock, the kernel's answers.

/// What the daemon counted around the node (the node counts its own, by spec label), per
/// worker; `mt6d status` shows their sums.
#[derive(Debug, Default, Clone)]
pub struct IoCounters {
    pub rx_datagrams: u64,
    /// Bytes of the datagrams received (what worker placement weighs).
    pub rx_bytes: u64,
    pub rx_truncated: u64,
    /// Datagrams to the prefix on no current route of any link (a scan, an old epoch's
    /// straggler, a forgery): dropped before any key is used.
    pub rx_no_link: u64,
    /// Datagrams on a link's route refused by the receive gate, before the node's lock (a
    /// forgery's tag, a truncated payload, a counter out of its space); by reason in
    /// `gate_drops`, which `mt6d status` adds to the node's `drop_<reason>` counters.
    pub rx_refused: u64,
    pub gate_drops: Vec<(&'static str, u64)>,
    /// Datagrams the kernel took, and the ones it refused (a full queue, a GSO error).
    pub tx_datagrams: u64,
    pub tx_send_failed: u64,
    pub socket_queue_drops: u64,
    pub tun_rx_packets: u64,
    /// Bytes of the inner packets read from the TUN queue.
    pub tun_rx_bytes: u64,
    /// Packets from the protected side between no configured host pair.
    pub tun_no_peer: u64,
    pub tun_no_route: u64,
    /// Inner packets for an end-to-end peer (or a next hop) without keys yet: its handshake
    /// is under way.
    pub tun_no_key: u64,
    /// Inner packets held while their end-to-end peer's first handshake was under way, and
    /// sent when it completed (or dropped, if it expired instead).
    pub tun_staged: u64,
    pub tun_seal_failed: u64,
    /// Forwarded frames whose seal for the next link failed (its counter reservation ran out).
    pub tx_seal_failed: u64,
    pub tun_tx_packets: u64,
    pub tun_write_failures: u64,
    /// Sender sockets that could not be bound (the port is another program's): that link's
    /// frames leave through the raw socket, without GSO.
    pub sender_bind_failed: u64,
    /// Nanoseconds spent per stage of the receive path, summed over batches (003's Fig. 16
    /// stages; divide by `rx_datagrams`): the `recvmmsg` call, the node's work on every datagram
    /// of the batch (header protection, open, route, seal), the `sendmmsg` of the forwarded
    /// ones, the TUN write of the delivered ones. Four clock reads per batch, not per packet.
    pub stage_recv_ns: u64,
    pub stage_node_ns: u64,
    pub stage_send_ns: u64,
    pub stage_tun_write_ns: u64,
    /// Nanoseconds workers waited for the node's lock (both directions; 0 with one worker but
    /// for worker 0's timers and status).
    pub stage_lock_ns: u64,
}

impl IoCounters {
    /// Every counter by its status name.
    pub(super) fn pairs(&self) -> [(&'static str, u64); 24] {
        [
            ("rx_datagrams", self.rx_datagrams),
            ("rx_bytes", self.rx_bytes),
            ("rx_truncated", self.rx_truncated),
            ("rx_no_link", self.rx_no_link),
            ("rx_refused", self.rx_refused),
            ("tx_datagrams", self.tx_datagrams),
            ("tx_send_failed", self.tx_send_failed),
            ("socket_queue_drops", self.socket_queue_drops),
            ("tun_rx_packets", self.tun_rx_packets),
            ("tun_rx_bytes", self.tun_rx_bytes),
            ("tun_no_peer", self.tun_no_peer),
            ("tun_no_route", self.tun_no_route),
            ("tun_no_key", self.tun_no_key),
            ("tun_staged", self.tun_staged),
            ("tun_seal_failed", self.tun_seal_failed),
            ("tx_seal_failed", self.tx_seal_failed),
            ("tun_tx_packets", self.tun_tx_packets),
            ("tun_write_failures", self.tun_write_failures),
            ("sender_bind_failed", self.sender_bind_failed),
            ("stage_recv_ns", self.stage_recv_ns),
            ("stage_node_ns", self.stage_node_ns),
            ("stage_send_ns", self.stage_send_ns),
            ("stage_tun_write_ns", self.stage_tun_write_ns),
            ("stage_lock_ns", self.stage_lock_ns),
        ]
    }

    /// A datagram the receive gate refused, by the node's label for it.
    pub(super) fn refused(&mut self, reason: &'static str) {
        self.rx_refused += 1;
        match self.gate_drops.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n += 1,
            // A handful of labels, each pushed once per worker.
            None => self.gate_drops.push((reason, 1)),
        }
    }
}
