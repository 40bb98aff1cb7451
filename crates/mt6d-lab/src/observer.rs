//! The observer on the public link: captures every frame between the gateways, optionally writes
//! a pcap file, and answers the two questions the demo and the tests ask of the wire:
//! did any frame carry a true address, and how many distinct outer address pairs were seen?

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::Ipv6Addr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mt6d_os::capture::PacketCapture;
use mt6d_os::Netns;

/// Bytes of each frame kept: Ethernet 14 + outer IPv6 40 + UDP 8 + tunnel header 16, with room
/// for the side channels the linker reads (an ICMPv6 error's quoted header, the first records of
/// an MLDv2 report). The leak scan covers these bytes; the outer headers are inside.
pub const SNAPLEN: u32 = 256;

/// What the observer saw.
#[derive(Debug, Clone, Default)]
pub struct ObserverReport {
    pub frames: u64,
    pub udp_frames: u64,
    /// Frames in which one of the watched true addresses appears anywhere in the captured bytes.
    pub frames_with_true_address: u64,
    /// The first such frame, described, for the error message.
    pub first_leak: Option<String>,
    /// Distinct (source, destination) of outer IPv6/UDP packets.
    pub outer_pairs: BTreeSet<(Ipv6Addr, Ipv6Addr)>,
    /// Outer IPv6/UDP packets per (source, destination).
    pub udp_per_pair: BTreeMap<(Ipv6Addr, Ipv6Addr), u64>,
}

/// A running capture; `finish` stops it and returns the report.
#[derive(Debug)]
pub struct Observer {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<ObserverReport, String>>,
}

impl Observer {
    /// Starts capturing `interface` inside namespace `ns`, watching for `true_addresses`.
    pub fn start(
        ns: &Netns,
        interface: &str,
        true_addresses: Vec<Ipv6Addr>,
        pcap: Option<PathBuf>,
    ) -> Result<Observer, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let ns_name = ns.name().to_string();
        let interface = interface.to_string();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let opened = Netns::open(&ns_name)
                    .and_then(|n| n.enter_current_thread())
                    .and_then(|()| {
                        PacketCapture::open(&interface, SNAPLEN, Duration::from_millis(100))
                    })
                    .map_err(|e| format!("observer on {interface} in {ns_name}: {e}"));
                let cap = match opened {
                    Ok(c) => {
                        let _ = ready_tx.send(Ok(()));
                        c
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.clone()));
                        return Err(e);
                    }
                };
                observe(&cap, &stop, &true_addresses, pcap)
            }
        });
        match ready_rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Ok(())) => Ok(Observer { stop, thread }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("observer did not start within 5 s".into()),
        }
    }

    pub fn finish(self) -> Result<ObserverReport, String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| "observer thread panicked".to_string())?
    }
}

fn observe(
    cap: &PacketCapture,
    stop: &AtomicBool,
    watched: &[Ipv6Addr],
    pcap: Option<PathBuf>,
) -> Result<ObserverReport, String> {
    let mut writer = match &pcap {
        Some(path) => Some(
            PcapWriter::create(path, SNAPLEN).map_err(|e| format!("{}: {e}", path.display()))?,
        ),
        None => None,
    };
    let needles: Vec<[u8; 16]> = watched.iter().map(|a| a.octets()).collect();
    let mut report = ObserverReport::default();
    let mut buf = vec![0u8; SNAPLEN as usize + 64];
    while !stop.load(Ordering::Relaxed) {
        let frame = match cap.recv(&mut buf) {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(e) => return Err(e.to_string()),
        };
        let bytes = &buf[..frame.captured];
        report.frames += 1;
        if let Some(w) = writer.as_mut() {
            w.write(bytes, frame.wire_len)
                .map_err(|e| format!("pcap: {e}"))?;
        }
        if let Some(needle) = needles.iter().find(|n| bytes.windows(16).any(|w| w == **n)) {
            report.frames_with_true_address += 1;
            if report.first_leak.is_none() {
                report.first_leak = Some(format!(
                    "frame {} ({} bytes) carries {}",
                    report.frames,
                    frame.wire_len,
                    Ipv6Addr::from(*needle)
                ));
            }
        }
        if let Some(pair) = outer_udp_pair(bytes) {
            report.udp_frames += 1;
            report.outer_pairs.insert(pair);
            *report.udp_per_pair.entry(pair).or_default() += 1;
        }
    }
    if let Some(w) = writer.as_mut() {
        w.flush().map_err(|e| format!("pcap: {e}"))?;
    }
    Ok(report)
}

