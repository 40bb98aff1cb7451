//! A TCP transfer of random data between the two protected hosts, checked end to end: the sender
//! hashes what it sends, the receiver hashes what it gets, and the two SHA-256 digests must match.
//! This is how the demo and the end-to-end tests prove that every rotation left the stream intact.
//!
//! `serve_once` runs on a thread inside the receiving host's namespace, `send_for` inside the
//! sender's.

use std::io::{Read, Write};
use std::net::{Ipv6Addr, SocketAddrV6, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rand::{RngCore, SeedableRng};
use sha2::{Digest, Sha256};

/// What the receiving side saw.
#[derive(Debug, Clone)]
pub struct Received {
    pub bytes: u64,
    pub sha256: [u8; 32],
}

/// What the transfer achieved, from the sender's side.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TransferReport {
    pub bytes: u64,
    pub seconds: f64,
    pub mbit_s: f64,
    /// The longest time one 128 KiB write waited, in ms: the transfer's worst stall (a gateway
    /// restart or a rekey shows here).
    pub longest_stall_ms: f64,
    pub sha256_match: bool,
    pub sha256: String,
}

/// Binds the receiving socket; call before starting the sender.
pub fn listen(addr: Ipv6Addr, port: u16) -> std::io::Result<TcpListener> {
    TcpListener::bind(SocketAddrV6::new(addr, port, 0, 0))
}

/// Accepts one connection (waiting at most `accept_timeout`), reads it to the end while
/// hashing, then answers with the byte count and digest so the sender can compare.
pub fn serve_once(listener: TcpListener, accept_timeout: Duration) -> std::io::Result<Received> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + accept_timeout;
    let mut stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    };
    stream.set_nonblocking(false)?;
    // A stalled tunnel must end the test, not hang it.
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut bytes = 0u64;
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    let sha256: [u8; 32] = hasher.finalize().into();
    stream.write_all(&bytes.to_be_bytes())?;
    stream.write_all(&sha256)?;
    Ok(Received { bytes, sha256 })
}

/// Connects to `dst:port` and sends pseudo-random data (seeded, so a failure can be replayed)
/// for `duration`, then compares digests with the receiver.
pub fn send_for(
    dst: Ipv6Addr,
    port: u16,
    duration: Duration,
    seed: u64,
) -> std::io::Result<TransferReport> {
    send(dst, port, Budget::Time(duration), seed)
}

/// [`send_for`], but exactly `bytes` bytes (a file of that size), however long that takes.
pub fn send_bytes(
    dst: Ipv6Addr,
    port: u16,
    bytes: u64,
    seed: u64,
) -> std::io::Result<TransferReport> {
    send(dst, port, Budget::Bytes(bytes), seed)
}

/// [`send_bytes`], spread evenly over `over`: a file sent at a steady rate, so that it spans
/// a given number of address rotations whatever the path's capacity.
pub fn send_paced(
    dst: Ipv6Addr,
    port: u16,
    bytes: u64,
    over: Duration,
    seed: u64,
) -> std::io::Result<TransferReport> {
    send(dst, port, Budget::Paced { bytes, over }, seed)
}

/// How much a sender sends.
#[derive(Debug, Clone, Copy)]
enum Budget {
    Time(Duration),
    Bytes(u64),
    Paced { bytes: u64, over: Duration },
}

fn send(dst: Ipv6Addr, port: u16, budget: Budget, seed: u64) -> std::io::Result<TransferReport> {
    let addr = SocketAddrV6::new(dst, port, 0, 0);
    let mut stream = TcpStream::connect_timeout(&addr.into(), Duration::from_secs(5))?;
    stream.set_write_timeout(Some(Duration::from_secs(20)))?;
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 128 * 1024];
    let mut bytes = 0u64;
    let start = Instant::now();
    let mut longest_stall = Duration::ZERO;
    loop {
        let n = match budget {
            Budget::Time(d) if start.elapsed() >= d => break,
            Budget::Time(_) => buf.len(),
            Budget::Bytes(total) | Budget::Paced { bytes: total, .. } if bytes >= total => break,
            // The last write of a byte budget is short.
            Budget::Bytes(total) => buf
                .len()
                .min(usize::try_from(total - bytes).unwrap_or(usize::MAX)),
            // 16 KiB writes, each when its share of `over` has come.
            Budget::Paced { bytes: total, over } => {
                let due = over.mul_f64(bytes as f64 / total as f64);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
                (16 * 1024).min(usize::try_from(total - bytes).unwrap_or(usize::MAX))
            }
        };
        let chunk = &mut buf[..n];
        rng.fill_bytes(chunk);
        let before = Instant::now();
        stream.write_all(chunk)?;
        longest_stall = longest_stall.max(before.elapsed());
        hasher.update(&*chunk);
        bytes += n as u64;
    }
    stream.shutdown(std::net::Shutdown::Write)?;
    let mut answer = [0u8; 40];
    stream.read_exact(&mut answer)?;
    let seconds = start.elapsed().as_secs_f64();
    let sent: [u8; 32] = hasher.finalize().into();
    let (count, digest) = answer.split_at(8);
    let received_bytes = u64::from_be_bytes(count.try_into().map_err(std::io::Error::other)?);
    let sha256_match = received_bytes == bytes && digest == sent;
    Ok(TransferReport {
        bytes,
        seconds,
        mbit_s: bytes as f64 * 8.0 / seconds / 1e6,
        longest_stall_ms: longest_stall.as_secs_f64() * 1000.0,
        sha256_match,
        sha256: hex(&sent),
    })
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_transfer_matches() {
        let listener = listen(Ipv6Addr::LOCALHOST, 0).expect("bind ::1");
        let port = listener.local_addr().expect("addr").port();
        let server = std::thread::spawn(move || serve_once(listener, Duration::from_secs(5)));
        let report =
            send_for(Ipv6Addr::LOCALHOST, port, Duration::from_millis(200), 7).expect("send");
        let received = server.join().expect("server thread").expect("serve");
        assert!(report.sha256_match);
        assert_eq!(received.bytes, report.bytes);
        assert!(report.bytes > 0 && report.mbit_s > 0.0);
        assert_eq!(hex(&received.sha256), report.sha256);
    }

    #[test]
    fn a_byte_budget_sends_exactly_that_many_bytes() {
        let listener = listen(Ipv6Addr::LOCALHOST, 0).expect("bind ::1");
        let port = listener.local_addr().expect("addr").port();
        let server = std::thread::spawn(move || serve_once(listener, Duration::from_secs(5)));
        let size = 3 * 128 * 1024 + 77;
        let report = send_bytes(Ipv6Addr::LOCALHOST, port, size, 9).expect("send");
        let received = server.join().expect("server thread").expect("serve");
        assert!(report.sha256_match);
        assert_eq!((report.bytes, received.bytes), (size, size));
    }

    #[test]
    fn a_paced_file_takes_the_time_given() {
        let listener = listen(Ipv6Addr::LOCALHOST, 0).expect("bind ::1");
        let port = listener.local_addr().expect("addr").port();
        let server = std::thread::spawn(move || serve_once(listener, Duration::from_secs(5)));
        let over = Duration::from_millis(300);
        let report = send_paced(Ipv6Addr::LOCALHOST, port, 200_000, over, 3).expect("send");
        let received = server.join().expect("server thread").expect("serve");
        assert!(report.sha256_match && received.bytes == 200_000);
        // The last write (the 3,392 bytes after twelve of 16 KiB) is due at 98 % of the time.
        assert!(report.seconds >= 0.27, "{} s", report.seconds);
    }
}
