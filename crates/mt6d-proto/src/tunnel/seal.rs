//! Encapsulation: inner IPv6 packet -> tunnel payload (UDP payload).

use std::cell::RefCell;
use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicU64, Ordering};

use ring::aead::{Aad, LessSafeKey};

use super::{
    nonce, outer_aad, payload_len, SealError, COUNTER_LEN, COUNTER_LIMIT, INNER_HEADER_CARRIED,
    OUTER_AAD_LEN, TAG_LEN,
};
use crate::wire::{Ipv6Packet, IPV6_HEADER_LEN};
use crate::{Mode, Route, UnixTime};

thread_local! {
    /// Auth-mode AAD is outer fields || counter || clear bytes, which ring needs contiguous. One
    /// buffer per thread: it grows to the largest packet once, then nothing is allocated per packet.
    static AAD_SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Seals inner packets of one stream, one direction. `Send + Sync`: share it between sending threads.
///
/// The counter starts at the `now` given to [`crate::Stream::sealer`] in nanoseconds and grows by one
/// per packet, so a restarted gateway never reuses a (key, nonce) pair (docs/PROTOCOL.md §4.3).
#[derive(Debug)]
pub struct Sealer {
    mode: Mode,
    key: Option<LessSafeKey>,
    counter: AtomicU64,
    local_true: Ipv6Addr,
    remote_true: Ipv6Addr,
}

impl Sealer {
    pub(crate) fn new(
        mode: Mode,
        key: Option<LessSafeKey>,
        now: UnixTime,
        local_true: Ipv6Addr,
        remote_true: Ipv6Addr,
    ) -> Self {
        Self {
            mode,
            key,
            counter: AtomicU64::new(now.as_nanos()),
            local_true,
            remote_true,
        }
    }

    /// The counter the next packet will use.
    pub fn next_counter(&self) -> u64 {
        self.counter.load(Ordering::Relaxed)
    }

    /// Seals `inner` (one whole IPv6 packet from the local true address to the remote true address)
    /// for `route`, writing the UDP payload into `out`. Returns the payload length.
    pub fn seal(&self, route: &Route, inner: &[u8], out: &mut [u8]) -> Result<usize, SealError> {
        let pkt = Ipv6Packet::new_checked(inner).map_err(SealError::Malformed)?;
        if pkt.src_addr() != self.local_true {
            return Err(SealError::WrongSource);
        }
        if pkt.dst_addr() != self.remote_true {
            return Err(SealError::WrongDestination);
        }
        let need = payload_len(self.mode, inner.len());
        if out.len() < need {
            return Err(SealError::BufferTooSmall {
                have: out.len(),
                need,
            });
        }
        let out = &mut out[..need];
        let hdr = pkt.header_without_addrs();
        let body = &inner[IPV6_HEADER_LEN..];
        let (Some(key), Mode::Auth | Mode::Encrypt) = (&self.key, self.mode) else {
            out[..INNER_HEADER_CARRIED].copy_from_slice(hdr);
            out[INNER_HEADER_CARRIED..].copy_from_slice(body);
            return Ok(need);
        };
        let counter = self.next()?;
        out[..COUNTER_LEN].copy_from_slice(&counter.to_be_bytes());
        let clear_end = need - TAG_LEN;
        out[COUNTER_LEN..COUNTER_LEN + INNER_HEADER_CARRIED].copy_from_slice(hdr);
        out[COUNTER_LEN + INNER_HEADER_CARRIED..clear_end].copy_from_slice(body);
        let outer = outer_aad(&route.local, &route.remote, counter);
        let tag = if self.mode == Mode::Encrypt {
            key.seal_in_place_separate_tag(
                nonce(counter),
                Aad::from(outer),
                &mut out[COUNTER_LEN..clear_end],
            )
        } else {
            AAD_SCRATCH.with(|s| {
                let mut s = s.borrow_mut();
                s.clear();
                s.reserve(OUTER_AAD_LEN + clear_end);
                s.extend_from_slice(&outer[..OUTER_AAD_LEN - COUNTER_LEN]);
                s.extend_from_slice(&out[..clear_end]);
                key.seal_in_place_separate_tag(nonce(counter), Aad::from(&s[..]), &mut [])
            })
        };
        // ring fails only if the input exceeds the AEAD's per-nonce limit (2^36 bytes for GCM); IPv6
        // packets are below 2^16 bytes.
        #[allow(clippy::expect_used)]
        let tag = tag.expect("IPv6 packet within AEAD length limit");
        out[clear_end..].copy_from_slice(tag.as_ref());
        Ok(need)
    }

    fn next(&self) -> Result<u64, SealError> {
        let c = self.counter.fetch_add(1, Ordering::Relaxed);
        if c >= COUNTER_LIMIT {
            // Keep it pinned so repeated calls keep failing instead of wrapping back to valid values.
            self.counter.store(COUNTER_LIMIT, Ordering::Relaxed);
            return Err(SealError::CounterExhausted);
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{addr, pair, udp, A, B};
    use crate::{AeadAlg, Epoch};

    #[test]
    fn refuses_foreign_and_malformed_packets() {
        let (a, _) = pair(Mode::Encrypt, AeadAlg::Aes256Gcm);
        let s = a.sealer(UnixTime::from_secs(1_700_000_000));
        let r = a.route(Epoch(1));
        let mut out = [0u8; 2048];
        let ok = udp(addr(A), addr(B), b"hi");
        assert!(s.seal(&r, &ok, &mut out).is_ok());
        assert_eq!(
            s.seal(&r, &udp(addr(B), addr(B), b"x"), &mut out),
            Err(SealError::WrongSource)
        );
        assert_eq!(
            s.seal(&r, &udp(addr(A), addr(A), b"x"), &mut out),
            Err(SealError::WrongDestination)
        );
        assert!(matches!(
            s.seal(&r, &ok[..39], &mut out),
            Err(SealError::Malformed(_))
        ));
        assert!(matches!(
            s.seal(&r, &ok[..ok.len() - 1], &mut out),
            Err(SealError::Malformed(_))
        ));
        assert_eq!(
            s.seal(&r, &ok, &mut out[..ok.len() - 9]),
            Err(SealError::BufferTooSmall {
                have: ok.len() - 9,
                need: ok.len() - 8
            })
        );
    }

    #[test]
    fn counter_starts_at_now_and_never_reaches_the_high_bit() {
        let (a, _) = pair(Mode::Auth, AeadAlg::ChaCha20Poly1305);
        let now = UnixTime::from_nanos(1_700_000_000_123_456_789);
        let s = a.sealer(now);
        let r = a.route(Epoch(1));
        let mut out = [0u8; 256];
        let pkt = udp(addr(A), addr(B), b"hi");
        s.seal(&r, &pkt, &mut out).unwrap();
        assert_eq!(
            u64::from_be_bytes(out[..8].try_into().unwrap()),
            now.as_nanos()
        );
        assert_eq!(s.next_counter(), now.as_nanos() + 1);
        let s = a.sealer(UnixTime::from_nanos(COUNTER_LIMIT - 1));
        assert!(s.seal(&r, &pkt, &mut out).is_ok());
        assert_eq!(s.seal(&r, &pkt, &mut out), Err(SealError::CounterExhausted));
        assert_eq!(s.seal(&r, &pkt, &mut out), Err(SealError::CounterExhausted));
    }

    #[test]
    fn plain_is_exactly_the_thesis_layout() {
        let (a, _) = pair(Mode::Plain, AeadAlg::Aes256Gcm);
        let s = a.sealer(UnixTime::from_secs(1));
        let pkt = udp(addr(A), addr(B), b"payload");
        let mut out = [0u8; 256];
        let n = s.seal(&a.route(Epoch(3)), &pkt, &mut out).unwrap();
        assert_eq!(n, pkt.len() - 32);
        assert_eq!(&out[..8], &pkt[..8]);
        assert_eq!(&out[8..n], &pkt[40..]);
    }
}
