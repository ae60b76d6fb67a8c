//! The conditional distributions of a toy model.

use treespec_core::noise::splitmix64;
use treespec_core::sampling::Sampler;
use treespec_core::{Result, TokenId};

/// Which tokens a toy model may ever produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Every token.
    All,
    /// Only even token ids (odd ones get −inf logits).
    Even,
    /// Only odd token ids.
    Odd,
}

/// A seeded n-gram model: logits for the next token depend on the last `order` tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct ToyModel {
    /// Vocabulary size.
    pub vocab: usize,
    /// Context tokens the conditionals look at (1 = bigram).
    pub order: usize,
    /// Seed of the conditionals.
    pub seed: u64,
    /// Logit scale: larger = peakier distributions.
    pub sharpness: f32,
    /// Noise added to the logits (a draft's divergence from the target with the same seed).
    pub noise: f32,
    /// Seed of the noise.
    pub noise_seed: u64,
    /// Allowed tokens.
    pub support: Support,
}

impl ToyModel {
    /// A target model.
    pub fn new(vocab: usize, order: usize, seed: u64) -> Self {
        Self { vocab, order, seed, sharpness: 2.0, noise: 0.0, noise_seed: 0, support: Support::All }
    }

    /// A draft for this model: the same conditionals plus Gaussian-like logit noise of scale
    /// `noise` (0 = draft identical to the target).
    pub fn draft(&self, noise: f32, noise_seed: u64) -> Self {
        Self { noise, noise_seed, ..self.clone() }
    }

    /// The same model restricted to a support.
    pub fn with_support(self, support: Support) -> Self {
        Self { support, ..self }
    }

    /// Logit scale.
    pub fn with_sharpness(self, sharpness: f32) -> Self {
        Self { sharpness, ..self }
    }

    /// Next-token logits after `context` (only the last `order` tokens matter).
    pub fn logits(&self, context: &[TokenId]) -> Vec<f32> {
        let window = &context[context.len().saturating_sub(self.order)..];
        let mut h = splitmix64(self.seed ^ 0x9e37_79b9_7f4a_7c15);
        for &t in window {
            h = splitmix64(h ^ (t as u64 + 1));
        }
        let mut n = splitmix64(self.noise_seed ^ 0x5851_f42d_4c95_7f2d);
        for &t in window {
            n = splitmix64(n ^ (t as u64 + 1));
        }
        (0..self.vocab)
            .map(|t| {
                let allowed = match self.support {
                    Support::All => true,
                    Support::Even => t % 2 == 0,
                    Support::Odd => t % 2 == 1,
                };
                if !allowed {
                    return f32::NEG_INFINITY;
                }
                let base = gaussian(splitmix64(h ^ (t as u64).wrapping_mul(0x2545_f491_4f6c_dd1d)));
                let noise = gaussian(splitmix64(n ^ (t as u64).wrapping_mul(0x2545_f491_4f6c_dd1d)));
                self.sharpness * base + self.noise * noise
            })
            .collect()
    }

    /// The exact probability of every `len`-token continuation of `prompt` under `sampler`'s
    /// processing of this model's logits, indexed by the continuation as a base-`vocab` number
    /// (first token most significant): what a lossless decoder's output must be distributed as,
    /// for the χ² tests.
    pub fn exact_joint(&self, sampler: &Sampler, prompt: &[TokenId], len: usize) -> Result<Vec<f64>> {
        let mut out = vec![0.0; self.vocab.pow(len as u32)];
        self.joint_rec(sampler, &mut prompt.to_vec(), len, 1.0, 0, &mut out)?;
        Ok(out)
    }

    fn joint_rec(
        &self,
        sampler: &Sampler,
        ctx: &mut Vec<TokenId>,
        left: usize,
        prob: f64,
        index: usize,
        out: &mut [f64],
    ) -> Result<()> {
        if left == 0 {
            out[index] = prob;
            return Ok(());
        }
        let dist = sampler.distribution(&self.logits(ctx), ctx)?;
        for t in 0..self.vocab {
            let p = dist.prob(t as TokenId) as f64;
            // A zero-probability token leaves its whole subtree at zero.
            if p > 0.0 {
                ctx.push(t as TokenId);
                self.joint_rec(sampler, ctx, left - 1, prob * p, index * self.vocab + t, out)?;
                ctx.pop();
            }
        }
        Ok(())
    }
}

/// A roughly standard-normal number from 64 random bits (sum of four uniforms, rescaled).
fn gaussian(bits: u64) -> f32 {
    let u = |s: u32| ((bits >> s) & 0xffff) as f32 / 65535.0;
    (u(0) + u(16) + u(32) + u(48) - 2.0) * (3.0f32).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_context_dependent() {
        let m = ToyModel::new(8, 2, 1);
        assert_eq!(m.logits(&[1, 2]), m.logits(&[5, 1, 2]));
        assert_ne!(m.logits(&[1, 2]), m.logits(&[2, 1]));
        assert_eq!(m.draft(0.0, 9).logits(&[3]), m.logits(&[3]));
        assert_ne!(m.draft(1.0, 9).logits(&[3]), m.logits(&[3]));
        let even = m.clone().with_support(Support::Even).logits(&[1]);
        assert!(even.iter().skip(1).step_by(2).all(|x| x.is_infinite()));
    }

    #[test]
    fn exact_joint_is_the_product_of_the_conditionals() {
        let m = ToyModel::new(4, 2, 3).with_support(Support::Odd);
        let sampler = Sampler::new(treespec_core::sampling::SamplingParams::with_temperature(0.7)).unwrap();
        let prompt = [1, 2];
        let joint = m.exact_joint(&sampler, &prompt, 2).unwrap();
        assert_eq!(joint.len(), 16);
        assert!((joint.iter().sum::<f64>() - 1.0).abs() < 1e-6);
        let p =
            |ctx: &[TokenId], t: TokenId| sampler.distribution(&m.logits(ctx), ctx).unwrap().prob(t) as f64;
        // Continuation (3, 1) is cell 3·4 + 1.
        assert!((joint[13] - p(&[1, 2], 3) * p(&[1, 2, 3], 1)).abs() < 1e-9);
        // Even tokens are outside the support: zero wherever they appear.
        assert_eq!(joint[2 * 4 + 1], 0.0);
        assert_eq!(joint[4 + 2], 0.0);
    }
}
