//! The kernel's drops in the queues in front of the packet threads: a tunnel socket's receive
//! queue and the TUN device's transmit queue fill when a thread waits too long for a core, and
//! the kernel then drops without the daemon seeing the packet. This module gathers them for
//! `mt6d status` and the metrics ([`KernelDrops`]) and warns, at most once per rotation, when
//! they rose. It reads counters only: the packet threads add theirs with one atomic operation
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

/// Logs a rise of the kernel's drops since the last report (../shared/STYLE.md §8:
/// rate-limited, here to once per rotation).
#[derive(Debug, Default)]
pub struct KernelDropReport {
    last: KernelDrops,
}

impl KernelDropReport {
    pub fn report(&mut self, now: KernelDrops) {
        let rose = |n: u64, l: u64| n.saturating_sub(l);
        let (s, q, w) = (
            rose(now.socket_queue, self.last.socket_queue),
            rose(now.tun_queue, self.last.tun_queue),
            rose(now.tun_write, self.last.tun_write),
        );
        if s + q + w > 0 {
            log::warn!(
                "the kernel dropped since last rotation: {s} from full tunnel socket queues, {q} from the full TUN queue, {w} refused TUN writes (packet threads short of CPU?)"
            );
        }
        self.last = now;
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
        r.report(d);
        assert_eq!(r.last, d);
        r.report(d);
        assert_eq!(r.last, d);
    }
}
