//! The netlink method (002's, and the gateway role's): n /128s added to an interface, the
//! time it takes (Fig. 1), and a plain UDP echo from the bound addresses under load (Fig. 2).

use std::time::{Duration, Instant};

use mt6d_lab::server_lab::{ServerLab, ECHO_PORT};
use mt6d_os::Netns;

use super::cell::{cells_until_fail, Load, Meter};
use super::{Rng, ServerArgs, FACTOR};
use crate::json::{Value, ValueExt};

/// n /128s on a veth interface of a fresh namespace (no dummy module on this kernel) with one `ip -batch`, per n.
pub(super) fn fig1_netlink(args: &ServerArgs) -> Result<Value, String> {
    let mut points = Vec::new();
    for &n in &args.netlink_sizes {
        let ns = Netns::create(&mt6d_os::unique_name("mbsn")).map_err(|e| e.to_string())?;
        let run = |cmd: &str| sh(&ns, cmd);
        run("ip link add d0 type veth peer name d1 && ip link set d0 up && ip link set d1 up")?;
        let mut batch = String::with_capacity(n * 48);
        for i in 0..n {
            let a =
                std::net::Ipv6Addr::from((0x2001_0db8_0077_u128 << 80) | (i as u128 * 7919 + 1));
            batch.push_str(&format!("addr add {a}/128 dev d0 nodad\n"));
        }
        let file = std::env::temp_dir().join(format!("mt6d-fig1-{}", std::process::id()));
        std::fs::write(&file, batch).map_err(|e| e.to_string())?;
        let t = Instant::now();
        run(&format!("ip -batch {}", file.display()))?;
        let secs = t.elapsed().as_secs_f64();
        let _ = std::fs::remove_file(&file);
        eprintln!("  netlink: {n} addresses in {secs:.3} s");
        let mut p = Value::obj();
        p.set("addresses", n as u64)
            .set("secs", secs)
            .set("ms_per_address", secs * 1e3 / n as f64);
        points.push(p);
        // Removing the namespace frees the addresses (in the background; it takes a while).
        drop(ns);
        if t.elapsed() > args.netlink_limit {
            break;
        }
    }
    Ok(Value::Array(points))
}

/// The netlink method's load (002's server): plain UDP from the client namespace to a random
/// one of the server's bound addresses; an answer must come from the address asked.
struct Plain {
    socket: std::net::UdpSocket,
    addresses: Vec<std::net::Ipv6Addr>,
    /// The address each request went to, by sequence number.
    asked: Vec<Option<std::net::Ipv6Addr>>,
    wrong_source: u64,
    rejected: u64,
    buf: Vec<u8>,
    /// The echo's thread in this process.
    echo: Meter,
}

impl Load for Plain {
    fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.socket.as_raw_fd()
    }
    fn tick(&mut self) -> usize {
        0
    }
    fn send(
        &mut self,
        who: &[usize],
        fill: &mut dyn FnMut(usize, &mut [u8]) -> usize,
    ) -> Result<(), String> {
        for (k, &i) in who.iter().enumerate() {
            let to = self.addresses[i % self.addresses.len()];
            let len = fill(k, &mut self.buf);
            let seq = u64::from_le_bytes(self.buf[..8].try_into().unwrap_or([0; 8])) as usize;
            if self.asked.len() <= seq {
                self.asked.resize(seq + 1, None);
            }
            self.asked[seq] = Some(to);
            // A full socket buffer loses the request, as a lost datagram would.
            let _ = self.socket.send_to(
                &self.buf[..len],
                std::net::SocketAddrV6::new(to, ECHO_PORT, 0, 0),
            );
        }
        Ok(())
    }
    fn recv(&mut self, on_reply: &mut dyn FnMut(&[u8])) -> Result<(), String> {
        let mut buf = [0u8; 2048];
        loop {
            match self.socket.recv_from(&mut buf) {
                Ok((len, from)) => {
                    let std::net::SocketAddr::V6(from) = from else {
                        self.rejected += 1;
                        continue;
                    };
                    let seq = buf
                        .get(..8)
                        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as usize);
                    match seq.and_then(|s| self.asked.get(s).copied().flatten()) {
                        Some(a) if a == *from.ip() => on_reply(&buf[..len]),
                        Some(_) => self.wrong_source += 1,
                        None => self.rejected += 1,
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e.to_string()),
            }
        }
    }
    fn faults(&self) -> (u64, u64) {
        (self.wrong_source, self.rejected)
    }
    fn start_cell(&mut self) {
        self.asked.clear();
    }
    fn meter(&self) -> Option<Meter> {
        Some(self.echo)
    }
}

