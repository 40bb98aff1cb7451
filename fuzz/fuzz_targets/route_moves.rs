//! Address collisions from the network (docs/PROTOCOL.md §5.2): neighbour discovery frames from
//! the link, and route move notices from the peer's route, raw (stopped by the view or the MAC)
//! and framed with a valid MAC so the agreement state machine is reached. Must never panic;
//! offsets only grow and never pass MAX_OFFSET; raw bytes never move a route.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mt6d_proto::moves::{Evidence, NoticePacket, RouteMoves, MAX_OFFSET};
use mt6d_proto::wire::NeighborFrame;
use mt6d_proto::{Endpoint, Epoch, SessionKey, Stream, StreamConfig, UnixTime};

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = NeighborFrame::parse(data) {
        let _ = f.claimed_by_other([2, 0, 0, 0, 0, 1]);
    }
    if let Ok(n) = NoticePacket::new_checked(data) {
        let _ = (n.epoch(), n.offset(), n.is_ack());
    }
    let cfg = StreamConfig::new(
        Endpoint::new("2001:db8:a::1".parse().unwrap()),
        Endpoint::new("2001:db8:b::2".parse().unwrap()),
        SessionKey::from_bytes(&[7; 32]).unwrap(),
    );
    let a = Stream::new(cfg.clone()).unwrap();
    let b = Stream::new(cfg.mirrored()).unwrap();
    let (sender, mut rx) = (RouteMoves::new(&a), RouteMoves::new(&b));
    let current = Epoch(1_000);
    let now = UnixTime::from_secs(1_800_000_000);
    let on = b.route(current);
    // Raw bytes, unmasked as the gateway does (§4.5): no valid MAC, so nothing moves.
    let _ = rx.handle_notice(now, current, &on, data);
    let mut unmasked = data.to_vec();
    if b.recv_header_key()
        .unwrap()
        .unprotect(&mut unmasked)
        .is_ok()
    {
        let _ = rx.handle_notice(now, current, &on, &unmasked);
    }
    assert!(rx.handle_link(&on, data).is_err());
    let mac = [data.first().copied().unwrap_or(0) & 0xfe, 1, 2, 3, 4, 5];
    // Stamped one millisecond into the route's epoch (§5.5: a stamp outside it is stale).
    let stamp = UnixTime::from_nanos(a.epoch_start(current).as_nanos() + 1_000_000);
    assert_eq!(
        rx.handle_link(&on, &sender.frame_link(&a.route(current), mac, stamp)),
        Ok((mac, stamp))
    );
    for e in 998..=1_003 {
        assert_eq!(rx.offset(Epoch(e)), 0);
    }
    // A sequence of genuine notices and acks, and collisions, driven by the bytes.
    let mut last = [0u8; 6];
    for chunk in data.chunks(3) {
        let [sel, e, k] = *chunk else { break };
        let epoch = Epoch(999 + u64::from(e % 6));
        if sel & 1 == 0 {
            let msg =
                sender.frame_notice(&a.route(current), epoch, k % (MAX_OFFSET + 2), sel & 2 != 0);
            let _ = rx.handle_notice(now, current, &on, &msg);
        } else {
            let evidence = if sel & 2 == 0 {
                Evidence::Unconfirmed
            } else {
                Evidence::Confirmed
            };
            let _ = rx.on_collision(now, current, epoch, k % (MAX_OFFSET + 2), evidence);
        }
        let mut out = [0u8; 32];
        let sch = b.schedule_moved(now, &rx);
        while rx.poll_transmit(now, &sch, &mut out).is_some() {
            NoticePacket::new_checked(&out).unwrap();
        }
        for (i, e) in (999..=1_004).enumerate().take(6) {
            let k = rx.offset(Epoch(e));
            assert!(k <= MAX_OFFSET);
            assert!(k >= last[i], "an offset went back");
            last[i] = k;
        }
    }
});
