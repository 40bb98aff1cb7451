//! Traffic analysis: what the packets' times and sizes tell an observer who reads no header.
//!
//! These are the methods a flow correlator uses on any encrypted tunnel (Tor, VPNs): the volume
//! of a unit (bytes and packets per epoch), its size distribution, a periodic sender's phase,
//! the gaps at the switch, burstiness, and the sizes and gaps of the packets at the unit's
//! edges (DeepCorr's input, Nasr et al. CCS 2018, reduced to a distance). Each reads one
//! direction of a unit (one sender's packets in one epoch) and compares it with the same
//! sender's direction of a candidate of the next epoch; a larger score means "more likely the
//! same conversation". They never look at a header byte, so encryption does not hide what
//! they read: only traffic shaping (padding, cover traffic, a route shared by conversations)
//! does.

use super::Method;

/// Packets kept at each edge of a unit for the phase and edge methods.
const EDGE: usize = 32;
/// Packets the edge-shape method compares (the first or last N, DeepCorr-style).
const EDGE_SHAPE: usize = 8;
/// Size-histogram bin width in bytes.
const SIZE_BIN: u32 = 64;
/// Gaps of one dominant period are collected in bins of this width (seconds).
const GAP_BIN: f64 = 0.001;

/// What one sender's packets of one unit look like, reduced once per unit.
#[derive(Debug, Clone, Default)]
pub(super) struct Features {
    pub packets: u32,
    pub bytes: u64,
    /// Packets per [`SIZE_BIN`]-byte bin of the wire length.
    pub sizes: std::collections::BTreeMap<u32, u32>,
    /// Times and wire lengths of the first and last [`EDGE`] packets.
    pub first: Vec<(f64, u32)>,
    pub last: Vec<(f64, u32)>,
    /// The size bin with the most packets: a correlator follows one sub-flow (the echo
    /// train, the TCP segments) rather than their merge, whose gaps interleave.
    pub class: u32,
    /// Times of the last [`EDGE`] packets of that size bin.
    pub class_last: Vec<f64>,
    /// The dominant inter-arrival time of that size bin (the most common gap, to
    /// [`GAP_BIN`]), if any gap repeats.
    pub period: Option<f64>,
    /// Coefficient of variation of the gaps (0 for a perfect timer, 1 for Poisson).
    pub burstiness: Option<f64>,
}

impl Features {
    /// Reduces one direction's packets (capture time, wire length), in capture order.
    pub fn new(packets: &[(f64, u32)]) -> Features {
        let mut p = packets.to_vec();
        p.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut f = Features {
            packets: p.len() as u32,
            bytes: p.iter().map(|x| u64::from(x.1)).sum(),
            first: p.iter().take(EDGE).copied().collect(),
            last: p[p.len().saturating_sub(EDGE)..].to_vec(),
            ..Features::default()
        };
        for x in &p {
            *f.sizes.entry(x.1 / SIZE_BIN).or_default() += 1;
        }
        // Most packets; among equals the smaller size.
        f.class = f
            .sizes
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map_or(0, |(&bin, _)| bin);
        let class: Vec<f64> = p
            .iter()
            .filter(|x| x.1 / SIZE_BIN == f.class)
            .map(|x| x.0)
            .collect();
        f.class_last = class[class.len().saturating_sub(EDGE)..].to_vec();
        f.period = dominant_period(&class.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>());
        let gaps: Vec<f64> = p.windows(2).map(|w| w[1].0 - w[0].0).collect();
        if gaps.len() >= 2 {
            let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
            let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
            f.burstiness = (mean > 0.0).then(|| var.sqrt() / mean);
        }
        f
    }
}

/// The most common gap (in [`GAP_BIN`] bins, at least 2 ms apart from nothing), refined to the
/// median of the gaps in its bin; None when no bin holds two gaps.
fn dominant_period(gaps: &[f64]) -> Option<f64> {
    let mut bins: std::collections::BTreeMap<u64, Vec<f64>> = std::collections::BTreeMap::new();
    for &g in gaps.iter().filter(|&&g| g >= GAP_BIN) {
        bins.entry((g / GAP_BIN) as u64).or_default().push(g);
    }
    // Most gaps first; among equals the shorter period (more cycles, better phase).
    let (_, mut best) = bins
        .into_iter()
        .filter(|(_, v)| v.len() >= 2)
        .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(&a.0)))?;
    best.sort_by(f64::total_cmp);
    Some(best[best.len() / 2])
}

