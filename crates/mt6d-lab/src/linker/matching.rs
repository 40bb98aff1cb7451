//! The joint assignment: each epoch's units paired with the next epoch's all at once, so that
//! a method which prefers one candidate for every unit cannot score by luck.

use rand::seq::SliceRandom;
use rand::SeedableRng;

/// Largest epoch (units per epoch) whose assignments are enumerated: 6! = 720. Larger epochs
/// take the optimal assignment (Hungarian algorithm) under [`SHUFFLES`] seeded shuffles of the
/// candidates' order, so that ties among optimal assignments are broken at random and a method
/// that cannot tell units apart is credited about chance, not whatever the order favours.
pub const MAX_MATCHING: usize = 6;
/// Shuffled orders averaged for epochs of more than [`MAX_MATCHING`] units.
const SHUFFLES: u64 = 16;

/// Credit of the true links of one epoch under the best joint assignment of `links`' units to
/// `candidates`: each true link counts the share of best-scoring assignments that contain it.
pub fn matching_credit(
    links: &[(usize, usize)],
    candidates: &[usize],
    score: impl Fn(usize, usize) -> f64,
) -> f64 {
    if links.is_empty() || links.len() > candidates.len() {
        return 0.0;
    }
    let table: Vec<Vec<f64>> = links
        .iter()
        .map(|&(a, _)| candidates.iter().map(|&b| score(a, b)).collect())
        .collect();
    if candidates.len() > MAX_MATCHING {
        return sampled_credit(links, candidates, &table);
    }
    // Every injective assignment of links to candidate positions, with its total.
    let mut all: Vec<(f64, Vec<usize>)> = Vec::new();
    let mut current = Vec::with_capacity(links.len());
    fn walk(
        table: &[Vec<f64>],
        current: &mut Vec<usize>,
        total: f64,
        all: &mut Vec<(f64, Vec<usize>)>,
    ) {
        let row = current.len();
        if row == table.len() {
            all.push((total, current.clone()));
            return;
        }
        for c in 0..table[row].len() {
            if !current.contains(&c) {
                current.push(c);
                walk(table, current, total + table[row][c], all);
                current.pop();
            }
        }
    }
    walk(&table, &mut current, 0.0, &mut all);
    let best = all.iter().map(|a| a.0).fold(f64::NEG_INFINITY, f64::max);
    // Sums taken in different orders differ in the last bits: equal within 1e-9 is a tie.
    let tolerance = 1e-9 * best.abs().max(1.0);
    let tied: Vec<&Vec<usize>> = all
        .iter()
        .filter(|a| (a.0 - best).abs() <= tolerance)
        .map(|a| &a.1)
        .collect();
    links
        .iter()
        .enumerate()
        .map(|(row, &(_, truth))| {
            let right = tied
                .iter()
                .filter(|assignment| candidates[assignment[row]] == truth)
                .count();
            right as f64 / tied.len() as f64
        })
        .sum()
}

/// The share of true links in the optimal assignment, averaged over shuffled candidate orders.
fn sampled_credit(links: &[(usize, usize)], candidates: &[usize], table: &[Vec<f64>]) -> f64 {
    // Scores relative to each row's best, so one row's huge values (a counter far away)
    // cannot swamp the float precision of another's.
    let table: Vec<Vec<f64>> = table
        .iter()
        .map(|row| {
            let best = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            row.iter()
                .map(|&s| if s.is_finite() { s - best } else { -1e12 })
                .collect()
        })
        .collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x6d74_3664);
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    let mut right = 0usize;
    for _ in 0..SHUFFLES {
        order.shuffle(&mut rng);
        let cost: Vec<Vec<f64>> = table
            .iter()
            .map(|row| order.iter().map(|&c| -row[c]).collect())
            .collect();
        let assignment = hungarian(&cost);
        right += links
            .iter()
            .enumerate()
            .filter(|(row, (_, truth))| candidates[order[assignment[*row]]] == *truth)
            .count();
    }
    right as f64 / SHUFFLES as f64
}

