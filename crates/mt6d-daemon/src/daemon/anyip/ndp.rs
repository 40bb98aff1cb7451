//! Neighbour discovery for a role whose hashed prefix is local as a whole (the server role on a
//! segment shared with its router; a relay network node).
//!
//! An AnyIP route (`local PREFIX/64 dev lo`) makes every address of the prefix local to the
//! kernel, but the kernel resolves none of them on the external link: it answers a Neighbour
//! Solicitation only for addresses bound to that interface, and the role binds none. Where
//! the upstream router routes the prefix to the server, nothing more is needed. Where the
//! server shares a segment with its router, the router resolves each hashed address before it
//! forwards to it, and [`NdpResponder`] answers for the addresses that are currently valid, and
//! only for those: a solicitation for any other address of the /64 gets no answer, so a scan of
//! the prefix from the segment learns nothing (the router's entry fails, as for an address
//! nobody holds).
//!
//! Frames come from the filtered packet socket the collision watch uses
//! ([`PacketCapture::open_neighbor_discovery`]: solicitations and advertisements received on
//! the interface, nothing this host sends); the answer is built by
//! [`mt6d_proto::wire::advertisement_frame`] and sent on the same socket. Per solicitation:
//! one receive, one parse, one question to the caller's index, at most one send; no lock, no
//! allocation, no log line.

use std::net::Ipv6Addr;

use mt6d_os::capture::PacketCapture;
use mt6d_proto::wire::{advertisement_frame, NeighborClaim, NeighborFrame};

/// What the responder did, since it was opened.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct NdpCounters {
    /// Address resolutions and unreachability checks answered (to their sender).
    pub answered: u64,
    /// Duplicate address probes for a valid address answered to all nodes (the defence of
    /// RFC 4862 §5.4.3).
    pub defended: u64,
    /// Solicitations for an address that is not currently valid: not answered.
    pub not_current: u64,
    /// Advertisements seen (never answered; the collision watch reads them).
    pub advertisements: u64,
    /// Frames that did not parse as a neighbour discovery message (dropped).
    pub malformed: u64,
    /// Answers the kernel refused to send.
    pub send_errors: u64,
}

/// Answers Neighbour Solicitations on one interface for the addresses a predicate calls
/// current.
#[derive(Debug)]
pub struct NdpResponder {
    capture: PacketCapture,
    mac: [u8; 6],
    buf: Box<[u8; 512]>,
    counters: NdpCounters,
}

impl NdpResponder {
    /// Opens the responder on `interface`, whose link-layer address is `mac` (the answers'
    /// source and their target link-layer address option).
    pub fn open(interface: &str, mac: [u8; 6]) -> mt6d_os::Result<NdpResponder> {
        Ok(NdpResponder {
            capture: PacketCapture::open_neighbor_discovery(interface)?,
            mac,
            buf: Box::new([0; 512]),
            counters: NdpCounters::default(),
        })
    }

    /// The socket, for an epoll: call [`NdpResponder::serve_ready`] when it is readable.
    pub fn capture(&self) -> &PacketCapture {
        &self.capture
    }

    pub fn counters(&self) -> NdpCounters {
        self.counters
    }

    /// Handles the frames queued now, at most `budget` of them, answering solicitations for
    /// the addresses `is_current` accepts. Returns how many frames it took; fewer than
    /// `budget` means the queue is empty. A failed send is counted, not returned: the next
    /// solicitation (a resolver retransmits every second) gets its own answer.
    pub fn serve_ready(
        &mut self,
        is_current: impl Fn(Ipv6Addr) -> bool,
        budget: usize,
    ) -> mt6d_os::Result<usize> {
        for taken in 0..budget {
            let Some(frame) = self.capture.recv_nowait(&mut self.buf[..])? else {
                return Ok(taken);
            };
            let len = frame.captured.min(self.buf.len());
            self.handle(&is_current, len);
        }
        Ok(budget)
    }

    fn handle(&mut self, is_current: &impl Fn(Ipv6Addr) -> bool, len: usize) {
        let Ok(f) = NeighborFrame::parse(&self.buf[..len]) else {
            self.counters.malformed += 1;
            return;
        };
        if f.claim == NeighborClaim::Advertisement {
            self.counters.advertisements += 1;
            return;
        }
        if !is_current(f.target) {
            self.counters.not_current += 1;
            return;
        }
        let Some(answer) = advertisement_frame(&f, self.mac) else {
            return;
        };
        match self.capture.send(&answer) {
            Ok(_) if f.claim == NeighborClaim::Probe => self.counters.defended += 1,
            Ok(_) => self.counters.answered += 1,
            Err(_) => self.counters.send_errors += 1,
        }
    }
}
