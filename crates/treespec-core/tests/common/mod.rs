//! Shared statistics for the losslessness tests: a chi-square goodness-of-fit test with pooling of
//! sparse cells. Also included by the engine's `joint_chi2` test through a `#[path]` attribute.

#![allow(dead_code)]

use statrs::distribution::{ChiSquared, ContinuousCDF};

/// Familywise significance level of each test file; every individual test uses
/// `FAMILY_ALPHA / number_of_tests` (Bonferroni).
pub const FAMILY_ALPHA: f64 = 1e-4;

/// Cells whose expected count is below this are pooled.
pub const MIN_EXPECTED: f64 = 5.0;

/// Outcome of a goodness-of-fit test.
#[derive(Debug, Clone)]
pub struct Gof {
    /// Number of observations.
    pub n: u64,
    /// Chi-square statistic.
    pub stat: f64,
    /// Degrees of freedom (cells after pooling − 1).
    pub df: usize,
    /// Upper-tail probability of `stat` (1 when there is a single cell).
    pub p_value: f64,
    /// The cells whose deviation contributes most, as `(cell, observed, expected)`.
    pub worst: Vec<(usize, u64, f64)>,
}

/// Chi-square goodness of fit of `observed` counts against probabilities `probs` (renormalised
/// in f64). A count in a cell of probability 0 is an impossible outcome: an `Err`. Cells with an
/// expected count below [`MIN_EXPECTED`] are pooled into one cell; if that pool itself stays
/// below the minimum it is merged into the smallest remaining cell.
pub fn chi_square(observed: &[u64], probs: &[f64]) -> Result<Gof, String> {
    assert_eq!(observed.len(), probs.len(), "cells and probabilities differ");
    let n: u64 = observed.iter().sum();
    assert!(n > 0, "no observations");
    let total: f64 = probs.iter().sum();
    assert!(total > 0.0 && probs.iter().all(|&p| p >= 0.0 && p.is_finite()), "bad probabilities");
    let mut big: Vec<(u64, f64)> = Vec::new();
    let mut pool = (0u64, 0f64);
    for (i, (&o, &p)) in observed.iter().zip(probs).enumerate() {
        if p <= 0.0 {
            if o > 0 {
                return Err(format!("cell {i} has probability 0 but was observed {o} times out of {n}"));
            }
            continue;
        }
        let e = n as f64 * p / total;
        if e < MIN_EXPECTED {
            pool.0 += o;
            pool.1 += e;
        } else {
            big.push((o, e));
        }
    }
    if pool.1 > 0.0 {
        if pool.1 >= MIN_EXPECTED || big.is_empty() {
            big.push(pool);
        } else {
            let smallest = (0..big.len()).min_by(|&a, &b| big[a].1.total_cmp(&big[b].1)).expect("non-empty");
            big[smallest].0 += pool.0;
            big[smallest].1 += pool.1;
        }
    }
    let stat: f64 = big.iter().map(|&(o, e)| (o as f64 - e).powi(2) / e).sum();
    let df = big.len().saturating_sub(1);
    let p_value =
        if df == 0 { 1.0 } else { ChiSquared::new(df as f64).expect("df > 0").sf(stat).clamp(0.0, 1.0) };
    let mut worst: Vec<(usize, u64, f64)> =
        observed.iter().zip(probs).enumerate().map(|(i, (&o, &p))| (i, o, n as f64 * p / total)).collect();
    worst.sort_by(|a, b| {
        let da = (a.1 as f64 - a.2).powi(2) / a.2.max(1e-9);
        let db = (b.1 as f64 - b.2).powi(2) / b.2.max(1e-9);
        db.total_cmp(&da)
    });
    worst.truncate(4);
    Ok(Gof { n, stat, df, p_value, worst })
}

/// Two-sided p-value of `successes` out of `n` Bernoulli(`rate`) trials (normal approximation,
/// fine for the 10^5 trials used here); exact 0/1 rates must match exactly.
pub fn binomial_p_value(successes: u64, n: u64, rate: f64) -> f64 {
    if rate <= 0.0 {
        return if successes == 0 { 1.0 } else { 0.0 };
    }
    if rate >= 1.0 {
        return if successes == n { 1.0 } else { 0.0 };
    }
    let mean = n as f64 * rate;
    let sd = (n as f64 * rate * (1.0 - rate)).sqrt();
    let z = ((successes as f64 - mean).abs() - 0.5).max(0.0) / sd;
    // Two-sided normal tail: 2·(1 − Φ(z)) = 1 − erf(z/√2) via the chi-square(1) survival.
    ChiSquared::new(1.0).expect("df 1").sf(z * z)
}

/// Chi-square test `observed` against `probs` at level `alpha`, printing the statistic under
/// `name`; the failure to report, if any (a rejection or an impossible outcome).
pub fn gof_failure(name: &str, observed: &[u64], probs: &[f64], alpha: f64) -> Option<String> {
    match chi_square(observed, probs) {
        Ok(g) => {
            eprintln!("{name}: chi2 {:.1} df {} p {:.3e}", g.stat, g.df, g.p_value);
            (g.p_value <= alpha).then(|| format!("{name}: p {:.3e}, worst {:?}", g.p_value, g.worst))
        }
        Err(e) => Some(format!("{name}: {e}")),
    }
}
