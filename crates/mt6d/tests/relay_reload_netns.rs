//! A relay node's reload (SIGHUP, `mt6d reload`) on the lab's mesh (`mt6d_lab::relays`),
//! every node a real `mt6d run`:
//!
//! ```text
//! h1 - e1 == r1 ==== r2 == e3 - h3
//!              \\  //
//!                r3
//! ```
//!
//! Checked: a file that does not validate, or that changes a setting a running node cannot
//! take, is refused naming the file and line or the key, and the node's links and routes are
//! what they were; the link r1-r2 removed by reload at both ends loses its routes at once, h1
//! still reaches h3 through r3, and not one datagram crosses the removed link afterwards; the
//! link added again by reload in the middle of a TCP transfer is keyed and carries the
//! transfer, which arrives intact.
//!
//! Run: `cargo test --release -p mt6d --test relay_reload_netns -- --include-ignored
//! --test-threads=1 --nocapture`.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use mt6d::control::{self, ChangeAnswer, Request};
use mt6d::status::relay::RelayStatus;
use mt6d_lab::ping::Pace;
use mt6d_lab::relays::{Flow, RelayLab, Shape, Size};

/// What a reload may not change unless it says so: the process, its links (name, neighbour
/// address, keying) and its routes (destination, next hop).
#[derive(Debug, PartialEq, Eq)]
struct Shown {
    pid: u32,
    config: String,
    links: Vec<(String, String, String)>,
    routes: Vec<(String, String)>,
}

fn shown(st: &RelayStatus) -> Shown {
    let mut routes: Vec<(String, String)> = st
        .routes
        .iter()
        .map(|r| (r.destination.clone(), r.next_hop.clone()))
        .collect();
    routes.sort();
    Shown {
        pid: st.pid,
        config: st.config.clone(),
        links: st
            .links
            .iter()
            .map(|l| (l.name.clone(), l.address.clone(), l.keys.clone()))
            .collect(),
        routes,
    }
}

/// `text` without its `[[relay.link]]` named `name`.
fn without_link(text: &str, name: &str) -> String {
    let mut blocks = text.split("[[relay.link]]");
    let mut out = blocks.next().unwrap_or_default().to_string();
    let mut found = false;
    for b in blocks {
        if b.contains(&format!("name = \"{name}\"")) {
            found = true;
            // The tables after the link (`[[relay.e2e]]`) stay.
            if let Some(rest) = b.find("\n[").map(|i| &b[i + 1..]) {
                out.push_str(rest);
            }
            continue;
        }
        out.push_str("[[relay.link]]");
        out.push_str(b);
    }
    assert!(found, "no link {name} in\n{text}");
    out
}

fn reload(socket: &Path) -> Result<ChangeAnswer, String> {
    control::send(socket, &Request::Reload).map_err(|e| e.to_string())
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write the configuration file");
}

