//! The soak's report: its measures at the end, its samples over time, and where the lost
//! packets went.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use super::{Loss, Meters, Sample, SoakArgs, REKEY_SECS, ROTATION_SECS};

pub(super) fn losses_report(losses: &[Loss], kernel: &BTreeMap<String, u64>) -> String {
    let mut r = String::from(
        "
## Where the losses were

",
    );
    if losses.is_empty() {
        r.push_str(
            "No RTP packet was lost.
",
        );
    } else {
        let near_boundary = losses
            .iter()
            .filter(|l| l.after_start_ms < 50.0 || l.before_next_ms < 50.0)
            .count();
        let near_handshake = losses
            .iter()
            .filter(|l| l.from_handshake_ms.is_some_and(|d| d < 500.0))
            .count();
        let _ = writeln!(
            r,
            "{} RTP packet(s) lost: {near_boundary} sent within 50 ms of an epoch boundary, \
             {near_handshake} within 500 ms of a handshake Gateway A completed.\n\n\
             | seq | sent (Unix s) | ms after epoch start | ms before next epoch | ms from nearest handshake |\n|---|---|---|---|---|",
            losses.len()
        );
        for l in losses.iter().take(50) {
            let _ = writeln!(
                r,
                "| {} | {:.3} | {:.1} | {:.1} | {} |",
                l.seq,
                l.sent_us as f64 / 1e6,
                l.after_start_ms,
                l.before_next_ms,
                l.from_handshake_ms
                    .map_or("-".into(), |d| format!("{d:.0}"))
            );
        }
    }
    r.push_str(
        "
Kernel drop counters that rose during the run (all namespaces of the lab):

",
    );
    if kernel.is_empty() {
        r.push_str(
            "none.
",
        );
    } else {
        r.push_str("| namespace, counter | increase |\n|---|---|\n");
        for (k, v) in kernel {
            let _ = writeln!(r, "| {k} | {v} |");
        }
    }
    r
}

pub(super) fn report(
    args: &SoakArgs,
    samples: &[Sample],
    m: &Meters,
    lost_pings: &[f64],
    failure: Option<&str>,
) -> String {
    let last = samples.last().cloned().unwrap_or_default();
    let first = samples.first().cloned().unwrap_or_default();
    let mut r = String::new();
    let (date, time) = crate::utc::utc_now();
    let _ = writeln!(r, "# mt6d soak, {date} {time} UTC\n");
    let _ = writeln!(
        r,
        "Switched lab, mode encrypt with handshakes, rotation every {ROTATION_SECS} s, rekey every {REKEY_SECS} s; \
         asked for {:.2} h, ran {} s; sample every {} s; Gateway B restarted {} time(s){}.\n",
        args.hours,
        last.elapsed_s,
        args.sample_secs,
        last.restarts,
        args.restart_every_mins
            .map_or(String::new(), |m| format!(" (every {m} min)"))
    );
    if let Some(f) = failure {
        let _ = writeln!(r, "**Stopped early:** {f}\n");
    }
    measures(&mut r, samples, m, &first, &last);
    if !lost_pings.is_empty() {
        let shown: Vec<String> = lost_pings
            .iter()
            .take(20)
            .map(|t| format!("{t:.3}"))
            .collect();
        let _ = writeln!(
            r,
            "\nUnanswered pings were sent at (Unix s, first 20): {}",
            shown.join(", ")
        );
    }
    over_time(&mut r, samples);
    r
}

/// The soak's table of measures: its counters at the end, and each gateway's memory and
/// descriptors over it.
fn measures(r: &mut String, samples: &[Sample], m: &Meters, first: &Sample, last: &Sample) {
    let pct = |lost: u64, sent: u64| {
        if sent == 0 {
            0.0
        } else {
            lost as f64 * 100.0 / sent as f64
        }
    };
    let range = |f: &dyn Fn(&Sample) -> u64| {
        let v: Vec<u64> = samples.iter().map(f).filter(|x| *x > 0).collect();
        (
            v.iter().copied().min().unwrap_or(0),
            v.iter().copied().max().unwrap_or(0),
        )
    };
    let _ = writeln!(r, "| measure | value |\n|---|---|");
    let _ = writeln!(
        r,
        "| rotations (Gateway A / B counters) | {} / {} |",
        last.rotations[0], last.rotations[1]
    );
    let _ = writeln!(
        r,
        "| handshakes, rekeys (A) | {}, {} |",
        last.handshakes[0], last.rekeys[0]
    );
    let _ = writeln!(
        r,
        "| TCP: bytes received, session breaks, corrupt reads, longest wait for data | {} B, {}, {}, {} ms |",
        last.tcp_bytes,
        last.tcp_breaks,
        m.tcp_corrupt.load(Ordering::Relaxed),
        m.tcp_longest_stall_ms.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        r,
        "| RTP-like UDP (50/s): sent, lost (%), duplicates, reordered | {}, {} ({:.4} %), {}, {} |",
        last.rtp_sent,
        last.rtp_lost,
        pct(last.rtp_lost, last.rtp_sent),
        m.rtp_duplicates.load(Ordering::Relaxed),
        m.rtp_reordered.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        r,
        "| RTP jitter (RFC 3550): last, max; max transit | {:.3} ms, {:.3} ms; {:.3} ms |",
        last.rtp_jitter_ms,
        m.rtp_max_jitter_us.load(Ordering::Relaxed) as f64 / 1000.0,
        m.rtp_max_transit_us.load(Ordering::Relaxed) as f64 / 1000.0
    );
    let _ = writeln!(
        r,
        "| ping train (5/s): sent, lost (%) | {}, {} ({:.4} %) |",
        last.ping_sent,
        last.ping_lost,
        pct(last.ping_lost, last.ping_sent)
    );
    for (i, name) in ["A", "B"].iter().enumerate() {
        let (lo, hi) = range(&|s| s.rss_kb[i]);
        let (flo, fhi) = range(&|s| s.fds[i]);
        let _ = writeln!(
            r,
            "| Gateway {name}: RSS first / min / max / last (kB); open descriptors min / max | {} / {lo} / {hi} / {}; {flo} / {fhi} |",
            first.rss_kb[i], last.rss_kb[i]
        );
    }
}

/// The samples, one row each.
fn over_time(r: &mut String, samples: &[Sample]) {
    let _ = writeln!(
        r,
        "\n## Over time\n\n| elapsed s | RSS A kB | RSS B kB | fds A | fds B | rotations A | TCP breaks | RTP lost | RTP jitter ms | pings lost |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for s in samples {
        let _ = writeln!(
            r,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.3} | {} |",
            s.elapsed_s,
            s.rss_kb[0],
            s.rss_kb[1],
            s.fds[0],
            s.fds[1],
            s.rotations[0],
            s.tcp_breaks,
            s.rtp_lost,
            s.rtp_jitter_ms,
            s.ping_lost
        );
    }
}
