//! Under a service manager (`Type=notify` in packaging/systemd/mt6d@.service)
//! the daemon reports ready only once the current epoch's hashed address is bound, and reports
//! stopping when SIGTERM starts its clean-up. The manager's side is a datagram socket at
//! `NOTIFY_SOCKET`, as systemd passes it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure is a failed test

mod common;

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use common::*;
use mt6d_lab::daemon::DaemonProcess;
use mt6d_lab::topology::{Side, HOST_B};

#[test]
#[ignore = "needs root: network namespaces, TUN devices and raw sockets (run with --include-ignored as root)"]
fn ready_once_the_current_address_is_bound_and_stopping_on_sigterm() {
    require_root();
    let mut running = start("encrypt", 2.0);
    // Restart gateway A under a "service manager".
    running.daemons[0].stop(Duration::from_secs(5)).unwrap();
    let manager_path = running.dir.join("notify.sock");
    let manager = UnixDatagram::bind(&manager_path).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let config = running.dir.join("gw-A.toml");
    let mut cmd = running.lab.gateway(Side::A).command(MT6D).unwrap();
    cmd.arg("run")
        .arg("-c")
        .arg(&config)
        .env("NOTIFY_SOCKET", &manager_path);
    let log = running.dir.join("gw-A-service.log");
    running.daemons[0] =
        DaemonProcess::spawn("A", cmd, &running.lab.control_socket(Side::A), &log).unwrap();

    let mut buf = [0u8; 512];
    let n = manager.recv(&mut buf).expect("READY within 15 s");
    let ready = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert_eq!(ready, "READY=1\nSTATUS=carrying 1 peer(s)\n");
    // Ready means the current epoch's address is on the external interface already.
    let st = running.daemons[0].status().unwrap();
    let local = st.peers[0].send.local.clone();
    let host = local
        .trim_start_matches('[')
        .split(']')
        .next()
        .unwrap()
        .to_string();
    let addrs = ip_in(&running.lab.gw_a, &["-6", "addr", "show"]);
    assert!(
        addrs.contains(&host),
        "the send route's local address {host} is bound when READY arrives:\n{addrs}"
    );
    wait_for_path(&running.lab, HOST_B, 3);

    running.daemons[0].stop(Duration::from_secs(10)).unwrap();
    let n = manager.recv(&mut buf).expect("STOPPING before exit");
    assert_eq!(&buf[..n], b"STOPPING=1\n");
}

/// Metrics: `metrics_listen` serves the status counters to a Prometheus scraper, in a
/// format `promtool check metrics` accepts, and they move with the traffic.
#[test]
#[ignore = "needs root (network namespaces) and promtool (scripts/install-deps.sh installs both tools)"]
fn metrics_are_scraped_and_pass_promtool() {
    require_root();
    let lab = mt6d_lab::topology::Lab::build_topology(mt6d_lab::topology::Topology::Switched, "m6")
        .expect("lab builds");
    let running = start_gateways_with(lab, "encrypt", 2.0, (true, None), |text| {
        text.replacen(
            "[gateway]\n",
            "[gateway]\nmetrics_listen = \"[::1]:9586\"\n",
            1,
        )
    });
    let scrape = || {
        running
            .lab
            .gateway(Side::A)
            .run(|| {
                use std::io::{Read, Write};
                let mut c = std::net::TcpStream::connect("[::1]:9586")?;
                c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
                let mut reply = String::new();
                c.read_to_string(&mut reply)?;
                Ok::<_, std::io::Error>(reply)
            })
            .expect("enter gateway A")
            .expect("scrape")
    };
    let count = |text: &str, sample: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(sample))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no sample {sample} in\n{text}"))
    };
    // The first snapshot is published within a second of start.
    std::thread::sleep(Duration::from_millis(1200));
    let before = scrape();
    assert!(before.starts_with("HTTP/1.1 200 OK"), "{before}");
    let tx = "mt6d_peer_packets_total{peer=\"far\",direction=\"tx\"}";
    let first = count(&before, tx);
    wait_for_path(&running.lab, HOST_B, 20);
    std::thread::sleep(Duration::from_millis(1200));
    let after = scrape();
    assert!(
        count(&after, tx) >= first + 20,
        "20 echoes sealed: {first} -> {}",
        count(&after, tx)
    );
    let body = after.split("\r\n\r\n").nth(1).expect("body");
    mt6d_lab::promtool_check(body).unwrap_or_else(|e| panic!("{e}\n{body}"));
    eprintln!(
        "scrape ({} bytes), promtool check metrics passed:\n{body}",
        body.len()
    );
}