/// Minimum-cost assignment of every row to a distinct column (rows <= columns): the column of
/// each row. The O(n^2 m) shortest-augmenting-path form of the Hungarian algorithm (Kuhn 1955,
/// Jonker and Volgenant's potentials).
fn hungarian(cost: &[Vec<f64>]) -> Vec<usize> {
    let (n, m) = (cost.len(), cost.first().map_or(0, Vec::len));
    let (mut u, mut v) = (vec![0.0; n + 1], vec![0.0; m + 1]);
    // p[j]: the row (1-based) assigned to column j; way[j]: the previous column on the path.
    let (mut p, mut way) = (vec![0usize; m + 1], vec![0usize; m + 1]);
    for i in 1..=n {
        p[0] = i;
        let mut j0 = 0;
        let mut minv = vec![f64::INFINITY; m + 1];
        let mut used = vec![false; m + 1];
        loop {
            used[j0] = true;
            let i0 = p[j0];
            let (mut delta, mut j1) = (f64::INFINITY, 0);
            for j in 1..=m {
                if !used[j] {
                    let cur = cost[i0 - 1][j - 1] - u[i0] - v[j];
                    if cur < minv[j] {
                        minv[j] = cur;
                        way[j] = j0;
                    }
                    if minv[j] < delta {
                        delta = minv[j];
                        j1 = j;
                    }
                }
            }
            for j in 0..=m {
                if used[j] {
                    u[p[j]] += delta;
                    v[j] -= delta;
                } else {
                    minv[j] -= delta;
                }
            }
            j0 = j1;
            if p[j0] == 0 {
                break;
            }
        }
        loop {
            let j1 = way[j0];
            p[j0] = p[j1];
            j0 = j1;
            if j0 == 0 {
                break;
            }
        }
    }
    let mut row_to_col = vec![0; n];
    for j in 1..=m {
        if p[j] > 0 {
            row_to_col[p[j] - 1] = j - 1;
        }
    }
    row_to_col
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_joint_assignment_cancels_a_shared_preference_and_keeps_a_real_one() {
        // Flows 0 and 1 (truth: 0 -> 10, 1 -> 11). Both prefer candidate 10 by the same amount:
        // flow by flow one is right; jointly the two pairings tie.
        let shared = |_: usize, b: usize| if b == 10 { 1.0 } else { 0.0 };
        assert_eq!(matching_credit(&[(0, 10), (1, 11)], &[10, 11], shared), 1.0);
        // Each prefers its own successor: both right.
        let own = |a: usize, b: usize| if b == a + 10 { 1.0 } else { 0.0 };
        assert_eq!(matching_credit(&[(0, 10), (1, 11)], &[10, 11], own), 2.0);
        // Each prefers the other's: both wrong.
        let crossed = |a: usize, b: usize| if b != a + 10 { 1.0 } else { 0.0 };
        assert_eq!(
            matching_credit(&[(0, 10), (1, 11)], &[10, 11], crossed),
            0.0
        );
        // More flows than candidates: no credit, never a panic.
        assert_eq!(matching_credit(&[(0, 10), (1, 11)], &[10], own), 0.0);
    }

    #[test]
    fn large_epochs_are_matched_optimally_and_ties_score_about_chance() {
        const N: usize = 32;
        let links: Vec<(usize, usize)> = (0..N).map(|a| (a, a + 100)).collect();
        let candidates: Vec<usize> = (100..100 + N).collect();
        // Each prefers its own, weakly, and all prefer candidate 100 strongly: only the joint
        // optimum gets every link right.
        let own = |a: usize, b: usize| {
            f64::from(u8::from(b == a + 100)) + if b == 100 { 5.0 } else { 0.0 }
        };
        assert_eq!(matching_credit(&links, &candidates, own), N as f64);
        // Nothing to tell them apart: about one right per epoch (chance 1/32 each).
        let flat = matching_credit(&links, &candidates, |_, _| 0.0);
        assert!(flat <= 4.0, "{flat} of {N} under a flat score");
        // The optimum of a small cost matrix.
        assert_eq!(
            hungarian(&[
                vec![4.0, 1.0, 3.0],
                vec![2.0, 0.0, 5.0],
                vec![3.0, 2.0, 2.0]
            ]),
            [1, 0, 2]
        );
    }
}
