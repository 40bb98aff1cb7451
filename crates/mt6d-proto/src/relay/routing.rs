//! Routing messages: the relay payload of a kind-`0x03` frame (docs/PROTOCOL.md §10.8-§10.9).
//!
//! ```text
//! routing (4 + 12 * count bytes): type (1) | count (1) | 00 00 | count x entry (12)
//! type 0x01 update:        entry = destination (8) | seqno (2) | metric (2)
//! type 0x02 seqno request: entry = destination (8) | seqno (2) | hops (1) | 00
//! ```
//! Updates carry a node's distance to edge gateways (Babel-like, RFC 8966 §4.6.9, reduced to one
//! destination per originator); seqno requests ask the origin for a newer seqno when no feasible
//! route is left (RFC 8966 §3.8). Both are believed only from the link they arrived on, whose keys
//! authenticate the neighbour.

use super::{read_node_id, read_u16, Metric, NodeId, RelayError, Seqno, NODE_ID_LEN};

mod field {
    use std::ops::Range;
    pub const TYPE: usize = 0;
    pub const COUNT: usize = 1;
    pub const RESERVED: Range<usize> = 2..4;
    // Within an entry.
    pub const DESTINATION: Range<usize> = 0..8;
    pub const SEQNO: Range<usize> = 8..10;
    pub const METRIC: Range<usize> = 10..12;
    pub const HOPS: usize = 10;
    pub const ENTRY_RESERVED: usize = 11;
}

/// Bytes before the entries.
pub const ROUTING_HEADER_LEN: usize = 4;
/// Bytes of one entry.
pub const ENTRY_LEN: usize = 12;
/// Entries a sender puts in one message (the codec reads up to 255): `12 + 4 + 96 * 12` bytes of
/// frame fit the smallest `frameMax`, 1208 (§10.8).
pub const MAX_ENTRIES: usize = 96;

const TYPE_UPDATE: u8 = 0x01;
const TYPE_REQUEST: u8 = 0x02;

/// One destination's route as a neighbour advertises it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UpdateEntry {
    /// The edge gateway.
    pub destination: NodeId,
    /// The origin's seqno the route was learned with.
    pub seqno: Seqno,
    /// The sender's metric ([`Metric::INFINITY`]: a retraction).
    pub metric: Metric,
}

/// A request that the origin of `destination` issue a seqno of at least `seqno`; or, with the
/// reserved destination, a wildcard request: "send me a full update" (§10.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestEntry {
    /// The edge gateway ([`NodeId::RESERVED`]: a wildcard request).
    pub destination: NodeId,
    /// The seqno wanted (0 in a wildcard request).
    pub seqno: Seqno,
    /// How many more times it may be forwarded (>= 1; 1 in a wildcard request).
    pub hops: u8,
}

impl RequestEntry {
    /// The wildcard request a node sends on a link that leaves `Down` (§10.8): the neighbour
    /// answers with a full update, so a restarted node learns every route at once rather than
    /// at the next periodic update.
    pub const fn wildcard() -> RequestEntry {
        RequestEntry {
            destination: NodeId::RESERVED,
            seqno: Seqno(0),
            hops: 1,
        }
    }
    /// Whether this is a wildcard request.
    pub fn is_wildcard(&self) -> bool {
        self.destination.is_reserved()
    }
}

/// Update or seqno request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageType {
    /// Entries are [`UpdateEntry`]s.
    Update,
    /// Entries are [`RequestEntry`]s.
    Request,
}

