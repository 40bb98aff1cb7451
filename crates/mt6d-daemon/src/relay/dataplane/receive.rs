//! A relay worker's receive path: a batch from its transparent socket in four passes, the
//! AEAD outside the node's lock when there are several workers (docs/ARCHITECTURE.md,
//! "Relays"): admit through the receive gate, finish under the lock, seal for the next link and
//! open end to end without it, commit the end-to-end replay windows under it; then one send.

use super::*;

impl Worker<'_> {
    /// One batch of datagrams from the links. Several workers, in passes: (1) without the
    /// node's lock, each datagram through the receive gate ([`RxGate::admit`]): on no link's
    /// route, or refused (a forgery's tag), it is counted and dropped there; opened, it waits
    /// for the node; a handshake message, a keepalive or a rekey race waits for the node's own
    /// path; (2) under the lock, in arrival order, the replay windows, probes, routing and
    /// forwarding decisions (`finish_datagram`), the node's path whole for the rest
    /// (`handle_datagram`); (3) without it, the forwarded frames sealed for their next link and,
    /// at an edge gateway, the end-to-end payloads opened (`DeliverJob::open`); (4) at an edge
    /// gateway, under it again, the end-to-end replay windows (`finish_delivery`). Then the
    /// sends and the TUN write, without it. A batch of junk and forgeries never takes the lock.
    /// With one worker, one pass under the lock (`handle_datagram`: the same steps in a row)
    /// for every datagram on a link's route.
    pub(super) fn on_socket(&mut self) {
        let t0 = Instant::now();
        let got = match self.socket.recv_ready(&mut self.rx_scratch, &mut self.bufs) {
            Ok(n) => n,
            Err(e) if e.is_would_block() => return,
            Err(e) => {
                log::debug!("{e}");
                return;
            }
        };
        self.counters.socket_queue_drops += self.socket.take_queue_drops();
        self.counters.rx_bytes += self.bufs[..got].iter().map(|b| b.len() as u64).sum::<u64>();
        let t1 = Instant::now();
        self.counters.stage_recv_ns += nanos(t1 - t0);
        let mut spent = Spent::default();
        self.spans.clear();
        self.tun_ready = 0;
        // Out of `self` while the node works on them (moves of the vectors, no copy).
        let mut bufs = std::mem::take(&mut self.bufs);
        let mut pending = std::mem::take(&mut self.pending);
        pending.clear();
        let bufs_got = &mut bufs[..got];
        let admitted = self.admit(bufs_got, &mut pending);
        if admitted > 0 {
            self.whole_under_lock(bufs_got, &mut spent);
        }
        let deliveries = self.finish_under_lock(bufs_got, &mut pending, &mut spent);
        let sealed_here = self.seal_and_open(bufs_got, &mut pending);
        if deliveries {
            self.deliver_under_lock(bufs_got, &mut pending, &mut spent);
        }
        if sealed_here {
            // Back in arrival order, so that a GRO train forwarded whole leaves as one GSO train.
            self.spans.sort_unstable_by_key(|s| (s.0, s.1));
        }
        self.pending = pending;
        spent.tun_write += self.flush_tun();
        let t3 = Instant::now();
        let spans = std::mem::take(&mut self.spans);
        self.send_spans(&spans, |b, start, len| &bufs[b].data()[start..start + len]);
        self.spans = spans;
        self.bufs = bufs;
        let c = &mut self.counters;
        c.stage_lock_ns += nanos(spent.lock_wait);
        c.stage_send_ns += nanos(t3.elapsed());
        c.stage_tun_write_ns += nanos(spent.tun_write);
        c.stage_node_ns += nanos((t3 - t1).saturating_sub(spent.tun_write + spent.lock_wait));
    }

    /// Pass 1 of a received batch, without the lock: each buffer's link by its (destination,
    /// source), else dropped; with several workers, each datagram through the gate. Returns
    /// the buffers left whole for the lock (one worker).
    pub(super) fn admit(
        &mut self,
        bufs: &mut [RecvBuf],
        pending: &mut Vec<PendingDatagram>,
    ) -> usize {
        let mut admitted = 0;
        let gate = self.shared.gate.load();
        for (b, buf) in bufs.iter_mut().enumerate() {
            self.links[b] = None;
            if buf.truncated() {
                self.counters.rx_truncated += 1;
                continue;
            }
            let local = SocketAddrV6::new(buf.dst(), buf.dst_port(), 0, 0);
            let remote = buf.src();
            let len = buf.len();
            let seg = buf.segment_size().map_or(len, usize::from).max(1);
            let Some(link) = gate.link_of(local, remote) else {
                self.counters.rx_no_link += len.div_ceil(seg) as u64;
                continue;
            };
            self.links[b] = Some(link);
            if !self.split {
                admitted += 1;
                continue;
            }
            let data = buf.data_mut();
            let mut start = 0;
            while start < len {
                let end = (start + seg).min(len);
                self.counters.rx_datagrams += 1;
                match gate.admit(local, remote, &mut data[start..end]) {
                    Admit::NoRoute => self.counters.rx_no_link += 1,
                    Admit::Refused(_, reason) => self.counters.refused(reason),
                    Admit::Node(link) => pending.push((b, start, end, Pending::Whole(link))),
                    Admit::NoKey(link) => {
                        self.counters.refused(OpenError::NoKey.reason());
                        if !self.empty_slots.contains(&link) {
                            self.empty_slots.push(link);
                        }
                    }
                    Admit::Opened(job) => pending.push((b, start, end, Pending::Opened(job))),
                }
                start = end;
            }
        }
        admitted
    }

    /// One worker: every datagram of the admitted buffers whole under the (uncontended) lock.
    pub(super) fn whole_under_lock(&mut self, bufs: &mut [RecvBuf], spent: &mut Spent) {
        let shared = self.shared;
        let t = Instant::now();
        let mut core = shared.core.lock();
        spent.lock_wait += t.elapsed();
        let now = clock::now();
        for (b, buf) in bufs.iter_mut().enumerate() {
            let Some(link) = self.links[b] else {
                continue;
            };
            let local = SocketAddrV6::new(buf.dst(), buf.dst_port(), 0, 0);
            let remote = buf.src();
            let len = buf.len();
            let seg = buf.segment_size().map_or(len, usize::from).max(1);
            let data = buf.data_mut();
            let mut start = 0;
            while start < len {
                let end = (start + seg).min(len);
                self.counters.rx_datagrams += 1;
                let datagram = &mut data[start..end];
                let r = core
                    .node
                    .handle_datagram(now, link, local, remote, datagram);
                spent.tun_write += self.take_received(b, start, r, datagram);
                start = end;
            }
        }
        self.drain(&mut core, now);
    }

    /// Pass 2, under the lock, in arrival order: what the gate opened is finished (or left to
    /// seal or to open end to end without the lock), the rest handled whole. Returns whether
    /// end-to-end deliveries are left for pass 4.
    pub(super) fn finish_under_lock(
        &mut self,
        bufs: &mut [RecvBuf],
        pending: &mut [PendingDatagram],
        spent: &mut Spent,
    ) -> bool {
        if pending.is_empty() && self.empty_slots.is_empty() {
            return false;
        }
        let mut deliveries = false;
        let shared = self.shared;
        let t = Instant::now();
        let mut core = shared.core.lock();
        spent.lock_wait += t.elapsed();
        let now = clock::now();
        for link in self.empty_slots.drain(..) {
            core.node.note_empty_slot(now, link);
        }
        for (b, start, end, p) in pending.iter_mut() {
            let buf = &mut bufs[*b];
            let (local, remote) = (
                SocketAddrV6::new(buf.dst(), buf.dst_port(), 0, 0),
                buf.src(),
            );
            let data = &mut buf.data_mut()[*start..*end];
            let received = match std::mem::replace(p, Pending::Done) {
                Pending::Opened(job) => match core.node.finish_datagram(now, &job, Ok(()), data) {
                    Finish::Done(r) => r,
                    Finish::Seal(seal) => {
                        *p = Pending::Seal(seal);
                        continue;
                    }
                    Finish::Deliver(d) => {
                        *p = Pending::Deliver(d);
                        deliveries = true;
                        continue;
                    }
                },
                Pending::Whole(link) => core.node.handle_datagram(now, link, local, remote, data),
                _ => continue,
            };
            spent.tun_write += self.take_received(*b, *start, received, data);
        }
        self.drain(&mut core, now);
        deliveries
    }

    /// Pass 3, without the lock: seals for the next link, end-to-end opens. Returns whether a
    /// frame was sealed here (the spans then need their arrival order back).
    pub(super) fn seal_and_open(
        &mut self,
        bufs: &mut [RecvBuf],
        pending: &mut [PendingDatagram],
    ) -> bool {
        let mut sealed_here = false;
        for (b, start, end, p) in pending.iter_mut() {
            let data = &mut bufs[*b].data_mut()[*start..*end];
            match p {
                Pending::Seal(seal) => match seal.seal(data) {
                    Ok(t) => {
                        self.spans
                            .push((*b, *start, t.len, t.route.local, t.route.remote));
                        sealed_here = true;
                    }
                    Err(e) => {
                        self.counters.tx_seal_failed += 1;
                        note_key_limit(&e);
                        log::debug!("seal a forwarded frame: {e}");
                    }
                },
                Pending::Deliver(d) => {
                    let opened = d.open(data);
                    if let Pending::Deliver(d) = std::mem::replace(p, Pending::Done) {
                        *p = Pending::Delivered(d, opened);
                    }
                }
                _ => {}
            }
        }
        sealed_here
    }

    /// Pass 4, under the lock: the end-to-end replay windows of what pass 3 opened.
    pub(super) fn deliver_under_lock(
        &mut self,
        bufs: &mut [RecvBuf],
        pending: &mut [PendingDatagram],
        spent: &mut Spent,
    ) {
        let shared = self.shared;
        let t = Instant::now();
        let mut core = shared.core.lock();
        spent.lock_wait += t.elapsed();
        let now = clock::now();
        for (b, start, end, p) in pending.iter_mut() {
            if let Pending::Delivered(d, opened) = std::mem::replace(p, Pending::Done) {
                let received = core.node.finish_delivery(now, &d, opened);
                let data = &bufs[*b].data()[*start..*end];
                spent.tun_write += self.take_received(*b, *start, received, data);
            }
        }
        self.drain(&mut core, now);
    }

    /// What the node left of datagram `data` (at `start` of buffer `b`): a frame to send, an
    /// inner packet for the TUN queue, or nothing. Returns the time a full TUN batch took to
    /// write (rare: more inner packets in one receive than a batch holds).
    pub(super) fn take_received(
        &mut self,
        b: usize,
        start: usize,
        r: Received,
        data: &[u8],
    ) -> Duration {
        let mut tun_write = Duration::ZERO;
        match r {
            Received::Forward(t) => {
                self.spans
                    .push((b, start, t.len, t.route.local, t.route.remote));
            }
            Received::Deliver { range, .. } => {
                if self.tun_ready == self.tun_out.len() {
                    tun_write = self.flush_tun();
                }
                let slot = &mut self.tun_out[self.tun_ready];
                slot.clear();
                slot.resize(VIRTIO_NET_HDR_LEN, 0);
                slot.extend_from_slice(&data[range]);
                self.tun_ready += 1;
            }
            Received::Consumed => {}
        }
        tun_write
    }
}