/// How far apart two non-negative amounts are on a log scale (0 when equal).
fn log_distance(a: f64, b: f64) -> f64 {
    ((a + 1.0) / (b + 1.0)).ln().abs()
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// The median of the gaps between the last (or first) few packets of a unit.
fn edge_gap(edge: &[(f64, u32)], at_end: bool) -> Option<f64> {
    let n = edge.len();
    let window = if at_end {
        &edge[n.saturating_sub(4)..]
    } else {
        &edge[..n.min(4)]
    };
    median(window.windows(2).map(|w| w[1].0 - w[0].0).collect())
}

/// Phase continuation: with the dominant period P of unit `a`'s main size bin, the circular
/// mean phase of its last packets there (relative to its last packet, so no error in P is
/// multiplied by the Unix time), and how well `b`'s first packets of the same size bin sit on
/// the same lattice: the mean cosine of their phase differences, 1 when they continue it
/// exactly, about 0 when they are unrelated.
fn phase_continuation(a: &Features, b: &Features) -> Option<f64> {
    let p = a.period?;
    let t0 = *a.class_last.last()?;
    let angle = |t: f64| std::f64::consts::TAU * ((t - t0) / p).rem_euclid(1.0);
    let (s, c) = a
        .class_last
        .iter()
        .map(|&t| angle(t))
        .fold((0.0, 0.0), |(s, c), th| (s + th.sin(), c + th.cos()));
    if s == 0.0 && c == 0.0 {
        return None;
    }
    let theta = s.atan2(c);
    let fit: Vec<f64> = b
        .first
        .iter()
        .filter(|x| x.1 / SIZE_BIN == a.class)
        .map(|x| (angle(x.0) - theta).cos())
        .collect();
    (!fit.is_empty()).then(|| fit.iter().sum::<f64>() / fit.len() as f64)
}

/// The last [`EDGE_SHAPE`] packets of `a` against the first of `b`: log sizes and log gaps,
/// each set sorted (so one reordered packet does not shift the rest), mean absolute difference.
fn edge_shape(a: &Features, b: &Features) -> f64 {
    let tail = &a.last[a.last.len().saturating_sub(EDGE_SHAPE)..];
    let head = &b.first[..b.first.len().min(EDGE_SHAPE)];
    let shape = |e: &[(f64, u32)]| {
        let mut sizes: Vec<f64> = e.iter().map(|x| f64::from(x.1).ln()).collect();
        let mut gaps: Vec<f64> = e
            .windows(2)
            .map(|w| (w[1].0 - w[0].0).max(1e-6).ln())
            .collect();
        sizes.sort_by(f64::total_cmp);
        gaps.sort_by(f64::total_cmp);
        (sizes, gaps)
    };
    let ((sa, ga), (sb, gb)) = (shape(tail), shape(head));
    let diff = |x: &[f64], y: &[f64]| -> f64 {
        let n = x.len().max(y.len());
        if n == 0 {
            return 0.0;
        }
        // A missing packet counts as far as the largest difference one can make.
        (0..n)
            .map(|i| match (x.get(i), y.get(i)) {
                (Some(u), Some(v)) => (u - v).abs(),
                _ => 10.0,
            })
            .sum::<f64>()
            / n as f64
    };
    -(diff(&sa, &sb) + diff(&ga, &gb))
}

/// The score of one sender's direction pair under a traffic-analysis method; None for a
/// method that is not one, or when the method has nothing to read (e.g. no period).
pub(super) fn score(m: Method, a: &Features, b: &Features) -> Option<f64> {
    Some(match m {
        Method::Bytes => -log_distance(a.bytes as f64, b.bytes as f64),
        Method::Packets => -log_distance(f64::from(a.packets), f64::from(b.packets)),
        Method::SizeDistribution => super::overlap(&a.sizes, &b.sizes),
        Method::TimingPhase => phase_continuation(a, b)?,
        Method::SwitchGap => {
            let (ga, gb) = (edge_gap(&a.last, true)?, edge_gap(&b.first, false)?);
            -(ga.max(1e-6) / gb.max(1e-6)).ln().abs()
        }
        Method::Burstiness => -(a.burstiness? - b.burstiness?).abs(),
        Method::EdgeShape => edge_shape(a, b),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A train of `n` packets of `size` bytes, one every `period` s from `start`.
    fn train(start: f64, period: f64, n: usize, size: u32) -> Vec<(f64, u32)> {
        (0..n).map(|i| (start + i as f64 * period, size)).collect()
    }

    #[test]
    fn a_periodic_flow_continuing_its_phase_scores_above_one_shifted_by_half() {
        let a = Features::new(&train(0.003, 0.01, 100, 150));
        let same = Features::new(&train(1.003, 0.01, 100, 150));
        let shifted = Features::new(&train(1.008, 0.01, 100, 150));
        assert!((a.period.expect("period") - 0.01).abs() < 1e-9);
        let (s, d) = (
            score(Method::TimingPhase, &a, &same).expect("score"),
            score(Method::TimingPhase, &a, &shifted).expect("score"),
        );
        assert!(s > 0.99 && d < -0.99, "{s} {d}");
        // Every other method sees two identical trains.
        for m in [Method::Bytes, Method::Burstiness, Method::SwitchGap] {
            let (s, d) = (score(m, &a, &same), score(m, &a, &shifted));
            assert!(
                (s.expect("score") - d.expect("score")).abs() < 1e-9,
                "{m:?}"
            );
        }
    }

    #[test]
    fn the_phase_of_the_main_size_class_survives_a_second_interleaved_train() {
        // A 100/s train of small packets merged with a 50/s train of large ones at another
        // phase: the merge's gaps alternate, the small packets' period is still 10 ms.
        let mix = |start: f64, phase: f64| {
            let mut v = train(start + phase, 0.01, 100, 150);
            v.extend(train(start + 0.0037, 0.02, 50, 1300));
            Features::new(&v)
        };
        let a = mix(0.0, 0.002);
        assert_eq!(a.class, 150 / SIZE_BIN);
        assert!((a.period.expect("period") - 0.01).abs() < 1e-9);
        let same = score(Method::TimingPhase, &a, &mix(1.0, 0.002)).expect("score");
        let other = score(Method::TimingPhase, &a, &mix(1.0, 0.007)).expect("score");
        assert!(same > 0.99 && other < -0.99, "{same} {other}");
    }

    #[test]
    fn volumes_and_sizes_tell_a_bulk_flow_from_an_echo_train() {
        let bulk = Features::new(&train(0.0, 0.001, 900, 1400));
        let echo = Features::new(&train(0.0, 0.2, 5, 118));
        let bulk2 = Features::new(&train(1.0, 0.001, 880, 1400));
        for m in [
            Method::Bytes,
            Method::Packets,
            Method::SizeDistribution,
            Method::EdgeShape,
        ] {
            let (right, wrong) = (
                score(m, &bulk, &bulk2).expect("score"),
                score(m, &bulk, &echo).expect("score"),
            );
            assert!(right > wrong, "{m:?}: {right} vs {wrong}");
        }
        assert_eq!(score(Method::FlowLabel, &bulk, &echo), None);
    }

    #[test]
    fn burstiness_is_zero_for_a_timer_and_near_one_for_poisson() {
        let timer = Features::new(&train(0.0, 0.01, 200, 100));
        assert!(timer.burstiness.expect("cv") < 1e-6);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut t = 0.0;
        let poisson: Vec<(f64, u32)> = (0..2000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                t += -0.01 * ((x >> 11) as f64 / (1u64 << 53) as f64).max(1e-12).ln();
                (t, 100)
            })
            .collect();
        let cv = Features::new(&poisson).burstiness.expect("cv");
        assert!((cv - 1.0).abs() < 0.1, "{cv}");
    }
}