/// A checked view of a routing message: after [`RoutingMessage::new_checked`] the entries tile
/// the message exactly and each obeys §10.9.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutingMessage<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> RoutingMessage<T> {
    /// Checks a frame's relay payload.
    pub fn new_checked(buffer: T) -> Result<Self, RelayError> {
        let b = buffer.as_ref();
        if b.len() < ROUTING_HEADER_LEN {
            return Err(RelayError::Truncated {
                what: "routing message",
                have: b.len(),
                need: ROUTING_HEADER_LEN,
            });
        }
        let ty = b[field::TYPE];
        if ty != TYPE_UPDATE && ty != TYPE_REQUEST {
            return Err(RelayError::BadRouting { field: "type" });
        }
        let count = usize::from(b[field::COUNT]);
        if count == 0 {
            return Err(RelayError::BadRouting { field: "count" });
        }
        if b[field::RESERVED] != [0, 0] {
            return Err(RelayError::BadRouting { field: "reserved" });
        }
        let need = ROUTING_HEADER_LEN + count * ENTRY_LEN;
        if b.len() < need {
            return Err(RelayError::Truncated {
                what: "routing message",
                have: b.len(),
                need,
            });
        }
        if b.len() != need {
            return Err(RelayError::BadRouting { field: "length" });
        }
        for e in b[ROUTING_HEADER_LEN..].chunks_exact(ENTRY_LEN) {
            // All-zero: only as a wildcard request (seqno 0, hops 1).
            if e[field::DESTINATION] == [0; NODE_ID_LEN]
                && (ty != TYPE_REQUEST || e[field::SEQNO] != [0, 0] || e[field::HOPS] != 1)
            {
                return Err(RelayError::BadRouting {
                    field: "destination",
                });
            }
            if ty == TYPE_REQUEST {
                if e[field::HOPS] == 0 {
                    return Err(RelayError::BadRouting { field: "hops" });
                }
                if e[field::ENTRY_RESERVED] != 0 {
                    return Err(RelayError::BadRouting { field: "reserved" });
                }
            }
        }
        Ok(Self { buffer })
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Update or request.
    pub fn message_type(&self) -> MessageType {
        if self.b()[field::TYPE] == TYPE_UPDATE {
            MessageType::Update
        } else {
            MessageType::Request
        }
    }
    /// Number of entries (1..=255).
    pub fn count(&self) -> usize {
        usize::from(self.b()[field::COUNT])
    }
    fn entries(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.b()[ROUTING_HEADER_LEN..].chunks_exact(ENTRY_LEN)
    }
    /// The entries of an update (none for a request).
    pub fn updates(&self) -> impl Iterator<Item = UpdateEntry> + '_ {
        let is_update = self.message_type() == MessageType::Update;
        self.entries()
            .filter(move |_| is_update)
            .map(|e| UpdateEntry {
                destination: read_node_id(e, field::DESTINATION.start),
                seqno: Seqno(read_u16(e, field::SEQNO.start)),
                metric: Metric(read_u16(e, field::METRIC.start)),
            })
    }
    /// The entries of a seqno request (none for an update).
    pub fn requests(&self) -> impl Iterator<Item = RequestEntry> + '_ {
        let is_request = self.message_type() == MessageType::Request;
        self.entries()
            .filter(move |_| is_request)
            .map(|e| RequestEntry {
                destination: read_node_id(e, field::DESTINATION.start),
                seqno: Seqno(read_u16(e, field::SEQNO.start)),
                hops: e[field::HOPS],
            })
    }
}

/// An owned routing message (what [`super::table::RoutingTable`] asks to send).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoutingRepr {
    /// Routes (1..=255 entries; senders use at most [`MAX_ENTRIES`]).
    Update(Vec<UpdateEntry>),
    /// Seqno requests (1..=255 entries).
    Request(Vec<RequestEntry>),
}

