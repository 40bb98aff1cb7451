//! A trained classifier: k nearest neighbours over pair features, as an attacker with captures
//! of their own would build one.
//!
//! A pair is a unit of epoch e and a candidate of epoch e+1; its features are the scores the
//! hand-written methods give it ([`FEATURES`]: each already a difference between the two
//! units' volume, sizes, period and phase, gaps, edges and hand-over time). Training takes
//! labelled pairs from captures the attacker made (the true successor of every unit and a few
//! of its decoys), scales each feature to zero mean and unit deviation, and keeps them. A new
//! pair scores the distance-weighted share of true pairs among its [`K`] nearest training pairs.
//! The lab trains on one run and tests on a fresh one, never the same capture.

use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::Method;

/// The methods whose scores make a pair's feature vector.
pub const FEATURES: [Method; 10] = [
    Method::Bytes,
    Method::Packets,
    Method::SizeDistribution,
    Method::TimingPhase,
    Method::SwitchGap,
    Method::Burstiness,
    Method::EdgeShape,
    Method::Handover,
    Method::PacketSizes,
    Method::PayloadLength,
];

/// Neighbours that vote.
const K: usize = 15;
/// Decoys kept per true pair in training: enough to learn what a decoy looks like without
/// letting 31 decoys per unit (32 conversations) drown the true pairs or slow the search.
const DECOYS_PER_LINK: usize = 4;

/// One labelled pair: its features (None where a method had nothing to read) and whether the
/// candidate is the true successor.
#[derive(Debug, Clone)]
pub struct Example {
    pub features: Vec<Option<f64>>,
    pub same: bool,
}

/// Picks the training pairs of one capture: every true pair and up to [`DECOYS_PER_LINK`]
/// decoys of each, chosen by a seeded shuffle (reproducible).
pub fn sample(true_pairs: Vec<Example>, decoys: Vec<Vec<Example>>, seed: u64) -> Vec<Example> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut out = true_pairs;
    for mut d in decoys {
        d.shuffle(&mut rng);
        out.extend(d.into_iter().take(DECOYS_PER_LINK));
    }
    out
}

/// A trained k-NN classifier.
#[derive(Debug, Clone, Default)]
pub struct Classifier {
    mean: Vec<f64>,
    scale: Vec<f64>,
    points: Vec<(Vec<f64>, bool)>,
}

impl Classifier {
    /// Trains on labelled pairs; None without at least one true and one false pair.
    pub fn train(examples: &[Example]) -> Option<Classifier> {
        if !examples.iter().any(|e| e.same) || examples.iter().all(|e| e.same) {
            return None;
        }
        let dims = examples[0].features.len();
        let mut mean = vec![0.0; dims];
        let mut scale = vec![1.0; dims];
        for d in 0..dims {
            let v: Vec<f64> = examples
                .iter()
                .filter_map(|e| e.features.get(d).copied().flatten())
                .filter(|x| x.is_finite())
                .collect();
            if v.is_empty() {
                continue;
            }
            let m = v.iter().sum::<f64>() / v.len() as f64;
            let sd = (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
            mean[d] = m;
            scale[d] = if sd > 1e-12 { sd } else { 1.0 };
        }
        let mut c = Classifier {
            mean,
            scale,
            points: Vec::new(),
        };
        c.points = examples
            .iter()
            .map(|e| (c.normalize(&e.features), e.same))
            .collect();
        Some(c)
    }

    /// Training pairs kept.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// Scaled features; a missing or non-finite one sits at the training mean (0).
    fn normalize(&self, features: &[Option<f64>]) -> Vec<f64> {
        self.mean
            .iter()
            .zip(&self.scale)
            .enumerate()
            .map(|(d, (m, s))| match features.get(d).copied().flatten() {
                Some(x) if x.is_finite() => (x - m) / s,
                _ => 0.0,
            })
            .collect()
    }

    /// How likely the pair is a true successor: the distance-weighted share of true pairs
    /// among the 15 nearest training pairs (`K`), in [0, 1].
    pub fn classify(&self, features: &[Option<f64>]) -> f64 {
        let x = self.normalize(features);
        let mut near: Vec<(f64, bool)> = self
            .points
            .iter()
            .map(|(p, same)| {
                let d: f64 = p.iter().zip(&x).map(|(a, b)| (a - b).powi(2)).sum();
                (d.sqrt(), *same)
            })
            .collect();
        let k = K.min(near.len());
        if k == 0 {
            return 0.0;
        }
        near.select_nth_unstable_by(k - 1, |a, b| a.0.total_cmp(&b.0));
        let (mut yes, mut all) = (0.0, 0.0);
        for (d, same) in &near[..k] {
            let w = 1.0 / (d + 1e-6);
            all += w;
            if *same {
                yes += w;
            }
        }
        yes / all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pair whose first feature tells true from false (near 0 for the true successor, far
    /// for a decoy), the rest noise; a fixed pseudorandom sequence from `seed`.
    fn pairs(n: usize, seed: u64) -> (Vec<Example>, Vec<Vec<Example>>) {
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut make = |same: bool| {
            let signal = if same {
                next() * 0.5
            } else {
                1.0 + next() * 3.0
            };
            let mut features = vec![Some(-signal)];
            features.extend((1..FEATURES.len()).map(|_| Some(next() * 4.0)));
            Example { features, same }
        };
        let truths = (0..n).map(|_| make(true)).collect();
        let decoys = (0..n)
            .map(|_| (0..7).map(|_| make(false)).collect())
            .collect();
        (truths, decoys)
    }

    #[test]
    fn trained_on_one_set_it_ranks_true_successors_of_a_fresh_set_first() {
        let (t, d) = pairs(200, 1);
        let c = Classifier::train(&sample(t, d, 7)).expect("trains");
        assert_eq!(c.len(), 200 * (1 + DECOYS_PER_LINK));
        // A fresh draw: each true pair against its seven decoys.
        let (t, d) = pairs(100, 99);
        let right = t
            .iter()
            .zip(&d)
            .filter(|(truth, decoys)| {
                let s = c.classify(&truth.features);
                decoys.iter().all(|e| c.classify(&e.features) < s)
            })
            .count();
        assert!(right >= 90, "{right} of 100 ranked first (chance 12.5)");
        // Without a signal (every feature noise) it does not rank them: about chance.
        let noise = |seed| {
            let (mut t, d) = pairs(100, seed);
            for e in &mut t {
                e.features[0] = Some(-1.0 - 3.0 * (e.features[1].unwrap_or(0.0) / 4.0));
            }
            (t, d)
        };
        let (t, d) = noise(5);
        let c = Classifier::train(&sample(t, d, 7)).expect("trains");
        let (t, d) = noise(11);
        let right = t
            .iter()
            .zip(&d)
            .filter(|(truth, decoys)| {
                let s = c.classify(&truth.features);
                decoys.iter().all(|e| c.classify(&e.features) < s)
            })
            .count();
        assert!(right <= 30, "{right} of 100 ranked first without a signal");
        // Nothing to learn from: no classifier.
        assert!(Classifier::train(&[]).is_none());
    }
}
