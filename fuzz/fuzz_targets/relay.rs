//! Every relay parser (docs/PROTOCOL.md §10) over arbitrary bytes, and the routing table and
//! link monitor fed what parses: must never panic.
//!
//! - `RelayFrame`, `Probe`, `RoutingMessage`, `E2ePayload`: every accessor of whatever passes
//!   `new_checked`; what passes re-encodes to the same bytes (the writers write every byte).
//! - The input is also read as a sequence of frames arriving on one of four links of a relay and
//!   of an edge gateway, with time steps between them: routing messages go to the table, probe
//!   replies to the link's monitor, data frames to the forwarding decision. A timeout must never
//!   leave work due at the same instant (a driver sleeping until `poll_timeout` would spin).
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use mt6d_proto::relay::cost::LinkMonitor;
use mt6d_proto::relay::e2e::E2ePayload;
use mt6d_proto::relay::frame::{frame_len, DEFAULT_FRAME_MAX};
use mt6d_proto::relay::probe::{Probe, ProbeRepr, ProbeType};
use mt6d_proto::relay::routing::{MessageType, RoutingMessage, RoutingRepr};
use mt6d_proto::relay::table::{Forward, Neighbour, RoutingTable};
use mt6d_proto::relay::{Kind, NodeId, RelayFrame, RelayRepr};
use mt6d_proto::UnixTime;

fn views(data: &[u8]) {
    if let Ok(f) = RelayFrame::new_checked(data) {
        let repr = RelayRepr::parse(&f);
        let _ = (
            f.kind(),
            f.hops(),
            f.destination(),
            f.payload(),
            f.as_bytes(),
        );
        assert_eq!(f.payload_len(), f.payload().len());
        assert_eq!(repr.kind.is_forwarded(), !repr.destination.is_reserved());
        // Header and padding re-encode to the same bytes.
        let mut copy = data.to_vec();
        repr.emit(&mut copy).unwrap();
        assert_eq!(copy, data);
        // The size-class writer puts the same header and payload into a frame that parses.
        let mut buf = vec![0u8; DEFAULT_FRAME_MAX];
        if let Ok(n) = repr.write_frame(f.payload(), DEFAULT_FRAME_MAX, &mut buf) {
            assert_eq!(n, frame_len(f.payload().len(), DEFAULT_FRAME_MAX));
            let back = RelayFrame::new_checked(&buf[..n]).unwrap();
            assert_eq!(RelayRepr::parse(&back), repr);
        }
        let _ = f.into_payload();
    }
    if let Ok(p) = Probe::new_checked(data) {
        let r = ProbeRepr::parse(&p);
        assert_eq!(&r.to_bytes()[..], data);
        assert_eq!(r.reply().sequence, p.sequence());
    }
    if let Ok(m) = RoutingMessage::new_checked(data) {
        let _ = (m.message_type(), m.count());
        assert_eq!(m.updates().count() + m.requests().count(), m.count());
        let r = RoutingRepr::parse(&m);
        let mut out = vec![0u8; r.buffer_len()];
        r.emit(&mut out).unwrap();
        assert_eq!(out, data);
    }
    if let Ok(e) = E2ePayload::new_checked(data) {
        let _ = (e.tag(), e.payload());
    }
}

/// One end of one link: its handle in the table and its monitor.
struct End {
    monitor: LinkMonitor,
}

fn drive(data: &[u8], mut table: RoutingTable) {
    let mut now = UnixTime::from_secs(1_700_000_000);
    let mut ends: Vec<End> = (0..4)
        .map(|_| End {
            monitor: LinkMonitor::new(now),
        })
        .collect();
    let mut rest = data;
    // Each record: link (1), time step in ms (1), length (1), frame bytes.
    while let [link, step, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (frame, next) = tail.split_at(n);
        rest = next;
        now = now.saturating_add(Duration::from_millis(u64::from(*step) * 7));
        let l = usize::from(*link % 4);
        let nb = Neighbour(u32::from(*link % 4));
        for (i, e) in ends.iter_mut().enumerate() {
            while e.monitor.poll_probe(now, u32::from(*step) * 977).is_some() {}
            e.monitor.handle_timeout(now);
            if let Some(c) = e.monitor.poll_cost_change() {
                table.handle_link_cost(now, Neighbour(u32::try_from(i).unwrap()), c);
            }
        }
        table.handle_timeout(now);
        assert!(table.poll_timeout() > now, "table work left due");
        for e in &ends {
            assert!(e.monitor.poll_timeout() > now, "monitor work left due");
        }
        let Ok(f) = RelayFrame::new_checked(frame) else {
            continue;
        };
        match f.kind() {
            Kind::Probe => {
                if let Ok(p) = Probe::new_checked(f.payload()) {
                    if p.probe_type() == ProbeType::Reply {
                        ends[l].monitor.handle_reply(now, p.sequence());
                        if let Some(c) = ends[l].monitor.poll_cost_change() {
                            table.handle_link_cost(now, nb, c);
                        }
                    }
                }
            }
            Kind::Routing => {
                if let Ok(m) = RoutingMessage::new_checked(f.payload()) {
                    match m.message_type() {
                        MessageType::Update => table.handle_update(now, nb, m.updates()),
                        MessageType::Request => table.handle_request(now, nb, m.requests()),
                    }
                }
            }
            Kind::Data | Kind::E2eHandshake => {
                let repr = RelayRepr::parse(&f);
                for originated in [false, true] {
                    match table.forward(&repr, originated) {
                        Forward::Send { to, hops } => {
                            assert_eq!(table.next_hop(&repr.destination), Some(to));
                            assert!(originated || hops < repr.hops);
                        }
                        Forward::Deliver | Forward::Drop(_) => {}
                    }
                }
            }
        }
        // Everything the table asks to send encodes into a frame that parses.
        while let Some(t) = table.poll_transmit() {
            assert!(t.to.0 < 4);
            let mut body = vec![0u8; t.message.buffer_len()];
            t.message.emit(&mut body).unwrap();
            let len = u16::try_from(body.len()).unwrap();
            let mut buf = vec![0u8; DEFAULT_FRAME_MAX];
            let n = RelayRepr::link_local(Kind::Routing, len)
                .write_frame(&body, DEFAULT_FRAME_MAX, &mut buf)
                .unwrap();
            let back = RelayFrame::new_checked(&buf[..n]).unwrap();
            RoutingMessage::new_checked(back.payload()).unwrap();
        }
        for (_, r) in table.routes() {
            assert!(r.metric.is_finite());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    views(data);
    let now = UnixTime::from_secs(1_700_000_000);
    drive(data, RoutingTable::relay(now));
    let own = NodeId::from_bytes([0xaa, 0, 0, 0, 0, 0, 0, 1]);
    drive(data, RoutingTable::edge(now, own));
});