impl RoutingRepr {
    /// Reads a checked message (allocates: routing messages are control traffic, a few per
    /// second).
    pub fn parse<T: AsRef<[u8]>>(m: &RoutingMessage<T>) -> RoutingRepr {
        match m.message_type() {
            MessageType::Update => RoutingRepr::Update(m.updates().collect()),
            MessageType::Request => RoutingRepr::Request(m.requests().collect()),
        }
    }
    fn count(&self) -> usize {
        match self {
            RoutingRepr::Update(v) => v.len(),
            RoutingRepr::Request(v) => v.len(),
        }
    }
    /// Bytes `emit` writes.
    pub fn buffer_len(&self) -> usize {
        ROUTING_HEADER_LEN + self.count() * ENTRY_LEN
    }
    /// Writes the message into `buf[..buffer_len()]`. Refuses 0 or more than 255 entries, a
    /// reserved destination and a request with hops 0: what it writes always parses.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), RelayError> {
        let count = self.count();
        let count_byte = match u8::try_from(count) {
            Ok(c) if c > 0 => c,
            _ => return Err(RelayError::BadRouting { field: "count" }),
        };
        let need = self.buffer_len();
        let Some(out) = buf.get_mut(..need) else {
            return Err(RelayError::BufferTooSmall {
                have: buf.len(),
                need,
            });
        };
        let (head, body) = out.split_at_mut(ROUTING_HEADER_LEN);
        head.fill(0);
        head[field::COUNT] = count_byte;
        let entries = body.chunks_exact_mut(ENTRY_LEN);
        match self {
            RoutingRepr::Update(v) => {
                head[field::TYPE] = TYPE_UPDATE;
                for (e, u) in entries.zip(v) {
                    if u.destination.is_reserved() {
                        return Err(RelayError::BadRouting {
                            field: "destination",
                        });
                    }
                    e[field::DESTINATION].copy_from_slice(u.destination.as_bytes());
                    e[field::SEQNO].copy_from_slice(&u.seqno.0.to_be_bytes());
                    e[field::METRIC].copy_from_slice(&u.metric.0.to_be_bytes());
                }
            }
            RoutingRepr::Request(v) => {
                head[field::TYPE] = TYPE_REQUEST;
                for (e, r) in entries.zip(v) {
                    if r.destination.is_reserved() && *r != RequestEntry::wildcard() {
                        return Err(RelayError::BadRouting {
                            field: "destination",
                        });
                    }
                    if r.hops == 0 {
                        return Err(RelayError::BadRouting { field: "hops" });
                    }
                    e[field::DESTINATION].copy_from_slice(r.destination.as_bytes());
                    e[field::SEQNO].copy_from_slice(&r.seqno.0.to_be_bytes());
                    e[field::HOPS] = r.hops;
                    e[field::ENTRY_RESERVED] = 0;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::hex;
    use super::*;

    const A: NodeId = NodeId::from_bytes([0xaa; 8]);
    const B: NodeId = NodeId::from_bytes([0xbb; 8]);

    #[test]
    fn update_encode_decode() {
        let m = RoutingRepr::Update(vec![
            UpdateEntry {
                destination: A,
                seqno: Seqno(7),
                metric: Metric(50),
            },
            UpdateEntry {
                destination: B,
                seqno: Seqno(0xfffe),
                metric: Metric::INFINITY,
            },
        ]);
        let mut buf = vec![0x55u8; m.buffer_len()];
        m.emit(&mut buf).unwrap();
        assert_eq!(
            buf,
            hex("01 02 0000 aaaaaaaaaaaaaaaa 0007 0032 bbbbbbbbbbbbbbbb fffe ffff")
        );
        let v = RoutingMessage::new_checked(&buf[..]).unwrap();
        assert_eq!(v.message_type(), MessageType::Update);
        assert_eq!(v.count(), 2);
        assert_eq!(v.requests().count(), 0);
        assert_eq!(RoutingRepr::parse(&v), m);
    }

    #[test]
    fn request_encode_decode() {
        let m = RoutingRepr::Request(vec![RequestEntry {
            destination: A,
            seqno: Seqno(8),
            hops: 16,
        }]);
        let mut buf = vec![0x55u8; m.buffer_len()];
        m.emit(&mut buf).unwrap();
        assert_eq!(buf, hex("02 01 0000 aaaaaaaaaaaaaaaa 0008 10 00"));
        let v = RoutingMessage::new_checked(&buf[..]).unwrap();
        assert_eq!(v.message_type(), MessageType::Request);
        assert_eq!(v.updates().count(), 0);
        assert_eq!(RoutingRepr::parse(&v), m);
    }

    #[test]
    fn the_wildcard_request_is_the_one_entry_with_a_zero_destination() {
        let m = RoutingRepr::Request(vec![RequestEntry::wildcard()]);
        let mut buf = vec![0x55u8; m.buffer_len()];
        m.emit(&mut buf).unwrap();
        assert_eq!(buf, hex("02 01 0000 0000000000000000 0000 01 00"));
        let v = RoutingMessage::new_checked(&buf[..]).unwrap();
        let parsed: Vec<RequestEntry> = v.requests().collect();
        assert_eq!(parsed, [RequestEntry::wildcard()]);
        assert!(parsed[0].is_wildcard());
        // Any other zero-destination entry is refused, both ways.
        for bad in [
            "02 01 0000 0000000000000000 0001 01 00",
            "02 01 0000 0000000000000000 0000 02 00",
            "01 01 0000 0000000000000000 0000 0001",
        ] {
            assert_eq!(
                RoutingMessage::new_checked(hex(bad)).unwrap_err(),
                RelayError::BadRouting {
                    field: "destination"
                },
                "{bad}"
            );
        }
        let not_wildcard = RequestEntry {
            hops: 2,
            ..RequestEntry::wildcard()
        };
        assert!(RoutingRepr::Request(vec![not_wildcard])
            .emit(&mut buf)
            .is_err());
    }

    #[test]
    fn truncated_and_malformed() {
        let good = hex("01 01 0000 aaaaaaaaaaaaaaaa 0007 0032");
        for n in 0..good.len() {
            assert!(matches!(
                RoutingMessage::new_checked(&good[..n]),
                Err(RelayError::Truncated { .. })
            ));
        }
        let refuse = |b: Vec<u8>, field: &'static str| {
            assert_eq!(
                RoutingMessage::new_checked(b).unwrap_err(),
                RelayError::BadRouting { field }
            );
        };
        let with = |i: usize, v: u8| {
            let mut b = good.clone();
            b[i] = v;
            b
        };
        refuse(with(0, 0), "type");
        refuse(with(0, 3), "type");
        refuse(with(1, 0), "count");
        refuse(with(2, 1), "reserved");
        refuse(with(3, 1), "reserved");
        let mut long = good.clone();
        long.push(0);
        refuse(long, "length");
        let mut zero = good.clone();
        zero[4..12].fill(0);
        refuse(zero, "destination");
        // Requests: hops >= 1, reserved byte zero; the same bytes are a metric in an update.
        let req = hex("02 01 0000 aaaaaaaaaaaaaaaa 0007 10 00");
        assert!(RoutingMessage::new_checked(&req[..]).is_ok());
        let mut r = req.clone();
        r[14] = 0;
        refuse(r, "hops");
        let mut r = req.clone();
        r[15] = 1;
        refuse(r, "reserved");
        assert!(RoutingMessage::new_checked(with(14, 0)).is_ok());
    }

    #[test]
    fn writer_refuses_what_would_not_parse() {
        let mut buf = [0u8; 4096];
        assert!(RoutingRepr::Update(vec![]).emit(&mut buf).is_err());
        let e = UpdateEntry {
            destination: A,
            seqno: Seqno(0),
            metric: Metric(0),
        };
        assert!(RoutingRepr::Update(vec![e; 256]).emit(&mut buf).is_err());
        let m = RoutingRepr::Update(vec![e; 255]);
        m.emit(&mut buf).unwrap();
        assert!(RoutingMessage::new_checked(&buf[..m.buffer_len()]).is_ok());
        let reserved = UpdateEntry {
            destination: NodeId::RESERVED,
            ..e
        };
        assert!(RoutingRepr::Update(vec![reserved]).emit(&mut buf).is_err());
        let r = RequestEntry {
            destination: A,
            seqno: Seqno(0),
            hops: 0,
        };
        assert!(RoutingRepr::Request(vec![r]).emit(&mut buf).is_err());
        assert!(RoutingRepr::Update(vec![e]).emit(&mut [0u8; 15]).is_err());
    }
}
