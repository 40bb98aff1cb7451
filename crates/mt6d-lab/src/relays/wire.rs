//! Captures of relay links, and what they must not show: a true address (a host's, an edge
//! gateway's on its hosts' link, a node's configured `address`) anywhere in a frame, or an
//! 8-byte value of the UDP payload in two epochs of a link. Also when data frames crossed a
//! link, for the time a cut takes to route around.

use std::collections::HashMap;
use std::net::SocketAddrV6;
use std::path::PathBuf;

use mt6d_os::unique_name;
use serde::Serialize;

use super::RelayLab;
use crate::linker;
use crate::observer::{Observer, ObserverReport};
use crate::transfer;

/// Frames at least this long on the wire carry data: probes, replies and routing messages are
/// padded to the smaller size classes (docs/PROTOCOL.md §10.4), a full TCP segment to the
/// largest.
pub const DATA_FRAME_MIN: u32 = 1000;
/// Frames of each epoch of a link whose every 8-byte window is compared with the other epochs'.
const REPEAT_SAMPLE: usize = 64;

impl RelayLab {
    /// Starts a capture on each of `links` (at its `a` end; both directions), watching for
    /// [`RelayLab::true_addresses`].
    pub fn watch(&self, links: &[usize]) -> Result<WireWatch, String> {
        let mut observers = Vec::with_capacity(links.len());
        for &l in links {
            let link = &self.links[l];
            let pcap = self
                .dir
                .join(format!("{}-{}.pcap", link.name, unique_name("c")));
            let o = Observer::start(
                &self.nodes[link.a].ns,
                &link.if_a,
                self.true_addresses(),
                Some(pcap.clone()),
            )?;
            observers.push((link.name.clone(), o, pcap));
        }
        Ok(WireWatch { observers })
    }
}

/// Captures running on some links.
#[derive(Debug)]
pub struct WireWatch {
    observers: Vec<(String, Observer, PathBuf)>,
}

/// What one link's capture showed.
#[derive(Debug, Clone, Serialize)]
pub struct LinkWire {
    pub link: String,
    pub frames: u64,
    pub udp_frames: u64,
    pub frames_with_true_address: u64,
    pub first_leak: Option<String>,
    /// Distinct outer (address, port) pairs: the link's epochs seen.
    pub epochs: usize,
    /// 8-byte values of the UDP payload seen in two epochs (must be empty).
    pub repeated: Vec<String>,
    /// Unix times of the frames of [`DATA_FRAME_MIN`] bytes or more.
    #[serde(skip)]
    pub data_frames_at: Vec<f64>,
}

