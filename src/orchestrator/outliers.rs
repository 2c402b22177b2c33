//! The robust norm check of merge uploads: an upload whose distance from the reference state
//! (the previous global state, or the seed's initial state before the first merge) is an
//! outlier among the section's uploads is left out of the merge.
//!
//! Each upload is summarised by the L2 distance of each of its three blocks (parameters,
//! first moments, second moments) from the same block of the reference; second moments are
//! compared by their square roots (the gradients' RMS scale, in which they enter the step), so
//! their spread among honest uploads is linear in the gradients' scale like the other blocks'.
//! Compared raw, two honest head miners of the same work were measured 55x apart in epoch 0
//! (tiny batches, a loaded machine): squares of gradients a few times larger, and a few
//! embedding rows of rare tokens, dominate an L2 norm of squares. Two rules, per block:
//! - **relative** (3 or more peers): a distance above `factor` times the median of the
//!   peers' distances for that block. The median ignores up to half the peers, so a
//!   minority cannot move the bar. An honest state moves further the more steps it takes, so
//!   the bar of an upload whose work (its backwards this epoch, counted by the orchestrator,
//!   not reported by the miner) is above the peers' median work grows with the ratio, up to
//!   `factor` times: a miner that trained 3x more than its peers under uneven load may move
//!   3x further. Work below the median never tightens the bar;
//! - **absolute** (any number of uploads, so also when two disagree and neither is a majority):
//!   a distance above [`ABSOLUTE_FACTOR`] times the norm of the reference parameters. An honest
//!   epoch of training moves a state by a small fraction of its own norm.
//!
//! The peers are the uploads that carry merge weight: they set the medians and are held to both
//! rules. An upload of zero weight does not enter the mean, but it stays in the merge plan (its
//! miner merges partitions), so it is held to the absolute rule: a huge one must not pass
//! because it weighs nothing.
//!
//! A finite but huge upload (±3e38), which the finiteness check lets through and which would
//! dominate a mean, fails both.

/// An upload's distance from the reference may be at most this many times the norm of the
/// reference parameters.
pub const ABSOLUTE_FACTOR: f64 = 100.0;

/// Blocks of a flat state, in order, as the refusals name what was measured.
pub const BLOCKS: [&str; 3] = ["parameters", "exp_avg", "square roots of exp_avg_sq"];

/// What the check needs to know of one upload.
#[derive(Debug, Clone, PartialEq)]
pub struct UploadDistance {
    /// The uploader.
    pub miner: String,
    /// L2 distance of each block from the reference ([`BLOCKS`] order; the second moments'
    /// square roots for the last).
    pub distance: [f64; 3],
    /// L2 norm of the reference parameters.
    pub reference_norm: f64,
}

/// One upload as the check sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Its distances from the reference.
    pub distance: UploadDistance,
    /// Whether it carries merge weight, so sets the medians and is held to the relative rule.
    pub peer: bool,
    /// The work behind it: the uploader's backwards in the epoch, as the orchestrator counted.
    pub work: f64,
}

/// The uploads to leave out, each with the reason, among `uploads` (one section's accepted
/// uploads), for a relative `factor` (`merge.outlier_factor`).
pub fn outliers(uploads: &[Candidate], factor: f64) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let peers: Vec<&Candidate> = uploads.iter().filter(|c| c.peer).collect();
    let enough = peers.len() >= 3;
    let medians: Vec<Option<f64>> = (0..BLOCKS.len())
        .map(|b| enough.then(|| median(peers.iter().map(|c| c.distance.distance[b]).collect())))
        .collect();
    let median_work = enough.then(|| median(peers.iter().map(|c| c.work).collect()));
    for Candidate {
        distance: u,
        peer,
        work,
    } in uploads
    {
        let bound = ABSOLUTE_FACTOR * u.reference_norm;
        // How much further than the median this upload may move for the work it did.
        let allowance = match median_work {
            Some(m) if m > 0.0 && *work > m => (work / m).min(factor),
            _ => 1.0,
        };
        let reason = BLOCKS.iter().enumerate().find_map(|(b, name)| {
            let d = u.distance[b];
            if !d.is_finite() || d > bound {
                return Some(format!(
                    "{name} are {d:.3e} away from the previous global state, more than \
                     {ABSOLUTE_FACTOR} x its parameter norm ({:.3e})",
                    u.reference_norm
                ));
            }
            match medians[b] {
                Some(m) if *peer && d > factor * allowance * m + f64::EPSILON * bound => {
                    Some(format!(
                        "{name} are {d:.3e} away from the previous global state, more than \
                         {:.3} x the median distance of the section's uploads ({m:.3e})",
                        factor * allowance
                    ))
                }
                _ => None,
            }
        });
        if let Some(reason) = reason {
            out.push((u.miner.clone(), reason));
        }
    }
    out
}

/// The median (mean of the middle two for an even count); `values` must not be empty.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Accumulates the per-block distances of one upload, chunk by chunk.
#[derive(Debug, Clone, Default)]
pub struct DistanceSum {
    squares: [f64; 3],
    reference_squares: f64,
}

