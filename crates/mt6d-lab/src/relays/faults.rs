//! Faults a relay lab injects: random loss or a cut on a link (an nftables `numgen random`
//! rule on the ingress hook of both ends of its veth: this kernel has no netem, and an ingress
//! rule sees every frame however the daemon sent it), datagrams forged with a link's own
//! addresses and ports, and a cut in the middle of a transfer, measured.

use std::io::Write;
use std::net::SocketAddrV6;
use std::process::Stdio;
use std::time::{Duration, Instant};

use mt6d_os::Netns;
use serde::Serialize;

use super::{cmd_err, ms, os_err, unix_now, Flow, RelayLab};
use crate::ping::{Pace, PingReport};
use crate::topology::LabError;
use crate::transfer::TransferReport;

impl RelayLab {
    /// `percent` random loss on link `l`, each direction (0: none; 100: the link is cut).
    /// Replaces whatever loss the link had.
    pub fn set_loss(&self, l: usize, percent: u8) -> Result<(), LabError> {
        let link = &self.links[l];
        for (node, iface) in [(link.a, &link.if_a), (link.b, &link.if_b)] {
            nft(&self.nodes[node].ns, &loss_ruleset(iface, percent))?;
        }
        if let Some(p) = self.lock_loss().get_mut(l) {
            *p = percent;
        }
        Ok(())
    }

    /// Link `l`'s loss in percent, as last set.
    pub fn loss(&self, l: usize) -> u8 {
        self.lock_loss().get(l).copied().unwrap_or(0)
    }

