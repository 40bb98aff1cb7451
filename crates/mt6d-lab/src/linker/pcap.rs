//! Reading the observer's captures: classic libpcap files of Ethernet frames.

/// One captured frame (Ethernet), as the observer kept it.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Capture time, seconds since the Unix epoch.
    pub ts: f64,
    /// Length on the wire (the capture may be shorter: the observer's snap length).
    pub wire_len: u32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LinkerError {
    #[error("{file}: not a pcap file (magic {magic:08x}); only classic little-endian libpcap with Ethernet frames is read")]
    NotPcap { file: String, magic: u32 },
    #[error("{file}: link type {linktype} is not Ethernet (1)")]
    LinkType { file: String, linktype: u32 },
    #[error("{file}: record {record} truncated at byte {offset}")]
    Truncated {
        file: String,
        record: usize,
        offset: usize,
    },
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
}

/// Reads a classic libpcap file (microsecond timestamps, little endian, Ethernet), as
/// `tcpdump -w` and the lab observer write it.
pub fn read_pcap(path: &std::path::Path) -> Result<Vec<Frame>, LinkerError> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| LinkerError::Io {
        file: file.clone(),
        source,
    })?;
    parse_pcap(&bytes, &file)
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Parses pcap bytes; `file` names them in errors.
pub fn parse_pcap(bytes: &[u8], file: &str) -> Result<Vec<Frame>, LinkerError> {
    let magic = le32(bytes, 0).unwrap_or(0);
    if magic != 0xa1b2_c3d4 {
        return Err(LinkerError::NotPcap {
            file: file.into(),
            magic,
        });
    }
    let linktype = le32(bytes, 20).unwrap_or(0);
    if linktype != 1 {
        return Err(LinkerError::LinkType {
            file: file.into(),
            linktype,
        });
    }
    let mut frames = Vec::new();
    let mut at = 24;
    while at < bytes.len() {
        let truncated = || LinkerError::Truncated {
            file: file.into(),
            record: frames.len(),
            offset: at,
        };
        let (Some(sec), Some(usec), Some(caplen), Some(wire_len)) = (
            le32(bytes, at),
            le32(bytes, at + 4),
            le32(bytes, at + 8),
            le32(bytes, at + 12),
        ) else {
            return Err(truncated());
        };
        let data = bytes
            .get(at + 16..at + 16 + caplen as usize)
            .ok_or_else(truncated)?;
        frames.push(Frame {
            ts: f64::from(sec) + f64::from(usec) / 1e6,
            wire_len,
            bytes: data.to_vec(),
        });
        at += 16 + caplen as usize;
    }
    Ok(frames)
}