impl DistanceSum {
    /// Adds the values at flat indices `start..start + upload.len()`; `params_len` is the size
    /// of each block.
    pub fn add(&mut self, start: u64, upload: &[f32], reference: &[f32], params_len: u64) {
        let n = upload.len().min(reference.len());
        let p = params_len.max(1);
        // One run per block the values cross (parameters, first moments, second moments, the
        // last taking everything past them), summed in index order as one loop would.
        let mut i = 0;
        while i < n {
            let index = start + i as u64;
            let block = usize::try_from(index / p).unwrap_or(2).min(2);
            let end = if block < 2 {
                let block_end = (index / p + 1).saturating_mul(p) - start;
                usize::try_from(block_end).map_or(n, |e| e.min(n))
            } else {
                n
            };
            let (u, r) = (&upload[i..end], &reference[i..end]);
            let squares = &mut self.squares[block];
            if block < 2 {
                for (u, r) in u.iter().zip(r) {
                    let d = f64::from(*u) - f64::from(*r);
                    *squares += d * d;
                }
            } else {
                // Second moments are never negative once decoded; `max` keeps a stray one
                // from turning into NaN.
                for (u, r) in u.iter().zip(r) {
                    let d = f64::from(u.max(0.0)).sqrt() - f64::from(r.max(0.0)).sqrt();
                    *squares += d * d;
                }
            }
            if block == 0 {
                // In the same order as the distances: each sum runs on its own.
                for r in r {
                    self.reference_squares += f64::from(*r) * f64::from(*r);
                }
            }
            i = end;
        }
    }