/// 002's server: a UDP echo on `[::]:port` of `ns` answering `factor` times each request from
/// the address it was sent to (IPV6_PKTINFO), until `stop`. With one address bound it is also
/// the kernel's own cost of the server role's work (no tunnel, no TUN): its thread's id comes
/// back for the cells' CPU per request.
fn addressed_echo(
    ns: &Netns,
    port: u16,
    factor: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Result<(std::thread::JoinHandle<()>, u32), String> {
    let name = ns.name().to_string();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        // The echo behind the server role's buffers (mt6d_lab::clients::echo_service): with
        // the default (about 200 datagrams) this echo lost half of 30,000 requests/s whenever
        // it waited for a core on a busy 2-core machine, and the comparison with the server
        // role would be of buffers, not of work.
        let sock = Netns::open(&name)
            .and_then(|n| n.enter_current_thread())
            .and_then(|()| mt6d_os::UdpSocket6::bind(port))
            .and_then(|s| {
                use std::os::fd::AsFd;
                mt6d_os::grow_socket_buffers(s.as_fd(), port).map(|()| s)
            })
            .map_err(|e| e.to_string())
            .and_then(|s| {
                let tid = crate::procs::ThreadCpu::own_tid().ok_or("no /proc/thread-self")?;
                Ok((s, tid))
            });
        let (sock, tid) = match sock {
            Ok(s) => s,
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return;
            }
        };
        let _ = sock.set_read_timeout(Some(Duration::from_millis(50)));
        let _ = ready_tx.send(Ok(tid));
        let mut scratch = mt6d_os::RecvScratch::new(32);
        let mut bufs: Vec<mt6d_os::udp::RecvBuf> =
            (0..32).map(|_| mt6d_os::udp::RecvBuf::new()).collect();
        let mut send = mt6d_os::SendScratch::new(1);
        let mut reply = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok(got) = sock.recv_batch(&mut scratch, &mut bufs) else {
                continue;
            };
            for b in &bufs[..got] {
                for d in b.datagrams() {
                    reply.clear();
                    for _ in 0..factor {
                        reply.extend_from_slice(d);
                    }
                    let msg = [mt6d_os::SendMsg {
                        src: b.dst(),
                        dst: b.src(),
                        payload: &reply,
                        segment_size: None,
                    }];
                    let _ = sock.send_batch(&mut send, &msg);
                }
            }
        }
    });
    match ready_rx.recv_timeout(Duration::from_secs(5)) {
        Ok(Ok(tid)) => Ok((h, tid)),
        Ok(Err(e)) => Err(format!("echo on [::]:{port}: {e}")),
        Err(_) => Err(format!("echo on [::]:{port} did not start")),
    }
}

/// Fig. 2 for the netlink method (002's server): `n` /128s of the server's prefix bound on a
/// veth interface of its own in the server's namespace with one `ip -batch` (the router routes the
/// prefix to the server, so nothing is resolved per address), the addressed echo on port
/// 3540, and plain UDP requests from the client namespace to a random bound address, cell by
/// cell as the server role's. No tunnel: this is 002's measurement of what per-address
/// binding costs the kernel, not MT6D's.
pub(super) fn fig2_netlink(lab: &ServerLab, args: &ServerArgs) -> Result<Value, String> {
    let mut runs = Vec::new();
    for &n in &args.netlink_fig2 {
        // A veth end of its own (this kernel has no dummy device): deleting it takes the
        // addresses with it.
        sh(
            &lab.server,
            "ip link add nl0 type veth peer name nl1 && ip link set nl0 up && ip link set nl1 up",
        )?;
        let addresses: Vec<std::net::Ipv6Addr> = (0..n)
            .map(|i| {
                std::net::Ipv6Addr::from((0x2001_0db8_0005_u128 << 80) | (i as u128 * 7919 + 1))
            })
            .collect();
        let file = std::env::temp_dir().join(format!("mt6d-fig2-{}", std::process::id()));
        let batch: String = addresses
            .iter()
            .map(|a| format!("addr add {a}/128 dev nl0 nodad\n"))
            .collect();
        std::fs::write(&file, batch).map_err(|e| e.to_string())?;
        let t = Instant::now();
        sh(&lab.server, &format!("ip -batch {}", file.display()))?;
        let bind_secs = t.elapsed().as_secs_f64();
        let _ = std::fs::remove_file(&file);
        eprintln!("  netlink method: {n} addresses bound in {bind_secs:.2} s");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (echo, echo_tid) = addressed_echo(&lab.server, ECHO_PORT, FACTOR, stop.clone())?;
        // The generator's buffers, as the echo's: its default one overflowed with 640-byte
        // answers at 30,000/s whenever this thread waited for a core.
        let socket = lab.clients[0]
            .run(|| {
                use std::os::fd::AsFd;
                let s = std::net::UdpSocket::bind("[::]:0").map_err(|e| e.to_string())?;
                s.set_nonblocking(true).map_err(|e| e.to_string())?;
                mt6d_os::grow_socket_buffers(s.as_fd(), 0).map_err(|e| e.to_string())?;
                Ok::<_, String>(s)
            })
            .map_err(|e| e.to_string())??;
        let mut load = Plain {
            socket,
            addresses,
            asked: Vec::with_capacity(args.cell),
            wrong_source: 0,
            rejected: 0,
            buf: vec![0u8; 2048],
            echo: Meter {
                pid: std::process::id(),
                only: Some(echo_tid),
                workers: "",
            },
        };
        let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ n as u64);
        let cells = cells_until_fail(&mut load, n, args, &mut rng, |rate| {
            format!("  netlink {n} @ {rate}/s")
        })?;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = echo.join();
        // Removing the device removes its addresses (slowly, with tens of thousands).
        sh(&lab.server, "ip link del nl0")?;
        let mut v = Value::obj();
        v.set("addresses", n as u64)
            .set("bind_secs", bind_secs)
            .set("cells", Value::Array(cells));
        runs.push(v);
    }
    Ok(Value::Array(runs))
}

/// Runs `cmd` with `sh -c` in `ns`; its standard error in the error.
fn sh(ns: &Netns, cmd: &str) -> Result<(), String> {
    let o = ns
        .command("sh")
        .map_err(|e| e.to_string())?
        .args(["-c", cmd])
        .output()
        .map_err(|e| e.to_string())?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd}: {}", String::from_utf8_lossy(&o.stderr)))
    }
}
