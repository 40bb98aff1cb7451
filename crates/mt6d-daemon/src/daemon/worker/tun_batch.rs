//! Opened packets waiting for one TUN write, for every role's receive path: each in its own
//! buffer after a virtio header's room, written together with GRO coalescing
//! ([`super::write_to_tun`]).

use std::sync::atomic::AtomicU64;

use mt6d_os::{GROTable, PacketBuf, Tun, IDEAL_BATCH_SIZE, VIRTIO_NET_HDR_LEN};

/// A batch of opened inner packets for one TUN queue.
pub struct TunBatch {
    inner_cap: usize,
    out: Vec<PacketBuf>,
    ready: usize,
    gro: GROTable,
}

impl std::fmt::Debug for TunBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunBatch")
            .field("inner_cap", &self.inner_cap)
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

impl TunBatch {
    /// Room for [`IDEAL_BATCH_SIZE`] packets of up to `inner_cap` bytes each (GRO coalescing
    /// appends to the first packet of a flow, so every buffer has room for 64 KiB).
    pub fn new(inner_cap: usize) -> TunBatch {
        TunBatch {
            inner_cap,
            out: (0..IDEAL_BATCH_SIZE)
                .map(|_| PacketBuf::with_capacity(VIRTIO_NET_HDR_LEN + 65_535))
                .collect(),
            ready: 0,
            gro: GROTable::default(),
        }
    }

    /// Where the next opened packet goes: `inner_cap` bytes after the virtio header. Writes the
    /// batch to `tun` first when it is full (`failures` counts refused writes).
    pub fn slot(&mut self, tun: &Tun, failures: &AtomicU64) -> &mut [u8] {
        if self.ready == self.out.len() {
            self.flush(tun, failures);
        }
        let slot = &mut self.out[self.ready];
        slot.prepare(VIRTIO_NET_HDR_LEN + self.inner_cap);
        &mut slot.as_mut()[VIRTIO_NET_HDR_LEN..]
    }

    /// The last [`TunBatch::slot`] holds an inner packet of `len` bytes: it joins the batch.
    pub fn commit(&mut self, len: usize) {
        self.out[self.ready].truncate(VIRTIO_NET_HDR_LEN + len);
        self.ready += 1;
    }

    /// The inner packet committed last, if any.
    pub fn last(&self) -> Option<&[u8]> {
        let i = self.ready.checked_sub(1)?;
        Some(&self.out[i].as_ref()[VIRTIO_NET_HDR_LEN..])
    }

    /// Writes the batch to `tun`.
    pub fn flush(&mut self, tun: &Tun, failures: &AtomicU64) {
        super::write_to_tun(tun, &mut self.gro, &mut self.out[..self.ready], failures);
        self.ready = 0;
    }

    /// Writes the batch but its last packet to `tun`, then the last to `other` (a SYN-ACK to
    /// the queue its SYN was read from): what precedes it goes first, so the order holds.
    pub fn flush_last_to(&mut self, tun: &Tun, other: &Tun, failures: &AtomicU64) {
        let Some(last) = self.ready.checked_sub(1) else {
            return;
        };
        super::write_to_tun(tun, &mut self.gro, &mut self.out[..last], failures);
        super::write_to_tun(other, &mut self.gro, &mut self.out[last..=last], failures);
        self.ready = 0;
    }
}