    /// The distances and the reference norm.
    pub fn finish(&self, miner: &str) -> UploadDistance {
        UploadDistance {
            miner: miner.to_string(),
            distance: self.squares.map(f64::sqrt),
            reference_norm: self.reference_squares.sqrt(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(miner: &str, d: [f64; 3]) -> Candidate {
        let distance = UploadDistance {
            miner: miner.into(),
            distance: d,
            reference_norm: 10.0,
        };
        Candidate {
            distance,
            peer: true,
            work: 8.0,
        }
    }

    #[test]
    fn honest_spread_passes_and_a_far_upload_is_named() {
        let honest = [
            up("a", [1.0, 0.1, 0.01]),
            up("b", [2.5, 0.2, 0.02]),
            up("c", [1.5, 0.15, 0.01]),
        ];
        assert!(outliers(&honest, 10.0).is_empty());
        let mut with_bad = honest.to_vec();
        with_bad.push(up("x", [1.2, 30.0, 0.01]));
        let out = outliers(&with_bad, 10.0);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, "x");
        assert!(out[0].1.contains("exp_avg"), "{}", out[0].1);
    }

    #[test]
    fn a_huge_upload_fails_even_when_only_two_merge() {
        let two = [up("a", [1.0, 0.1, 0.1]), up("x", [3e38, 0.1, 0.1])];
        let out = outliers(&two, 10.0);
        assert_eq!(out, vec![("x".to_string(), out[0].1.clone())]);
        assert!(out[0].1.contains("parameters"));
        let inf = [up("a", [1.0, 0.1, 0.1]), up("y", [f64::INFINITY, 0.1, 0.1])];
        assert_eq!(outliers(&inf, 10.0).len(), 1);
    }

    #[test]
    fn a_zero_weight_upload_is_held_to_the_absolute_rule_and_sets_no_median() {
        let peers = [
            up("a", [1.0, 0.1, 0.01]),
            up("b", [2.5, 0.2, 0.02]),
            up("c", [1.5, 0.15, 0.01]),
        ];
        let idle = |d: [f64; 3]| Candidate {
            peer: false,
            work: 0.0,
            ..up("z", d)
        };
        // A huge one weighs nothing in the mean but stays in the plan: it is refused.
        let mut with = peers.to_vec();
        with.push(idle([3e38, 0.1, 0.01]));
        assert_eq!(outliers(&with, 10.0).len(), 1);
        // Far from the peers' median but below the absolute bound: it moves no mean, it passes
        // (the same upload from a peer is refused).
        with.pop();
        with.push(idle([30.0, 0.1, 0.01]));
        assert!(outliers(&with, 10.0).is_empty());
        with.last_mut().expect("pushed").peer = true;
        assert_eq!(outliers(&with, 10.0)[0].0, "z");
        // An honest idle upload (it holds the reference) passes, and non-peers set no median:
        // with two peers only the absolute bound applies.
        let two = [up("a", [1.0, 0.1, 0.01]), up("b", [50.0, 0.1, 0.01])];
        let idle_ones = [idle([0.0; 3]), idle([0.0; 3])];
        let all: Vec<_> = two.iter().chain(&idle_ones).cloned().collect();
        assert!(outliers(&all, 10.0).is_empty());
    }

    #[test]
    fn more_work_than_the_peers_widens_the_bar_in_proportion_up_to_the_factor() {
        let peers = [
            up("a", [1.0, 0.1, 0.001]),
            up("b", [1.2, 0.1, 0.001]),
            up("c", [1.1, 0.1, 0.001]),
        ];
        // 15x the median second-moment distance: refused at the median work (8 backwards)...
        let busy = |work: f64| Candidate {
            work,
            ..up("d", [1.5, 0.1, 0.015])
        };
        let with = |c: Candidate| {
            let mut all = peers.to_vec();
            all.push(c);
            outliers(&all, 10.0)
        };
        assert_eq!(with(busy(8.0)).len(), 1);
        // ...passes with 2x the median work (bar 20x).
        assert!(with(busy(16.0)).is_empty());
        // Less work than the median never tightens the bar: 9x passes with 1 backward.
        let light = Candidate {
            work: 1.0,
            ..up("e", [1.0, 0.1, 0.009])
        };
        assert!(with(light).is_empty());
        // The widening stops at `factor` (bar 100x): far-off moments fail whatever the work.
        let far = |work: f64| Candidate {
            work,
            ..up("f", [1.0, 0.1, 0.2])
        };
        let out = with(far(1e6));
        assert_eq!(out.len(), 1);
        assert!(out[0].1.contains("100.000 x"), "{}", out[0].1);
    }

    #[test]
    fn one_upload_is_only_held_to_the_absolute_bound() {
        assert!(outliers(&[up("a", [900.0, 1.0, 1.0])], 10.0).is_empty());
        assert_eq!(outliers(&[up("a", [1001.0, 1.0, 1.0])], 10.0).len(), 1);
    }

    #[test]
    fn distances_are_summed_per_block() {
        let mut sum = DistanceSum::default();
        // Two parameters, then two first moments, then two second moments (compared by their
        // square roots: sqrt(4) - 0 = 2).
        sum.add(0, &[3.0, 0.0, 1.0], &[0.0, 4.0, 0.0], 2);
        sum.add(3, &[0.0, 4.0, 0.0], &[0.0, 0.0, 0.0], 2);
        let d = sum.finish("m");
        assert_eq!(d.distance, [5.0, 1.0, 2.0]);
        assert_eq!(d.reference_norm, 4.0);
    }

    /// The case measured in `network_adversaries` under load: an honest head miner whose
    /// gradients ran about 7.4x larger than its peer's had second moments 55x further from the
    /// (zero) starting moments, and was refused at the 10x bar. By square roots it is 7.4x
    /// away and passes; moments scaled 1000x (31.6x by square roots) are still refused.
    #[test]
    fn second_moments_are_compared_by_their_square_roots() {
        let p = 4;
        let candidate = |name: &str, g: f32| {
            // Parameters moved by 0.1 from 1, first moments g / 10, second moments g^2 / 1000
            // (from zero moments).
            let flat: Vec<f32> =
                [vec![1.1; p], vec![g / 10.0; p], vec![g * g / 1000.0; p]].concat();
            let reference: Vec<f32> = [vec![1.0; p], vec![0.0; 2 * p]].concat();
            let mut sum = DistanceSum::default();
            sum.add(0, &flat, &reference, p as u64);
            Candidate {
                distance: sum.finish(name),
                peer: true,
                work: 8.0,
            }
        };
        let peers = [
            candidate("a", 1.0),
            candidate("b", 1.0),
            candidate("c", 1.2),
        ];
        let raw = |g: f32| (g * g / 1000.0) as f64 * (p as f64).sqrt();
        assert!(
            raw(7.4) / raw(1.0) > 50.0,
            "the raw distances were 55x apart"
        );
        let with = |c: Candidate| {
            let mut all = peers.to_vec();
            all.push(c);
            outliers(&all, 10.0)
        };
        // First moments 7.4x away too: within the bar.
        assert!(with(candidate("d", 7.4)).is_empty());
        // Second moments 1000x an honest peer's, all else honest.
        let mut scaled = candidate("e", 1.0);
        scaled.distance.distance[2] *= 1000f64.sqrt();
        let out = with(scaled);
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(
            out[0].1.contains("square roots of exp_avg_sq"),
            "{}",
            out[0].1
        );
    }

    #[test]
    fn chunks_of_any_size_sum_exactly_as_one_pass_over_each_value() {
        let p = 7u64;
        let n = 3 * p as usize + 5; // values past the second moments count as second moments
        let upload: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let reference: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut want = ([0.0f64; 3], 0.0f64);
        for (i, (u, r)) in upload.iter().zip(&reference).enumerate() {
            let block = (i / p as usize).min(2);
            let d = if block == 2 {
                f64::from(u.max(0.0)).sqrt() - f64::from(r.max(0.0)).sqrt()
            } else {
                f64::from(*u) - f64::from(*r)
            };
            want.0[block] += d * d;
            if block == 0 {
                want.1 += f64::from(*r) * f64::from(*r);
            }
        }
        for chunk in [1, 2, 3, 5, 7, 8, 13, n] {
            let mut sum = DistanceSum::default();
            for start in (0..n).step_by(chunk) {
                let end = (start + chunk).min(n);
                sum.add(start as u64, &upload[start..end], &reference[start..end], p);
            }
            assert_eq!(sum.squares, want.0, "chunks of {chunk}");
            assert_eq!(sum.reference_squares, want.1, "chunks of {chunk}");
        }
    }
}
