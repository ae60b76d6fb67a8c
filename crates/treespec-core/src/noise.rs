//! Sampling decided by noise fixed per (seed, position, token): the Gumbel-max trick, in its
//! exponential-race form.
//!
//! Why: with an ordinary random stream, a speculative method's sample depends on how many random
//! numbers its rejected drafts consumed, so the same seed gives different texts under different
//! methods (or histories). Here the target's token at sequence position `pos` is
//! `argmax_x log p(x) + G(seed, pos, x)` with `G` i.i.d. Gumbel(0, 1), written as
//! `argmin_x E(seed, pos, x) / p(x)` with `E = −ln U` exponential (`−ln E` is Gumbel, and the
//! logarithm is monotone, so both pick the same token; this form takes one logarithm per token).
//! That is an exact sample from `p` (the Gumbel-max theorem), and it is a function of the seed,
//! the position and `p` alone: whatever a drafter proposed, verification only has to follow the
//! child equal to this choice, as greedy verification follows the argmax.
//!
//! `U` comes from a counter-based hash: SplitMix64's output number `token + 1` from a state
//! keyed by (seed, position), so no state is carried between positions or calls.

use crate::dist::Dist;
use crate::TokenId;

/// The noise of one request: a seed, from which every position's noise follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PositionNoise {
    seed: u64,
}

impl PositionNoise {
    /// The noise of `seed`.
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }

    /// The hash state of position `pos`: each token's uniform is a SplitMix64 output from it.
    fn key(&self, pos: u64) -> u64 {
        mix64(mix64(self.seed ^ 0x5EED_5EED_5EED_5EED) ^ pos)
    }

    /// `E(seed, pos, token)`: a standard exponential variate, `−ln U` with `U` uniform in (0, 1).
    pub fn exponential(&self, pos: u64, token: TokenId) -> f64 {
        exponential_at(self.key(pos), token)
    }

    /// The token drawn from `p` at sequence position `pos`: `argmin_x E(pos, x) / p(x)` over
    /// `p`'s support (the lowest id on an exact tie, which has probability 0).
    ///
    /// The logarithm is skipped where it cannot matter: `E = −ln U ≥ 1 − U`, so a token whose
    /// `(1 − U) / p(x)` already reaches the best race so far cannot win (a margin covers the
    /// rounding of both sides). Most of a large vocabulary has a small `p(x)` and is skipped,
    /// and the result is the same token as the plain scan's.
    pub fn choose(&self, p: &Dist, pos: u64) -> TokenId {
        let key = self.key(pos);
        let mut best = f64::INFINITY;
        let mut at = 0usize;
        for (x, &px) in p.probs().iter().enumerate() {
            if px > 0.0 {
                let u = uniform_at(key, x as TokenId);
                let px = px as f64;
                if (1.0 - u) * (1.0 - 1e-9) >= best * px {
                    continue;
                }
                let race = -u.ln() / px;
                if race < best {
                    best = race;
                    at = x;
                }
            }
        }
        at as TokenId
    }
}

/// SplitMix64's increment (the golden ratio in 64 bits).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// One step of SplitMix64: the generator's next output from state `x` (a bijection, so a
/// cheap counter-based hash of a 64-bit word; the toy models draw their logits with it too).
pub fn splitmix64(x: u64) -> u64 {
    mix64(x.wrapping_add(GAMMA))
}

/// SplitMix64's output function (Stafford's mix 13): a bijection of 64-bit words.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `−ln U` for the uniform of `token` under a position's `key`.
fn exponential_at(key: u64, token: TokenId) -> f64 {
    -uniform_at(key, token).ln()
}

/// The uniform `U` of `token` under a position's `key`: the top 53 bits of its hash, offset by
/// a half, put it strictly inside (0, 1), so `E` is finite and positive.
fn uniform_at(key: u64, token: TokenId) -> f64 {
    let h = mix64(key.wrapping_add((token as u64 + 1).wrapping_mul(GAMMA)));
    ((h >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_is_a_function_of_seed_position_and_token() {
        let a = PositionNoise::new(42);
        assert_eq!(a.exponential(7, 3), PositionNoise::new(42).exponential(7, 3));
        assert_ne!(a.exponential(7, 3), a.exponential(8, 3));
        assert_ne!(a.exponential(7, 3), a.exponential(7, 4));
        assert_ne!(a.exponential(7, 3), PositionNoise::new(43).exponential(7, 3));
    }

    #[test]
    fn exponentials_have_mean_and_variance_one() {
        let n = PositionNoise::new(1);
        let xs: Vec<f64> = (0..200u64).flat_map(|pos| (0..500).map(move |t| n.exponential(pos, t))).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        // 10^5 draws: standard errors about 0.003 (mean) and 0.01 (variance).
        assert!((mean - 1.0).abs() < 0.02, "mean {mean}");
        assert!((var - 1.0).abs() < 0.06, "variance {var}");
        assert!(xs.iter().all(|x| x.is_finite() && *x > 0.0));
    }

    /// The skipped logarithms never change the choice: the same token as the plain scan.
    #[test]
    fn the_pruned_scan_chooses_what_the_plain_scan_chooses() {
        let n = PositionNoise::new(5);
        for (k, sharp) in [0.1f32, 1.0, 4.0].into_iter().enumerate() {
            let w: Vec<f32> = (0..2000).map(|i| ((i * 7919 % 1000) as f32 / 1000.0 * sharp).exp()).collect();
            let p = Dist::from_weights(w).unwrap();
            for pos in 0..200u64 {
                let pos = pos + 1000 * k as u64;
                let plain = (0..p.len())
                    .map(|x| (n.exponential(pos, x as TokenId) / p.prob(x as TokenId) as f64, x))
                    .fold((f64::INFINITY, 0), |b, c| if c.0 < b.0 { c } else { b })
                    .1;
                assert_eq!(n.choose(&p, pos), plain as TokenId, "sharpness {sharp}, position {pos}");
            }
        }
    }

    #[test]
    fn choice_stays_in_the_support_and_a_point_mass_is_its_token() {
        let n = PositionNoise::new(9);
        let p = Dist::from_weights(vec![0.0, 1.0, 0.0, 3.0]).unwrap();
        for pos in 0..500 {
            assert!(matches!(n.choose(&p, pos), 1 | 3));
        }
        let one = Dist::point_mass(2, 5).unwrap();
        assert!((0..50).all(|pos| n.choose(&one, pos) == 2));
    }
}