    pub(super) fn lock_loss(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        // Nothing panics while holding it: a poisoned value is still the last one set.
        self.loss
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// [`RelayLab::set_loss`] on every link.
    pub fn set_loss_everywhere(&self, percent: u8) -> Result<(), LabError> {
        (0..self.links.len()).try_for_each(|l| self.set_loss(l, percent))
    }

    /// Sends `count` datagrams of random bytes to node `at`'s current address and port on link
    /// `l` (from its status), from the neighbour's namespace and its current address and port
    /// of the link: an attacker on the link who forges rather than replays, with the link's
    /// own addresses and ports. Returns (source, destination).
    pub fn forge_datagrams(
        &self,
        at: usize,
        l: usize,
        count: usize,
    ) -> Result<(SocketAddrV6, SocketAddrV6), String> {
        let link = &self.links[l];
        let peer = if link.a == at { link.b } else { link.a };
        let st = self.status(at)?;
        let name = &self.nodes[peer].name;
        let entry =
            st.links.iter().find(|x| &x.name == name).ok_or_else(|| {
                format!("{} has no link {name} in its status", self.nodes[at].name)
            })?;
        let (local, remote) = parse_route(&entry.route).ok_or_else(|| {
            format!(
                "link route {:?} of {} unreadable",
                entry.route, self.nodes[at].name
            )
        })?;
        // A raw socket writes the UDP header itself: the datagram leaves from exactly the
        // neighbour's address and port of the link, and no socket is bound that could take
        // the neighbour's own datagrams.
        let sent = self.nodes[peer].ns.run(|| -> Result<(), String> {
            let raw = mt6d_os::RawUdp6::open().map_err(|e| e.to_string())?;
            let mut scratch = mt6d_os::RawSendScratch::new(1);
            let mut junk = [0u8; 256];
            for _ in 0..count {
                rand::RngCore::fill_bytes(&mut rand::rng(), &mut junk);
                let msg = mt6d_os::RawSendMsg {
                    src: remote,
                    dst: local,
                    payload: &junk,
                };
                raw.send_batch(&mut scratch, &[msg])
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        });
        sent.map_err(|e| e.to_string())??;
        Ok((remote, local))
    }

    /// Cuts link `cut` while `flow` runs (after `after`), and measures how the network routes
    /// around it: when node `at` (an end of the cut link) moved its route towards the flow's
    /// destination edge gateway, and when the first data frame crossed `detour` (a link of the
    /// other path). Starts only once `at` routes over the link (up to 20 s: a link recovering
    /// from loss is on probation for 10 s); the link's loss is restored once the transfer is
    /// over.
    pub fn cut_during(
        &self,
        flow: Flow,
        cut: usize,
        at: usize,
        detour: usize,
        after: Duration,
    ) -> Result<Reroute, String> {
        let edge = self.hosts[flow.to].edge;
        let destination = self
            .status(edge)?
            .node_id
            .ok_or_else(|| format!("edge gateway {} has no node id", self.nodes[edge].name))?;
        let cut_peer = {
            let l = &self.links[cut];
            self.nodes[if l.a == at { l.b } else { l.a }].name.clone()
        };
        let route = || -> Option<String> {
            let st = self.status(at).ok()?;
            let r = st.routes.iter().find(|r| r.destination == destination)?;
            Some(r.next_hop.clone())
        };
        self.wait_route_over(at, edge, &cut_peer, &route)?;
        let restore = self.loss(cut);
        let watch = self.watch(&[detour])?;
        let outcome = std::thread::scope(|s| -> Result<_, String> {
            let transfer = s.spawn(|| self.transfers(&[flow]));
            // Echoes every 10 ms beside the transfer, from `after` before the cut to 2 s
            // after it: the first answered one sent after the cut took the detour, whenever
            // TCP's retransmission timer lets the transfer try again.
            let echoes = s.spawn(|| {
                let count = (after + Duration::from_secs(2)).as_millis() / 10;
                let every = Duration::from_millis(10);
                self.ping(
                    flow.from,
                    flow.to,
                    count as u64,
                    Pace::Train { interval: every },
                    Duration::from_millis(500),
                )
            });
            std::thread::sleep(after);
            let before = route();
            let cut_unix = unix_now();
            let cut_at = Instant::now();
            self.set_loss(cut, 100).map_err(|e| e.to_string())?;
            // Times count from the start of the cut; an echo counts once both ends drop.
            let cut_done = unix_now();
            let changed = route_change(cut_at, &cut_peer, &route);
            let reports = transfer
                .join()
                .map_err(|_| "transfer thread panicked".to_string())?;
            let echoes = echoes
                .join()
                .map_err(|_| "ping thread panicked".to_string())?;
            Ok((before, (cut_unix, cut_done), changed, reports, echoes))
        });
        let restored = self.set_loss(cut, restore).map_err(|e| e.to_string());
        let wires = watch.finish()?;
        let (before, (cut_unix, cut_done), changed, reports, echoes) = outcome?;
        restored?;
        let transfer = reports?.into_iter().next().ok_or("no transfer report")?;
        Ok(reroute(
            before,
            (cut_unix, cut_done),
            changed,
            transfer,
            &echoes?,
            wires.first().map_or(&[], |w| &w.data_frames_at),
        ))
    }

    /// Waits until node `at` routes towards edge gateway `edge` over `cut_peer`, as `route`
    /// reads its next hop (up to 20 s: a link recovering from loss is on probation for 10 s).
    fn wait_route_over(
        &self,
        at: usize,
        edge: usize,
        cut_peer: &str,
        route: &dyn Fn() -> Option<String>,
    ) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while route().as_deref() != Some(cut_peer) {
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} does not route towards {} over {cut_peer} (it says {:?})",
                    self.nodes[at].name,
                    self.nodes[edge].name,
                    route()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }
}

/// The time from `cut_at` to the next hop `route` reads moving off `cut_peer`, and the new
/// one, polled every 10 ms for up to 5 s.
fn route_change(
    cut_at: Instant,
    cut_peer: &str,
    route: &dyn Fn() -> Option<String>,
) -> Option<(Duration, Option<String>)> {
    while cut_at.elapsed() < Duration::from_secs(5) {
        let hop = route();
        if hop.is_some() && hop.as_deref() != Some(cut_peer) {
            return Some((cut_at.elapsed(), hop));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// What a cut measured: the route `before` it and its `changed`; `(cut_unix, cut_done)` the
/// cut's start and the moment both ends dropped (Unix seconds); the transfer; the echoes
/// beside it; `data` the Unix times of the transfer's data frames on the detour.
fn reroute(
    before: Option<String>,
    (cut_unix, cut_done): (f64, f64),
    changed: Option<(Duration, Option<String>)>,
    transfer: TransferReport,
    echoes: &PingReport,
    data: &[f64],
) -> Reroute {
    let first_echo = echoes
        .echoes
        .iter()
        .map(|e| e.sent_unix)
        .filter(|t| *t >= cut_done)
        .min_by(f64::total_cmp)
        .map(|t| (t - cut_unix) * 1000.0);
    let first_detour = data
        .iter()
        .find(|t| **t >= cut_unix)
        .map(|t| Duration::from_secs_f64(t - cut_unix));
    Reroute {
        route_before: before,
        route_after: changed.as_ref().and_then(|c| c.1.clone()),
        route_change_ms: changed.map(|c| ms(c.0)),
        first_detour_frame_ms: first_detour.map(ms),
        first_echo_after_cut_ms: first_echo,
        echoes_lost: echoes.lost(),
        detour_frames_before_cut: data
            .iter()
            .filter(|t| (cut_unix - 1.0..cut_unix).contains(*t))
            .count(),
        transfer,
    }
}

/// What [`RelayLab::cut_during`] measured.
#[derive(Debug, Clone, Serialize)]
pub struct Reroute {
    /// The cut link's end's next hop towards the destination before and after the cut.
    pub route_before: Option<String>,
    pub route_after: Option<String>,
    /// From the cut to the route change in that node's status (polled every 10 ms).
    pub route_change_ms: Option<f64>,
    /// From the cut to the first data frame of the transfer on the detour link (TCP sends it
    /// when its retransmission timer, backed off by the losses, next fires).
    pub first_detour_frame_ms: Option<f64>,
    /// From the cut to the sending of the first echo request (one every 10 ms) answered
    /// through the detour: when the path was back for any packet.
    pub first_echo_after_cut_ms: Option<f64>,
    /// Echoes lost to the cut.
    pub echoes_lost: u64,
    /// Data frames on the detour link in the second before the cut (0: the flow was all on
    /// the cut link, as it should be for the measurement to mean anything).
    pub detour_frames_before_cut: usize,
    pub transfer: TransferReport,
}

/// `[local]:port -> [remote]:port`, as a relay's status shows a link's send route.
pub fn parse_route(route: &str) -> Option<(SocketAddrV6, SocketAddrV6)> {
    let (a, b) = route.split_once("->")?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

/// The link's ingress loss rule on one end: a table of its own per interface, replaced whole
/// (declaring it first makes the delete succeed when it does not exist yet).
fn loss_ruleset(iface: &str, percent: u8) -> String {
    let table = format!("lab_loss_{}", iface.replace(['-', '.'], "_"));
    let mut s = format!("table netdev {table}\ndelete table netdev {table}\n");
    let rule = match percent {
        0 => return s,
        100.. => "counter drop".to_string(),
        p => format!("numgen random mod 100 < {p} counter drop"),
    };
    s.push_str(&format!(
        "table netdev {table} {{\n\tchain ingress {{\n\t\ttype filter hook ingress device \"{iface}\" priority 0; policy accept;\n\t\t{rule}\n\t}}\n}}\n"
    ));
    s
}

fn nft(ns: &Netns, script: &str) -> Result<(), LabError> {
    let mut child = ns
        .command("nft")
        .map_err(os_err(format!("nft in {}", ns.name())))?
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| cmd_err(format!("nft in {}: {e}", ns.name())))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| cmd_err(format!("nft stdin: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| cmd_err(format!("nft in {}: {e}", ns.name())))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(cmd_err(format!(
            "nft in {}: {}\n{script}",
            ns.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    #[test]
    fn routes_from_the_status_are_read() {
        let (l, r) =
            parse_route("[2001:db8:ff:1::5]:4000 -> [2001:db8:ff:2::6]:5000").expect("route");
        assert_eq!((l.port(), r.port()), (4000, 5000));
        assert_eq!(
            *r.ip(),
            "2001:db8:ff:2::6".parse::<Ipv6Addr>().expect("literal")
        );
        assert!(parse_route("-").is_none());
    }

    #[test]
    fn loss_rules_replace_the_table_and_cut_or_thin_the_link() {
        let none = loss_ruleset("l-r2", 0);
        assert_eq!(
            none,
            "table netdev lab_loss_l_r2\ndelete table netdev lab_loss_l_r2\n"
        );
        assert!(loss_ruleset("l-r2", 5).contains("numgen random mod 100 < 5 counter drop"));
        let cut = loss_ruleset("l-r2", 100);
        assert!(
            cut.contains("device \"l-r2\"") && cut.contains("\t\tcounter drop\n"),
            "{cut}"
        );
    }
}
