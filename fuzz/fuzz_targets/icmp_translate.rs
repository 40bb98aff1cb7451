//! ICMPv6 error translation and packet-too-big generation over arbitrary packets: never panics,
//! and any output is a checksummed IPv6/ICMPv6 packet of at most 1280 bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mt6d_proto::icmp::{packet_too_big, quoted_route, translate_path_error, SentLog, MIN_MTU};
use mt6d_proto::wire::{Icmpv6Packet, Ipv6Packet};
use mt6d_proto::{Endpoint, Epoch, Mode, Route, SessionKey, Stream, StreamConfig};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, pkt)) = data.split_first() else {
        return;
    };
    let mut c = StreamConfig::new(
        Endpoint::new("2001:db8:a::1".parse().unwrap()),
        Endpoint::new("2001:db8:b::2".parse().unwrap()),
        SessionKey::from_bytes(&[0x42; 32]).unwrap(),
    );
    c.mode = [Mode::Plain, Mode::Auth, Mode::Encrypt][usize::from(sel % 3)];
    let s = Stream::new(c).unwrap();
    let gw = "2001:db8:a::fe".parse().unwrap();
    // Use the quoted addresses as the route when they parse, so the deeper paths are reached.
    let route = match quoted_route(pkt) {
        Ok((local, remote)) => Route {
            epoch: Epoch(0),
            local,
            remote,
        },
        Err(_) => s.route(Epoch(0)),
    };
    // Record the quoted payload as sent (as far as it is quoted, with the length its UDP header
    // claims) so the checks after the sent-packet log are reached too.
    let sent = SentLog::new();
    if let Some(udp) = pkt.get(48 + 40..) {
        if udp.len() >= 8 {
            let claimed = usize::from(u16::from_be_bytes([udp[4], udp[5]])).saturating_sub(8);
            let mut payload = udp[8..].to_vec();
            payload.resize(claimed, 0);
            sent.record(&payload);
        }
    }
    let mut out = vec![0u8; MIN_MTU];
    if let Ok(t) = translate_path_error(&s, &route, &sent, pkt, gw, &mut out) {
        check(&out[..t.len]);
    }
    if let Ok(n) = packet_too_big(gw, u32::from(sel) << 4, pkt, &mut out) {
        check(&out[..n]);
    }
});

fn check(out: &[u8]) {
    assert!(out.len() <= MIN_MTU);
    let ip = Ipv6Packet::new_checked(out).expect("valid IPv6");
    let icmp = Icmpv6Packet::new_checked(ip.payload()).expect("ICMPv6 header");
    assert!(icmp.verify_checksum(ip.src_addr(), ip.dst_addr()));
}
