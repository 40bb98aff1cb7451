//! Link-local frames and datagrams queued for [`RelayNode::poll_transmit`]: probes, routing
//! messages, a link's handshake datagrams and an end-to-end stream's relay payloads.

use super::{RelayNode, Transmit};
use crate::relay::probe::ProbeRepr;
use crate::relay::routing::RoutingRepr;
use crate::relay::table::{Forward, Neighbour};
use crate::relay::{Kind, NodeId, RelayRepr, HOP_LIMIT};
use crate::{Route, UnixTime};

/// A link-local frame waiting for [`RelayNode::poll_transmit`].
#[derive(Debug)]
pub(super) enum Pending {
    Probe(Neighbour, ProbeRepr),
    Routing(Neighbour, RoutingRepr),
    /// A datagram the link made (handshake message, keepalive, notice), header protection on.
    Datagram(Neighbour, Route, Vec<u8>),
    /// A relay payload an end-to-end stream made (`routeTag || handshake message or
    /// keepalive`), of `kind`, for edge gateway `destination`: framed and sealed for the next
    /// hop when it is sent.
    E2e {
        kind: Kind,
        destination: NodeId,
        payload: Vec<u8>,
    },
}

impl RelayNode {
    /// The next link-local frame (probe, probe reply, routing message), sealed into `out` (at
    /// least [`crate::tunnel::frame_payload_len`]`(frame_max)` bytes).
    pub fn poll_transmit(&mut self, now: UnixTime, out: &mut [u8]) -> Option<Transmit> {
        self.refresh(now);
        while let Some(p) = self.pending.pop_front() {
            let (link, kind) = match &p {
                Pending::Probe(link, _) => (*link, Kind::Probe),
                Pending::Routing(link, _) => (*link, Kind::Routing),
                Pending::E2e {
                    kind,
                    destination,
                    payload,
                } => {
                    if let Some(t) = self.send_e2e(*kind, *destination, payload, out) {
                        return Some(t);
                    }
                    continue;
                }
                Pending::Datagram(link, route, bytes) => {
                    let Some(dst) = out.get_mut(..bytes.len()) else {
                        self.counters.drop("node_buffer_too_small");
                        continue;
                    };
                    dst.copy_from_slice(bytes);
                    return Some(Transmit {
                        link: *link,
                        route: *route,
                        len: bytes.len(),
                    });
                }
            };
            let body: &[u8] = match &p {
                Pending::Probe(_, probe) => {
                    self.scratch.clear();
                    self.scratch.extend_from_slice(&probe.to_bytes());
                    &self.scratch
                }
                Pending::Routing(_, m) => {
                    self.scratch.clear();
                    self.scratch.resize(m.buffer_len(), 0);
                    if let Err(e) = m.emit(&mut self.scratch) {
                        self.counters.drop(e.reason());
                        continue;
                    }
                    &self.scratch
                }
                Pending::Datagram(..) | Pending::E2e { .. } => continue,
            };
            let Some(l) = self.links.get_mut(&link) else {
                continue;
            };
            // No keys yet (or expired): the probe is lost, which is what the link is; the
            // routing message is resent in full once the link comes up (§10.8).
            let Some(sealer) = l.keys.send() else {
                l.link.handle_no_send_key();
                continue;
            };
            let Ok(len) = u16::try_from(body.len()) else {
                continue;
            };
            let repr = RelayRepr::link_local(kind, len);
            let route = l.schedule.send;
            let header = l.send_set.stream.send_header_key();
            match sealer.seal_frame_protected(&route, header, &repr, body, self.frame_max, out) {
                Ok(n) => {
                    return Some(Transmit {
                        link,
                        route,
                        len: n,
                    });
                }
                Err(e) => self.counters.drop(e.reason()),
            }
        }
        None
    }

    /// Frames an end-to-end stream's relay payload for `destination` and seals it for the next
    /// hop into `out`; None (counted at this source) without a route or a key on that link.
    pub(super) fn send_e2e(
        &mut self,
        kind: Kind,
        destination: NodeId,
        payload: &[u8],
        out: &mut [u8],
    ) -> Option<Transmit> {
        let repr = RelayRepr {
            kind,
            hops: HOP_LIMIT,
            payload_len: u16::try_from(payload.len()).ok()?,
            destination,
        };
        let Forward::Send { to, .. } = self.table.forward(&repr, true) else {
            self.counters.drop("relay_no_route");
            return None;
        };
        let l = self.links.get_mut(&to)?;
        let Some(sealer) = l.keys.send() else {
            l.link.handle_no_send_key();
            self.counters.drop("node_no_key");
            return None;
        };
        let route = l.schedule.send;
        let header = l.send_set.stream.send_header_key();
        match sealer.seal_frame_protected(&route, header, &repr, payload, self.frame_max, out) {
            Ok(n) => Some(Transmit {
                link: to,
                route,
                len: n,
            }),
            Err(e) => {
                self.counters.drop(e.reason());
                None
            }
        }
    }
}