/// Source and destination of an Ethernet/IPv6/UDP frame (no extension headers: the tunnel never
/// sends any).
fn outer_udp_pair(frame: &[u8]) -> Option<(Ipv6Addr, Ipv6Addr)> {
    let ip = frame.get(14..54)?;
    if frame.get(12..14)? != [0x86, 0xdd] || ip[0] >> 4 != 6 || ip[6] != 17 {
        return None;
    }
    let src: [u8; 16] = ip[8..24].try_into().ok()?;
    let dst: [u8; 16] = ip[24..40].try_into().ok()?;
    Some((src.into(), dst.into()))
}

/// Classic libpcap file format (what tcpdump -w writes), Ethernet link type.
struct PcapWriter {
    out: std::io::BufWriter<std::fs::File>,
}

impl PcapWriter {
    fn create(path: &std::path::Path, snaplen: u32) -> std::io::Result<PcapWriter> {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        out.write_all(&0xa1b2_c3d4u32.to_le_bytes())?;
        out.write_all(&2u16.to_le_bytes())?;
        out.write_all(&4u16.to_le_bytes())?;
        out.write_all(&0i32.to_le_bytes())?; // thiszone
        out.write_all(&0u32.to_le_bytes())?; // sigfigs
        out.write_all(&snaplen.to_le_bytes())?;
        out.write_all(&1u32.to_le_bytes())?; // LINKTYPE_ETHERNET
        Ok(PcapWriter { out })
    }

    fn write(&mut self, bytes: &[u8], wire_len: usize) -> std::io::Result<()> {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.out.write_all(&(ts.as_secs() as u32).to_le_bytes())?;
        self.out.write_all(&ts.subsec_micros().to_le_bytes())?;
        self.out.write_all(&(bytes.len() as u32).to_le_bytes())?;
        self.out.write_all(&(wire_len as u32).to_le_bytes())?;
        self.out.write_all(bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp_frame(src: Ipv6Addr, dst: Ipv6Addr) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 40 + 8];
        f[12] = 0x86;
        f[13] = 0xdd;
        f[14] = 0x60;
        f[14 + 6] = 17;
        f[22..38].copy_from_slice(&src.octets());
        f[38..54].copy_from_slice(&dst.octets());
        f
    }

    #[test]
    fn pairs_are_read_from_udp_frames_only() {
        let a: Ipv6Addr = "2001:db8::1".parse().expect("addr");
        let b: Ipv6Addr = "2001:db8::2".parse().expect("addr");
        assert_eq!(outer_udp_pair(&udp_frame(a, b)), Some((a, b)));
        let mut tcp = udp_frame(a, b);
        tcp[20] = 6;
        assert_eq!(outer_udp_pair(&tcp), None);
        assert_eq!(
            outer_udp_pair(&udp_frame(a, b)[..40]),
            None,
            "truncated frame"
        );
        let mut v4 = udp_frame(a, b);
        v4[12..14].copy_from_slice(&[0x08, 0x00]);
        assert_eq!(outer_udp_pair(&v4), None);
    }

    #[test]
    fn pcap_file_has_header_and_records() {
        let path = std::env::temp_dir().join(format!("mt6d-obs-{}.pcap", std::process::id()));
        let mut w = PcapWriter::create(&path, 128).expect("create");
        w.write(&[1, 2, 3], 1500).expect("write");
        w.flush().expect("flush");
        let bytes = std::fs::read(&path).expect("read");
        std::fs::remove_file(&path).expect("cleanup");
        assert_eq!(bytes.len(), 24 + 16 + 3);
        assert_eq!(&bytes[..4], &0xa1b2_c3d4u32.to_le_bytes());
        assert_eq!(&bytes[24 + 8..24 + 16], &[3, 0, 0, 0, 0xdc, 0x05, 0, 0]);
    }
}