impl WireWatch {
    /// Stops every capture and checks what it saw.
    pub fn finish(self) -> Result<Vec<LinkWire>, String> {
        let mut wires = Vec::with_capacity(self.observers.len());
        let mut first_error = None;
        for (link, observer, pcap) in self.observers {
            let result = observer.finish().and_then(|report| {
                let frames = linker::read_pcap(&pcap).map_err(|e| e.to_string())?;
                Ok(link_wire(&link, &report, &frames))
            });
            let _ = std::fs::remove_file(&pcap);
            match result {
                Ok(w) => wires.push(w),
                Err(e) => first_error = first_error.or(Some(format!("capture of {link}: {e}"))),
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(wires),
        }
    }
}

fn link_wire(link: &str, report: &ObserverReport, frames: &[linker::Frame]) -> LinkWire {
    let (epochs, repeated) = repeated_values(frames);
    LinkWire {
        link: link.to_string(),
        frames: report.frames,
        udp_frames: report.udp_frames,
        frames_with_true_address: report.frames_with_true_address,
        first_leak: report.first_leak.clone(),
        epochs,
        repeated,
        data_frames_at: frames
            .iter()
            .filter(|f| f.wire_len >= DATA_FRAME_MIN && udp(&f.bytes).is_some())
            .map(|f| f.ts)
            .collect(),
    }
}

/// An Ethernet/IPv6/UDP frame's (unordered endpoint pair, UDP payload as captured).
fn udp(frame: &[u8]) -> Option<((SocketAddrV6, SocketAddrV6), &[u8])> {
    let ip = frame.get(14..54)?;
    if frame.get(12..14)? != [0x86, 0xdd] || ip[0] >> 4 != 6 || ip[6] != 17 {
        return None;
    }
    let src: [u8; 16] = ip[8..24].try_into().ok()?;
    let dst: [u8; 16] = ip[24..40].try_into().ok()?;
    let ports = frame.get(54..58)?;
    let a = SocketAddrV6::new(src.into(), u16::from_be_bytes([ports[0], ports[1]]), 0, 0);
    let b = SocketAddrV6::new(dst.into(), u16::from_be_bytes([ports[2], ports[3]]), 0, 0);
    let key = if (a.ip(), a.port()) <= (b.ip(), b.port()) {
        (a, b)
    } else {
        (b, a)
    };
    Some((key, frame.get(62..)?))
}

/// Groups the UDP frames by endpoint pair (one pair per epoch of the link: addresses and ports
/// hop every epoch) and looks for an 8-byte value of the payload, at any offset, in the first
/// [`REPEAT_SAMPLE`] frames of two different epochs: a field that stays while the addresses
/// change would let an observer tie the epochs together. Everything on a link is ciphertext or
/// masked, so a random repeat has odds of about 2^-64 per pair of windows.
fn repeated_values(frames: &[linker::Frame]) -> (usize, Vec<String>) {
    let mut epochs: HashMap<(SocketAddrV6, SocketAddrV6), (usize, usize)> = HashMap::new();
    let mut seen: HashMap<[u8; 8], usize> = HashMap::new();
    let mut repeated = Vec::new();
    for f in frames {
        let Some((key, payload)) = udp(&f.bytes) else {
            continue;
        };
        let next = epochs.len();
        let (epoch, sampled) = epochs.entry(key).or_insert((next, 0));
        if *sampled >= REPEAT_SAMPLE {
            continue;
        }
        *sampled += 1;
        for w in payload.windows(8) {
            let Ok(value) = <[u8; 8]>::try_from(w) else {
                continue;
            };
            let first = *seen.entry(value).or_insert(*epoch);
            if first != *epoch && repeated.len() < 10 {
                repeated.push(format!(
                    "{} in epochs {first} and {epoch}",
                    transfer::hex(&value)
                ));
            }
        }
    }
    (epochs.len(), repeated)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(src: SocketAddrV6, dst: SocketAddrV6, payload: &[u8]) -> linker::Frame {
        let mut f = vec![0u8; 62];
        f[12] = 0x86;
        f[13] = 0xdd;
        f[14] = 0x60;
        f[14 + 6] = 17;
        f[22..38].copy_from_slice(&src.ip().octets());
        f[38..54].copy_from_slice(&dst.ip().octets());
        f[54..56].copy_from_slice(&src.port().to_be_bytes());
        f[56..58].copy_from_slice(&dst.port().to_be_bytes());
        f.extend_from_slice(payload);
        linker::Frame {
            ts: 0.0,
            wire_len: f.len() as u32,
            bytes: f,
        }
    }

    fn ep(s: &str) -> SocketAddrV6 {
        s.parse().expect("literal")
    }

    #[test]
    fn a_value_repeated_across_epochs_is_found_and_one_within_an_epoch_is_not() {
        let (a, b) = (
            ep("[2001:db8:ff:1::aa]:1000"),
            ep("[2001:db8:ff:2::bb]:2000"),
        );
        let (c, d) = (
            ep("[2001:db8:ff:1::cc]:3000"),
            ep("[2001:db8:ff:2::dd]:4000"),
        );
        let mut x = [0u8; 40];
        let mut y = [0u8; 40];
        for (i, (p, q)) in x.iter_mut().zip(y.iter_mut()).enumerate() {
            *p = i as u8;
            *q = 200 - i as u8;
        }
        // Both directions of one epoch are one epoch; the same bytes twice in it are fine.
        let one_epoch = [frame(a, b, &x), frame(b, a, &x)];
        assert_eq!(repeated_values(&one_epoch), (1, vec![]));
        let (epochs, found) = repeated_values(&[frame(a, b, &x), frame(c, d, &y)]);
        assert_eq!((epochs, found.len()), (2, 0));
        // Eight bytes of the first epoch's payload, at another offset, in the second's.
        y[20..28].copy_from_slice(&x[3..11]);
        let (_, found) = repeated_values(&[frame(a, b, &x), frame(c, d, &y)]);
        assert_eq!(
            found,
            vec!["030405060708090a in epochs 0 and 1".to_string()]
        );
    }
}