/// Waits until `f` of node `i`'s status holds.
fn wait_status(
    lab: &RelayLab,
    i: usize,
    limit: Duration,
    what: &str,
    f: impl Fn(&RelayStatus) -> bool,
) {
    let t = Instant::now();
    while t.elapsed() < limit {
        if lab.status(i).is_ok_and(|st| f(&st)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "{}: {what} not within {limit:?}\n{:?}\n{}",
        lab.nodes[i].name,
        lab.status(i),
        lab.log_tails(20)
    );
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn links_removed_and_added_by_reload_change_the_paths_and_a_refused_reload_changes_nothing() {
    common::require_root();
    let _turn = common::one_at_a_time();
    let lab =
        RelayLab::up(Shape::Mesh, "m6rl", common::relay_settings(2.0)).expect("relay lab comes up");
    let host = |k| lab.host_index(k).expect("host");
    let node = |name| lab.node_index(name).expect("node");
    let (h1, h3) = (host(1), host(3));
    let (r1, r2, r3) = (node("r1"), node("r2"), node("r3"));
    let r1r2 = lab.link_index("r1", "r2").expect("link r1-r2");
    lab.wait_for_path(h1, h3, Duration::from_secs(10))
        .expect("h1 reaches h3");
    let (cfg1, cfg2) = (lab.nodes[r1].config.clone(), lab.nodes[r2].config.clone());
    let (sock1, sock2) = (lab.nodes[r1].socket.clone(), lab.nodes[r2].socket.clone());
    let text1 = std::fs::read_to_string(&cfg1).expect("r1's file");
    let text2 = std::fs::read_to_string(&cfg2).expect("r2's file");

    // 1. A file that does not validate: refused by the CLI, naming the file and line.
    let neighbour = "address = \"2001:db8:ff:2::1\"";
    let line = 1 + text1[..text1.find(neighbour).expect("r2's address in r1's file")]
        .matches('\n')
        .count();
    write(
        &cfg1,
        &text1.replacen(neighbour, "address = \"2001:db8:ff:2::zz\"", 1),
    );
    let before = shown(&lab.status(r1).expect("status"));
    let out = std::process::Command::new(common::MT6D)
        // By its socket: `--config` would read the bad file in the CLI and never ask.
        .args(["reload", "--socket"])
        .arg(&sock1)
        .output()
        .expect("mt6d reload");
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "a bad file was accepted: {said}");
    let place = format!("{}:{line}:", cfg1.display());
    assert!(
        said.contains(&place) && said.contains("nothing changed"),
        "the refusal does not name {place}: {said}"
    );
    assert_eq!(shown(&lab.status(r1).expect("status")), before);
    // 2. A setting a running node cannot take, with a link change: refused whole, by its key.
    write(
        &cfg1,
        &without_link(&text1, "r2").replacen("[relay]\n", "[relay]\nlisten_port = 7999\n", 1),
    );
    let e = reload(&sock1).expect_err("a changed listen_port was accepted");
    assert!(
        e.contains("listen_port") && e.contains(&cfg1.display().to_string()),
        "{e}"
    );
    assert_eq!(shown(&lab.status(r1).expect("status")), before);
    lab.wait_for_path(h1, h3, Duration::from_secs(2))
        .expect("h1 reaches h3 after the refusals");
    eprintln!("refused: a bad file ({place}) and a changed listen_port; status unchanged");

    // 3. r1-r2 removed at both ends: its routes go, h1 reaches h3 through r3, the link is quiet.
    write(&cfg1, &without_link(&text1, "r2"));
    write(&cfg2, &without_link(&text2, "r1"));
    let a1 = reload(&sock1).expect("r1 reloads");
    let a2 = reload(&sock2).expect("r2 reloads");
    let removed_at = Instant::now();
    assert_eq!(
        (&a1.removed[..], &a2.removed[..]),
        (&["r2".to_string()][..], &["r1".to_string()][..])
    );
    assert!(a1.added.is_empty() && a1.changed.is_empty(), "{a1:?}");
    let st = lab.status(r1).expect("status");
    assert!(
        st.links.iter().all(|l| l.name != "r2") && st.routes.iter().all(|r| r.next_hop != "r2"),
        "r1 still has link r2 or a route through it: {:?} {:?}",
        st.links.iter().map(|l| &l.name).collect::<Vec<_>>(),
        st.routes
    );
    let forwarded = |i: usize| {
        lab.status(i)
            .ok()
            .and_then(|st| st.counters.get("forwarded").copied())
            .unwrap_or(0)
    };
    let through_r3 = forwarded(r3);
    let watch = lab.watch(&[r1r2]).expect("capture on r1-r2");
    lab.wait_for_path(h1, h3, Duration::from_secs(10))
        .expect("h1 reaches h3 through r3");
    let pings = lab
        .ping(
            h1,
            h3,
            40,
            Pace::Train {
                interval: Duration::from_millis(50),
            },
            Duration::from_millis(500),
        )
        .expect("echoes");
    let wire = watch.finish().expect("capture");
    eprintln!(
        "removed r1-r2: {} of {} echoes through r3 ({} forwarded there), {} UDP datagrams on r1-r2 in {:.1} s after",
        pings.received,
        pings.sent,
        forwarded(r3) - through_r3,
        wire[0].udp_frames,
        removed_at.elapsed().as_secs_f64()
    );
    assert!(pings.received >= pings.sent * 9 / 10, "{pings:?}");
    assert!(forwarded(r3) > through_r3, "nothing went through r3");
    assert_eq!(wire[0].udp_frames, 0, "datagrams on the removed link");

    // 4. r1-r2 added again in the middle of a transfer: keyed, it carries it, intact.
    let watch = lab.watch(&[r1r2]).expect("capture on r1-r2");
    let flow = Flow {
        from: h1,
        to: h3,
        size: Size::For(Duration::from_secs(8)),
        port: 5202,
        seed: 4,
    };
    let (reports, answers) = std::thread::scope(|s| {
        let transfer = s.spawn(|| lab.transfers(&[flow]));
        std::thread::sleep(Duration::from_millis(1500));
        write(&cfg1, &text1);
        write(&cfg2, &text2);
        let answers = (reload(&sock1), reload(&sock2));
        (transfer.join().expect("transfer thread"), answers)
    });
    let wire = watch.finish().expect("capture");
    let (a1, a2) = (
        answers.0.expect("r1 reloads"),
        answers.1.expect("r2 reloads"),
    );
    assert_eq!((a1.added, a2.added), (vec!["r2".into()], vec!["r1".into()]));
    let report = reports.expect("the transfer completes").remove(0);
    eprintln!(
        "added r1-r2 back mid-transfer: {} data frames on it; transfer {} bytes, sha256 match {}, longest stall {:.0} ms",
        wire[0].data_frames_at.len(),
        report.bytes,
        report.sha256_match,
        report.longest_stall_ms
    );
    assert!(
        report.sha256_match,
        "transfer corrupted\n{}",
        lab.log_tails(20)
    );
    assert!(
        !wire[0].data_frames_at.is_empty(),
        "the transfer never took the link added back\n{}",
        lab.log_tails(20)
    );
    wait_status(
        &lab,
        r1,
        Duration::from_secs(5),
        "link r2 keyed, routes through it",
        |st| {
            st.links
                .iter()
                .any(|l| l.name == "r2" && l.keys == "handshake")
                && st.routes.iter().any(|r| r.next_hop == "r2")
        },
    );
    assert_eq!(
        wire[0].frames_with_true_address, 0,
        "{:?}",
        wire[0].first_leak
    );
}
