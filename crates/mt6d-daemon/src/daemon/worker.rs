//! What every role's packet worker shares: the batch sizes of UDP GSO sends, writing opened
//! packets to a TUN queue, and the rule that a worker never dies alone.

use std::sync::atomic::{AtomicBool, Ordering};

use mt6d_os::{GROTable, PacketBuf, Tun, VIRTIO_NET_HDR_LEN};

/// Most datagrams in one UDP GSO send (the kernel's UDP_MAX_SEGMENTS is 64 on older kernels).
pub const MAX_GSO_SEGMENTS: usize = 64;
/// Most bytes in one UDP GSO send (an IPv6 datagram's payload length is 16 bits).
pub const MAX_GSO_BYTES: usize = 65_000;

/// Writes opened packets (each after a virtio header's room) to a TUN queue. The kernel
/// refusing one inner packet (e.g. no route on the protected side) is not a reason to stop: the
/// batch writes the others and reports one error, so `failures` counts at least one refused
/// packet; the device's rx_dropped counts the rest it refused.
pub fn write_to_tun(
    tun: &Tun,
    gro: &mut GROTable,
    packets: &mut [PacketBuf],
    failures: &std::sync::atomic::AtomicU64,
) {
    if packets.is_empty() {
        return;
    }
    if let Err(e) = tun.send_batch(gro, packets, VIRTIO_NET_HDR_LEN) {
        failures.fetch_add(1, Ordering::Relaxed);
        log::debug!("{e}");
    }
}

/// Runs `work` (worker `index`'s loop). A panic in it is caught and logged, and the daemon is
/// told to stop (it then cleans up and exits non-zero for its supervisor): a worker never dies
/// alone and silently, leaving its TUN queue and its peers unserved.
pub fn stop_all_if_it_panics(shutdown: &AtomicBool, index: usize, work: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).is_err() {
        log::error!(
            "data-plane worker {index} panicked (the message is above); stopping the daemon"
        );
        shutdown.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_worker_stops_the_daemon_and_a_returning_one_does_not() {
        let shutdown = AtomicBool::new(false);
        stop_all_if_it_panics(&shutdown, 0, || {});
        assert!(!shutdown.load(Ordering::Relaxed));
        stop_all_if_it_panics(&shutdown, 1, || panic!("injected"));
        assert!(shutdown.load(Ordering::Relaxed));
    }
}
