//! A dense probability distribution over the vocabulary, and the few operations the
//! verifiers need: point masses, residuals `norm(max(p − q, 0))`, removal of a token, sampling.
//!
//! Dense storage keeps every operation aligned by token id (aligning residuals by sorted rank is a
//! known bug in peers). Sums are accumulated in f64 so a 150k-token vocabulary stays normalised.

use crate::rng::StreamRng;
use crate::{Error, Result, TokenId};

/// A normalised probability vector indexed by token id.
#[derive(Debug, Clone, PartialEq)]
pub struct Dist {
    probs: Vec<f32>,
}

impl Dist {
    /// Normalise non-negative weights into a distribution. Errors on an empty vector, on a
    /// negative or non-finite weight, and on zero total mass.
    pub fn from_weights(mut weights: Vec<f32>) -> Result<Self> {
        if weights.is_empty() {
            return Err(Error::EmptyVocab);
        }
        let mut total = 0f64;
        for (i, &w) in weights.iter().enumerate() {
            if !w.is_finite() || w < 0.0 {
                return Err(Error::Invalid(format!(
                    "weight {w} at token {i} is not a finite non-negative number"
                )));
            }
            total += w as f64;
        }
        if total <= 0.0 {
            return Err(Error::NoMass);
        }
        let inv = 1.0 / total;
        for w in &mut weights {
            *w = (*w as f64 * inv) as f32;
        }
        Ok(Self { probs: weights })
    }

    /// All mass on `token`.
    pub fn point_mass(token: TokenId, vocab: usize) -> Result<Self> {
        if vocab == 0 {
            return Err(Error::EmptyVocab);
        }
        if token as usize >= vocab {
            return Err(Error::TokenOutOfRange { token, vocab });
        }
        let mut probs = vec![0.0; vocab];
        probs[token as usize] = 1.0;
        Ok(Self { probs })
    }

    /// Vocabulary size.
    pub fn len(&self) -> usize {
        self.probs.len()
    }

    /// Always false: a distribution has at least one entry.
    pub fn is_empty(&self) -> bool {
        self.probs.is_empty()
    }

    /// Probability of `token` (0 outside the vocabulary).
    pub fn prob(&self, token: TokenId) -> f32 {
        self.probs.get(token as usize).copied().unwrap_or(0.0)
    }

    /// The probability vector.
    pub fn probs(&self) -> &[f32] {
        &self.probs
    }

    /// The most probable token (lowest id on ties, so results are deterministic).
    pub fn argmax(&self) -> TokenId {
        argmax(&self.probs)
    }

    /// Number of tokens with non-zero probability.
    pub fn support_len(&self) -> usize {
        self.probs.iter().filter(|&&p| p > 0.0).count()
    }

    /// Draw one token.
    pub fn sample(&self, rng: &mut StreamRng) -> TokenId {
        let total: f64 = self.probs.iter().map(|&p| p as f64).sum();
        let target = rng.uniform() * total;
        let mut acc = 0f64;
        let mut last_nonzero = 0;
        for (i, &p) in self.probs.iter().enumerate() {
            if p > 0.0 {
                acc += p as f64;
                last_nonzero = i;
                if target < acc {
                    return i as TokenId;
                }
            }
        }
        // Rounding left `target` at the very top of the range: the last token with mass.
        last_nonzero as TokenId
    }

    /// `norm(max(self − q, 0))`, or `None` when no mass is left (then `self ≤ q` everywhere, which
    /// with equal totals means `self == q`: a rejection could not have happened).
    pub fn residual(&self, q: &Dist) -> Option<Dist> {
        debug_assert_eq!(self.len(), q.len());
        let weights: Vec<f32> = self.probs.iter().zip(&q.probs).map(|(&p, &q)| (p - q).max(0.0)).collect();
        Dist::from_weights(weights).ok()
    }

    /// This distribution with `token` zeroed and renormalised, or `None` when nothing is left.
    pub fn without(&self, token: TokenId) -> Option<Dist> {
        let mut weights = self.probs.clone();
        if let Some(w) = weights.get_mut(token as usize) {
            *w = 0.0;
        }
        Dist::from_weights(weights).ok()
    }
}

/// Index of the largest value (lowest index on ties). NaN never wins.
pub fn argmax(values: &[f32]) -> TokenId {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in values.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best as TokenId
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Stream;

    #[test]
    fn normalises_and_rejects_bad_weights() {
        let d = Dist::from_weights(vec![1.0, 3.0]).unwrap();
        assert!((d.prob(1) - 0.75).abs() < 1e-6);
        assert_eq!(Dist::from_weights(vec![]), Err(Error::EmptyVocab));
        assert_eq!(Dist::from_weights(vec![0.0, 0.0]), Err(Error::NoMass));
        assert!(Dist::from_weights(vec![f32::NAN]).is_err());
        assert!(Dist::from_weights(vec![-1.0, 2.0]).is_err());
    }

    #[test]
    fn residual_is_aligned_by_token_id() {
        let p = Dist::from_weights(vec![0.5, 0.3, 0.2]).unwrap();
        let q = Dist::from_weights(vec![0.2, 0.6, 0.2]).unwrap();
        let r = p.residual(&q).unwrap();
        assert!((r.prob(0) - 1.0).abs() < 1e-6);
        assert!(p.residual(&p).is_none());
    }

    #[test]
    fn sampling_never_picks_zero_mass() {
        let d = Dist::from_weights(vec![0.0, 1.0, 0.0, 2.0]).unwrap();
        let mut rng = StreamRng::new(1, Stream::Aux);
        for _ in 0..1000 {
            let t = d.sample(&mut rng);
            assert!(t == 1 || t == 3);
        }
    }

    #[test]
    fn point_mass_checks_range() {
        assert!(Dist::point_mass(3, 3).is_err());
        assert_eq!(Dist::point_mass(2, 3).unwrap().argmax(), 2);
    }
}
