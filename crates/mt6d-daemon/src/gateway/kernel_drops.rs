//! The kernel's drops in the queues in front of the packet threads: a tunnel socket's receive
//! queue and the TUN device's transmit queue fill when a thread waits too long for a core, and
//! the kernel then drops without the daemon seeing the packet. This module gathers them for
//! `mt6d status` and the metrics ([`KernelDrops`]) and for the drop summary logged at most once
//! per rotation. It reads counters only: the packet threads add theirs with one atomic operation
//! per batch, and the TUN device's come over rtnetlink on the housekeeping thread.

use std::sync::atomic::Ordering::Relaxed;

use mt6d_os::Netlink;

use super::shared::Shared;
use crate::status::KernelDrops;

/// The counters now. The TUN device's statistics start with the device, as the daemon's do.
pub fn read(shared: &Shared, netlink: &mut Netlink, tun_index: u32) -> KernelDrops {
    let link = netlink.link_drops(tun_index).unwrap_or_else(|e| {
        log::debug!("{e}");
        mt6d_os::LinkDrops::default()
    });
    KernelDrops {
        socket_queue: shared.socket_queue_drops.load(Relaxed),
        tun_queue: link.tx_dropped,
        // A refused write may raise both (the device counts what it drops, the thread counts
        // the failed batch): each is a lower bound, so the larger is reported.
        tun_write: link.rx_dropped.max(shared.tun_write_failures.load(Relaxed)),
    }
}

/// The rise of the kernel's drops since the last call, for the drop summary logged at most
/// once per rotation (../shared/STYLE.md §8: rate-limited; one line for every kind of drop).
#[derive(Debug, Default)]
pub struct KernelDropReport {
    last: KernelDrops,
}

impl KernelDropReport {
    /// One entry per queue whose drops rose since the last call.
    pub fn rose(&mut self, now: KernelDrops) -> Vec<String> {
        let last = std::mem::replace(&mut self.last, now);
        [
            (
                now.socket_queue,
                last.socket_queue,
                "full tunnel socket queue",
            ),
            (now.tun_queue, last.tun_queue, "full TUN queue"),
            (now.tun_write, last.tun_write, "refused TUN write"),
        ]
        .into_iter()
        .filter_map(|(n, l, what)| {
            let d = n.saturating_sub(l);
            (d > 0).then(|| format!("kernel: {d} {what} (packet threads short of CPU?)"))
        })
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_rise_is_reported_and_the_total_adds_every_queue() {
        let mut r = KernelDropReport::default();
        let d = KernelDrops {
            socket_queue: 2,
            tun_queue: 3,
            tun_write: 4,
        };
        assert_eq!(d.total(), 9);
        assert_eq!(r.rose(d).len(), 3);
        assert!(r.rose(d).is_empty(), "nothing new");
        let more = KernelDrops { tun_queue: 10, ..d };
        assert_eq!(
            r.rose(more),
            vec!["kernel: 7 full TUN queue (packet threads short of CPU?)".to_string()]
        );
    }
}
