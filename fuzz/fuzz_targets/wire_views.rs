//! Every accessor of every checked view over arbitrary bytes: must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mt6d_proto::tunnel::TunnelPayload;
use mt6d_proto::wire::{
    advertisement_frame, Icmpv6Packet, Icmpv6Repr, Ipv6Packet, Ipv6Repr, NeighborClaim,
    NeighborFrame, RouterMessage, UdpPacket, UdpRepr,
};
use mt6d_proto::Mode;

fuzz_target!(|data: &[u8]| {
    for p in [
        Ipv6Packet::new_checked(data),
        Ipv6Packet::new_checked_header(data),
    ]
    .into_iter()
    .flatten()
    {
        let r = Ipv6Repr::parse(&p);
        let _ = (p.payload(), p.header_without_addrs(), p.into_payload());
        let mut buf = [0u8; 40];
        r.emit(&mut buf).unwrap();
        assert_eq!(
            Ipv6Repr::parse(&Ipv6Packet::new_checked_header(&buf[..]).unwrap()),
            r
        );
    }
    for p in [
        UdpPacket::new_checked(data),
        UdpPacket::new_checked_header(data),
    ]
    .into_iter()
    .flatten()
    {
        let _ = (
            UdpRepr::parse(&p),
            p.payload(),
            p.is_empty(),
            p.checksum(),
            p.into_payload(),
        );
        let _ = p.verify_checksum(
            "2001:db8::1".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
        );
    }
    if let Ok(p) = Icmpv6Packet::new_checked(data) {
        let _ = (
            Icmpv6Repr::parse(&p),
            p.payload(),
            p.verify_checksum("::1".parse().unwrap(), "::2".parse().unwrap()),
        );
    }
    if let Ok(m) = RouterMessage::new_checked(data) {
        let _ = (
            m.is_advertisement(),
            m.router_lifetime(),
            m.mtu(),
            m.source_lladdr(),
        );
        // Options tile the message exactly.
        let fixed = if m.is_advertisement() { 16 } else { 8 };
        assert_eq!(
            fixed + m.options().map(|(_, o)| o.len()).sum::<usize>(),
            data.len()
        );
    }
    if let Ok(f) = NeighborFrame::parse(data) {
        let _ = f.claimed_by_other([2, 0, 0, 0, 0, 1]);
        // The server role's answer to any solicitation that parses is itself a valid
        // advertisement for the same target, from us.
        if let Some(na) = advertisement_frame(&f, [2, 0, 0, 0, 0, 1]) {
            let back = NeighborFrame::parse(&na).unwrap();
            assert_eq!(back.claim, NeighborClaim::Advertisement);
            assert_eq!(back.target, f.target);
            assert_eq!(back.lladdr, Some([2, 0, 0, 0, 0, 1]));
        }
    }
    for mode in [Mode::Plain, Mode::Auth, Mode::Encrypt] {
        if let Ok(t) = TunnelPayload::new_checked(data, mode) {
            let _ = (
                t.counter(),
                t.body(),
                t.tag(),
                t.authenticated(),
                t.inner_payload_len(),
            );
        }
    }
});
