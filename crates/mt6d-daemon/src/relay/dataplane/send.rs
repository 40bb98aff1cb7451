//! A relay worker's send path: inner packets from the TUN queue of an edge gateway sealed end to
//! end and for the next link (outside the node's lock with several workers), and every frame
//! sent through the sender socket bound to its link's hashed address and port, as UDP GSO
//! trains, or through the raw socket where no sender could be bound.

use super::*;

impl Worker<'_> {
    /// One batch of inner packets from the protected side (edge gateways): read from this
    /// worker's TUN queue without the node's lock; under it, each packet's peer, route and keys
    /// (`begin_inner`); without it, sealed end to end and for the next link (`InnerJob::seal`)
    /// and sent. With one worker, sealed under the lock in the same pass (`send_inner`).
    pub(super) fn on_tun(&mut self) {
        let Some(tun) = &self.tun else { return };
        let n = match tun.recv_batch(
            &mut self.tun_scratch,
            &mut self.tun_packets,
            &mut self.tun_sizes,
            0,
        ) {
            Ok(n) => n,
            Err(e) if e.is_would_block() => return,
            Err(e) => {
                log::warn!("{e}");
                return;
            }
        };
        self.counters.tun_rx_bytes += self.tun_sizes[..n]
            .iter()
            .map(|&len| len as u64)
            .sum::<u64>();
        let shared = self.shared;
        self.spans.clear();
        let mut jobs = std::mem::take(&mut self.inner_jobs);
        jobs.clear();
        {
            let t0 = Instant::now();
            let mut core = shared.core.lock();
            self.counters.stage_lock_ns += nanos(t0.elapsed());
            let now = clock::now();
            let mut cursor = 0;
            for i in 0..n {
                self.counters.tun_rx_packets += 1;
                let inner = &self.tun_packets[i][..self.tun_sizes[i]];
                let pair = mt6d_proto::wire::address_bytes(inner)
                    .map(|(s, d)| (Ipv6Addr::from(*s), Ipv6Addr::from(*d)));
                let Some(&id) = pair.and_then(|p| shared.by_pair.get(&p)) else {
                    self.counters.tun_no_peer += 1;
                    continue;
                };
                // Back to back, so that equal-size datagrams to one destination form a GSO train.
                let result = if self.split {
                    // Sealed below, without the lock.
                    core.node.begin_inner(now, id, inner.len()).map(|job| {
                        let at = cursor;
                        cursor += job.wire_len();
                        jobs.push((i, at, job));
                    })
                } else {
                    let out = &mut self.sealed[cursor..];
                    core.node.send_inner(now, id, inner, out).map(|t| {
                        self.spans
                            .push((0, cursor, t.len, t.route.local, t.route.remote));
                        cursor += t.len;
                    })
                };
                match result {
                    Ok(()) => {}
                    Err(NodeError::NoRoute(_)) => self.counters.tun_no_route += 1,
                    Err(NodeError::NoE2eKey(_)) => {
                        let held = core.staged.entry(id).or_default();
                        if held.len() < STAGED_MAX {
                            held.push(inner.to_vec());
                            self.counters.tun_staged += 1;
                        } else {
                            self.counters.tun_no_key += 1;
                        }
                    }
                    Err(NodeError::NoKey(_)) => self.counters.tun_no_key += 1,
                    Err(e) => {
                        self.counters.tun_seal_failed += 1;
                        log::debug!("seal for end-to-end peer {}: {e}", id.0);
                    }
                }
            }
            self.drain(&mut core, now);
        }
        for (i, at, job) in &jobs {
            let inner = &self.tun_packets[*i][..self.tun_sizes[*i]];
            match job.seal(inner, &mut self.sealed[*at..]) {
                Ok(t) => self
                    .spans
                    .push((0, *at, t.len, t.route.local, t.route.remote)),
                Err(e) => {
                    self.counters.tun_seal_failed += 1;
                    if let NodeError::Seal(e) = &e {
                        note_key_limit(e);
                    }
                    log::debug!("seal for an end-to-end peer: {e}");
                }
            }
        }
        self.inner_jobs = jobs;
        let spans = std::mem::take(&mut self.spans);
        let sealed = std::mem::take(&mut self.sealed);
        self.send_spans(&spans, |_, start, len| &sealed[start..start + len]);
        self.sealed = sealed;
        self.spans = spans;
    }

    /// Opens a sender socket for every link's current send address and port and closes the
    /// ones no link sends from any more (at most one bind per link and epoch), then publishes
    /// the new map to every worker. Under the core lock: one writer at a time.
    pub(super) fn reconcile_senders(&mut self, core: &Core) {
        let wanted: Vec<SocketAddrV6> = core.send_from.values().copied().collect();
        let old = self.shared.senders.load();
        let mut next: Senders = HashMap::with_capacity(wanted.len());
        for from in wanted {
            let existing = old.get(&from).or_else(|| next.get(&from)).cloned();
            if let Some(sock) = existing {
                next.insert(from, sock);
                continue;
            }
            match UdpSocket6::bind_to(from) {
                Ok(sock) => {
                    next.insert(from, Arc::new(sock));
                }
                // Sent through the raw socket instead (no GSO), as the server role does.
                Err(e) => {
                    self.counters.sender_bind_failed += 1;
                    log::debug!("sender socket for {from}: {e}; using the raw socket");
                }
            }
        }
        self.shared.senders.store(Arc::new(next));
    }

    /// Sends each span's bytes: runs of spans from one address and port go out through its socket
    /// in `sendmmsg` batches, consecutive equal-size datagrams to one destination adjacent in
    /// memory as one UDP GSO message; spans without a sender socket through the raw socket.
    /// A refused message is counted and skipped.
    pub(super) fn send_spans<'b>(
        &mut self,
        spans: &[Span],
        bytes: impl Fn(usize, usize, usize) -> &'b [u8],
    ) {
        let senders = self.shared.senders.load();
        let mut i = 0;
        while i < spans.len() {
            let from = spans[i].3;
            let run = spans[i..].iter().take_while(|s| s.3 == from).count();
            let run_spans = &spans[i..i + run];
            match senders.get(&from) {
                Some(sock) => {
                    let mut msgs = SendMsg::recycle(std::mem::take(&mut self.udp_msgs_store));
                    let gso = sock.gso_supported();
                    let mut k = 0;
                    while k < run_spans.len() {
                        let (b, start, len, src, dst) = run_spans[k];
                        let mut end = start + len;
                        let mut count = 1;
                        // Extend the train: same buffer, adjacent, same size, same pair.
                        while gso && count < MAX_GSO_SEGMENTS {
                            match run_spans.get(k + count) {
                                Some(&(b2, s2, l2, src2, dst2))
                                    if b2 == b
                                        && s2 == end
                                        && l2 == len
                                        && src2 == src
                                        && dst2 == dst
                                        && end + l2 - start <= MAX_GSO_BYTES =>
                                {
                                    end += l2;
                                    count += 1;
                                }
                                _ => break,
                            }
                        }
                        let whole = bytes(b, start, end - start);
                        msgs.push(SendMsg {
                            src: *src.ip(),
                            dst,
                            payload: whole,
                            segment_size: (count > 1)
                                .then(|| u16::try_from(len).unwrap_or(u16::MAX)),
                        });
                        k += count;
                    }
                    // Counted in datagrams, as the raw socket's: a refused GSO message is all
                    // of its datagrams refused.
                    let datagrams = |m: &SendMsg<'_>| {
                        m.segment_size
                            .map_or(1, |s| m.payload.len().div_ceil(usize::from(s).max(1)))
                            as u64
                    };
                    let mut sent_msgs = 0;
                    while sent_msgs < msgs.len() {
                        match sock.send_batch(&mut self.udp_scratch, &msgs[sent_msgs..]) {
                            Ok(0) | Err(_) => {
                                self.counters.tx_send_failed += datagrams(&msgs[sent_msgs]);
                                sent_msgs += 1;
                            }
                            Ok(n) => {
                                let sent: u64 =
                                    msgs[sent_msgs..sent_msgs + n].iter().map(datagrams).sum();
                                self.counters.tx_datagrams += sent;
                                sent_msgs += n;
                            }
                        }
                    }
                    self.udp_msgs_store = SendMsg::recycle(msgs);
                }
                None => self.send_raw(run_spans, &bytes),
            }
            i += run;
        }
    }

    /// Sends spans through the raw socket, one datagram per message.
    pub(super) fn send_raw<'b>(
        &mut self,
        spans: &[Span],
        bytes: &impl Fn(usize, usize, usize) -> &'b [u8],
    ) {
        let mut msgs = RawSendMsg::recycle(std::mem::take(&mut self.msgs_store));
        let mut i = 0;
        while i < spans.len() {
            msgs.clear();
            for &(b, start, len, src, dst) in &spans[i..] {
                msgs.push(RawSendMsg {
                    src,
                    dst,
                    payload: bytes(b, start, len),
                });
            }
            match self.shared.raw.send_batch(&mut self.send_scratch, &msgs) {
                Ok(0) | Err(_) => {
                    self.counters.tx_send_failed += 1;
                    i += 1;
                }
                Ok(k) => {
                    self.counters.tx_datagrams += k as u64;
                    i += k;
                }
            }
        }
        self.msgs_store = RawSendMsg::recycle(msgs);
    }

    /// Writes the delivered inner packets to this worker's TUN queue; returns the time it took.
    pub(super) fn flush_tun(&mut self) -> Duration {
        if self.tun_ready == 0 {
            return Duration::ZERO;
        }
        let start = Instant::now();
        if let Some(tun) = &self.tun {
            let packets = &mut self.tun_out[..self.tun_ready];
            match tun.send_batch(&mut self.gro, packets, VIRTIO_NET_HDR_LEN) {
                Ok(_) => self.counters.tun_tx_packets += self.tun_ready as u64,
                Err(e) => {
                    self.counters.tun_write_failures += 1;
                    log::debug!("{e}");
                }
            }
        }
        self.tun_ready = 0;
        start.elapsed()
    }
}
