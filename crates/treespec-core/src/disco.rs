//! DISCO's dynamic speculation lookahead (arXiv 2405.04304, ALGORITHMS.md §3 "DISCO"): after each
//! drafted token a stop rule decides whether to draft another.
//!
//! Two stop rules live here, both pure:
//!
//! * [`DiscoModel`] — the supervised form: a logistic-regression classifier over features of the
//!   draft's next-token distribution, trained on oracle labels ("the draft still agrees with the
//!   target"), predicting P(accept) of the token just drafted;
//! * [`ConfidenceThreshold`] — the unsupervised form Hugging Face transformers ships in
//!   `AssistedCandidateGenerator`: stop once the drafted token's probability falls below a
//!   threshold (0.4 to start, at most 20 tokens), re-fitting the threshold online from
//!   (probability, accepted?) history by minimising `fpr + 3·fnr` over the ROC curve's thresholds.
//!
//! Stopping only decides whether to *draw another sample*; the token already drafted is kept, so
//! either rule is lossless under every verification family (ALGORITHMS.md §2).

use std::collections::VecDeque;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Error, Result, TokenId};

/// How many of the draft's largest probabilities are features.
pub const TOP_K: usize = 4;
/// Number of features per drafted token.
pub const FEATURE_COUNT: usize = TOP_K + 3;
/// Feature names, in order; stored in model files so a file written for other features is refused.
pub const FEATURE_NAMES: [&str; FEATURE_COUNT] =
    ["top1_prob", "top2_prob", "top3_prob", "top4_prob", "entropy", "index", "token_prob"];
/// The drafted token's index within the step is divided by this (HF's default lookahead cap), so
/// the feature does not depend on a run's `max_tokens` and a model trained with one cap works
/// with another.
pub const INDEX_SCALE: f32 = 20.0;
/// Version of the model file format written by [`DiscoModel::to_json`].
pub const MODEL_VERSION: u32 = 1;
/// Tag of the model file format.
pub const MODEL_FORMAT: &str = "treespec-disco-logreg";

/// The features of one drafted token.
pub type Features = [f32; FEATURE_COUNT];

/// Features of drafted token `token` (0-based `index` within this step's chain) given the draft's
/// next-token probabilities `probs` at its position: the top-4 probabilities, the entropy (nats),
/// the index divided by [`INDEX_SCALE`], and the token's own probability.
///
/// Callers pass the draft's temperature-1 softmax, not the processed sampling distribution, so
/// the classifier sees the same kind of input under greedy decoding (where the processed
/// distribution is a point mass) as under sampling.
pub fn features(probs: &[f32], token: TokenId, index: usize) -> Features {
    let mut top = [0f32; TOP_K];
    let mut entropy = 0f64;
    for &p in probs {
        if p > 0.0 {
            entropy -= p as f64 * (p as f64).ln();
        }
        if p > top[TOP_K - 1] {
            // Insertion into the small sorted array (descending).
            let mut i = TOP_K - 1;
            while i > 0 && top[i - 1] < p {
                top[i] = top[i - 1];
                i -= 1;
            }
            top[i] = p;
        }
    }
    let own = probs.get(token as usize).copied().unwrap_or(0.0);
    let mut f = [0f32; FEATURE_COUNT];
    f[..TOP_K].copy_from_slice(&top);
    f[TOP_K] = entropy as f32;
    f[TOP_K + 1] = index as f32 / INDEX_SCALE;
    f[TOP_K + 2] = own;
    f
}

/// Knobs of [`DiscoModel::train_with`].
#[derive(Debug, Clone, PartialEq)]
pub struct TrainOptions {
    /// Full-batch gradient steps.
    pub epochs: usize,
    /// Step size (features are standardised, so 0.5 is stable).
    pub learning_rate: f64,
    /// L2 penalty on the weights (not the bias).
    pub l2: f64,
}

impl Default for TrainOptions {
    fn default() -> Self {
        Self { epochs: 1000, learning_rate: 0.5, l2: 1e-3 }
    }
}

/// A logistic-regression stop classifier: `P(accept) = σ(w · (x − mean) / std + b)`. The
/// standardisation is part of the model so a file carries everything `predict` needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiscoModel {
    /// Always [`MODEL_FORMAT`].
    pub format: String,
    /// File format version ([`MODEL_VERSION`]).
    pub version: u32,
    /// [`FEATURE_NAMES`] at training time.
    pub features: Vec<String>,
    /// Per-feature mean of the training samples.
    pub mean: Vec<f32>,
    /// Per-feature standard deviation (1 where a feature was constant).
    pub std: Vec<f32>,
    /// Weights on standardised features.
    pub weights: Vec<f32>,
    /// Bias.
    pub bias: f32,
    /// Training samples seen.
    pub samples: u64,
    /// Fraction of positive (accepted) training labels.
    pub positive_rate: f32,
}

impl DiscoModel {
    /// Train with [`TrainOptions::default`].
    pub fn train(samples: &[Features], labels: &[bool]) -> Result<Self> {
        Self::train_with(samples, labels, &TrainOptions::default())
    }

    /// Fit by full-batch gradient descent on the mean log loss plus `l2/2 · |w|²`.
    pub fn train_with(samples: &[Features], labels: &[bool], opts: &TrainOptions) -> Result<Self> {
        if samples.is_empty() || samples.len() != labels.len() {
            return Err(Error::Invalid(format!(
                "DISCO training needs as many labels as samples, at least one: got {} samples, {} labels",
                samples.len(),
                labels.len()
            )));
        }
        let lr_ok = opts.learning_rate > 0.0 && opts.learning_rate.is_finite();
        if !lr_ok || opts.l2.is_nan() || opts.l2 < 0.0 {
            return Err(Error::Invalid(format!(
                "DISCO training: learning rate must be > 0 and l2 ≥ 0, got {} and {}",
                opts.learning_rate, opts.l2
            )));
        }
        if let Some(i) = samples.iter().position(|s| s.iter().any(|x| !x.is_finite())) {
            return Err(Error::Invalid(format!("DISCO training sample {i} has a non-finite feature")));
        }
        let n = samples.len() as f64;
        let mut mean = [0f64; FEATURE_COUNT];
        for s in samples {
            for (m, &x) in mean.iter_mut().zip(s) {
                *m += x as f64 / n;
            }
        }
        let mut std = [0f64; FEATURE_COUNT];
        for s in samples {
            for j in 0..FEATURE_COUNT {
                std[j] += (s[j] as f64 - mean[j]).powi(2) / n;
            }
        }
        for v in &mut std {
            *v = v.sqrt();
            if *v < 1e-12 {
                *v = 1.0;
            }
        }
        let x: Vec<[f64; FEATURE_COUNT]> =
            samples.iter().map(|s| std::array::from_fn(|j| (s[j] as f64 - mean[j]) / std[j])).collect();
        let y: Vec<f64> = labels.iter().map(|&l| l as u8 as f64).collect();
        let pos = y.iter().sum::<f64>() / n;
        let mut w = [0f64; FEATURE_COUNT];
        // Start the bias at the base rate's log-odds (clamped when one class is missing).
        let clamped = pos.clamp(1e-3, 1.0 - 1e-3);
        let mut b = (clamped / (1.0 - clamped)).ln();
        for _ in 0..opts.epochs {
            let mut gw = [0f64; FEATURE_COUNT];
            let mut gb = 0f64;
            for (xi, &yi) in x.iter().zip(&y) {
                let z = b + xi.iter().zip(&w).map(|(a, c)| a * c).sum::<f64>();
                let err = sigmoid(z) - yi;
                for j in 0..FEATURE_COUNT {
                    gw[j] += err * xi[j];
                }
                gb += err;
            }
            for j in 0..FEATURE_COUNT {
                w[j] -= opts.learning_rate * (gw[j] / n + opts.l2 * w[j]);
            }
            b -= opts.learning_rate * gb / n;
        }
        Ok(Self {
            format: MODEL_FORMAT.into(),
            version: MODEL_VERSION,
            features: FEATURE_NAMES.iter().map(|s| s.to_string()).collect(),
            mean: mean.iter().map(|&v| v as f32).collect(),
            std: std.iter().map(|&v| v as f32).collect(),
            weights: w.iter().map(|&v| v as f32).collect(),
            bias: b as f32,
            samples: samples.len() as u64,
            positive_rate: pos as f32,
        })
    }

    /// Predicted probability that the drafted token with these features is accepted.
    pub fn predict(&self, features: &Features) -> f32 {
        let mut z = self.bias as f64;
        for (j, &x) in features.iter().enumerate() {
            z += self.weights[j] as f64 * (x as f64 - self.mean[j] as f64) / self.std[j] as f64;
        }
        sigmoid(z) as f32
    }

    /// The model as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a DISCO model always serialises")
    }

    /// Parse and check a model file's contents.
    pub fn from_json(text: &str) -> Result<Self> {
        let m: Self =
            serde_json::from_str(text).map_err(|e| Error::Invalid(format!("malformed DISCO model: {e}")))?;
        m.check()?;
        Ok(m)
    }

    /// Write the model to `path`.
    pub fn save(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.to_json())
            .map_err(|e| Error::Invalid(format!("cannot write DISCO model {}: {e}", path.display())))
    }

    /// Read a model written by [`DiscoModel::save`].
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Invalid(format!("cannot read DISCO model {}: {e}", path.display())))?;
        Self::from_json(&text).map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))
    }

    fn check(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Invalid(format!("malformed DISCO model: {m}")));
        if self.format != MODEL_FORMAT {
            return bad(format!("format is {:?}, expected {MODEL_FORMAT:?}", self.format));
        }
        if self.version != MODEL_VERSION {
            return bad(format!(
                "version {} is not supported (this build reads {MODEL_VERSION})",
                self.version
            ));
        }
        if self.features.iter().map(String::as_str).ne(FEATURE_NAMES.iter().copied()) {
            return bad(format!("features {:?} differ from this build's {:?}", self.features, FEATURE_NAMES));
        }
        for (name, v) in [("mean", &self.mean), ("std", &self.std), ("weights", &self.weights)] {
            if v.len() != FEATURE_COUNT {
                return bad(format!("{name} has {} entries, expected {FEATURE_COUNT}", v.len()));
            }
            if v.iter().any(|x| !x.is_finite()) {
                return bad(format!("{name} holds a non-finite number"));
            }
        }
        if self.std.iter().any(|&s| s <= 0.0) {
            return bad("std entries must be > 0".into());
        }
        if !self.bias.is_finite() {
            return bad("bias is not finite".into());
        }
        Ok(())
    }
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// Weight of false negatives (rejecting what would have been accepted) in the threshold cost,
/// as in transformers: stopping too early wastes a whole target pass, drafting too far only costs
/// draft passes.
pub const FNR_WEIGHT: f64 = 3.0;

/// The threshold on an ROC curve minimising `fpr + fn_weight · fnr`, "positive" = accepted and
/// predicted positive = probability ≥ threshold. Candidates are the distinct probabilities
/// (sklearn's `roc_curve` thresholds, plus +∞ which predicts nothing positive); among equal costs
/// the highest threshold wins (numpy's `argmin` over descending thresholds). `None` without both
/// classes.
pub fn roc_threshold(probs: &[f32], accepted: &[bool], fn_weight: f64) -> Option<f32> {
    let pos = accepted.iter().filter(|&&a| a).count();
    let neg = accepted.len() - pos;
    if pos == 0 || neg == 0 || probs.len() != accepted.len() {
        return None;
    }
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_unstable_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    let (mut tp, mut fp) = (0usize, 0usize);
    // Threshold +∞: nothing predicted positive, cost = fn_weight.
    let mut best = (fn_weight, f32::INFINITY);
    let mut i = 0;
    while i < order.len() {
        let t = probs[order[i]];
        while i < order.len() && probs[order[i]] == t {
            if accepted[order[i]] {
                tp += 1;
            } else {
                fp += 1;
            }
            i += 1;
        }
        let cost = fp as f64 / neg as f64 + fn_weight * (1.0 - tp as f64 / pos as f64);
        if cost < best.0 {
            best = (cost, t);
        }
    }
    Some(best.1)
}

/// Hugging Face's `assistant_confidence_threshold` stop rule with its online re-fit.
///
/// History follows `AssistedCandidateGenerator.update_candidate_strategy`: per step, the
/// accepted drafted tokens are positives, the first rejected one a negative, and tokens after it
/// are dropped (whether they would have matched is unknown). After each step with more than 5
/// history entries and both classes, the threshold moves to [`roc_threshold`]'s choice.
/// Unlike transformers the history is a sliding window (`max_history`, 1024 by default), which
/// bounds the re-fit cost and lets the threshold follow a drifting text.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfidenceThreshold {
    threshold: f32,
    max_tokens: usize,
    max_history: usize,
    history: VecDeque<(f32, bool)>,
}

impl Default for ConfidenceThreshold {
    fn default() -> Self {
        Self::new(0.4, 20).expect("defaults are valid")
    }
}

impl ConfidenceThreshold {
    /// Start at `threshold` (in [0, 1]) drafting at most `max_tokens ≥ 1` tokens per step.
    pub fn new(threshold: f32, max_tokens: usize) -> Result<Self> {
        if !threshold.is_finite() || !(0.0..=1.0).contains(&threshold) {
            return Err(Error::Invalid(format!("confidence threshold must be in [0, 1], got {threshold}")));
        }
        if max_tokens == 0 {
            return Err(Error::Invalid("DISCO max tokens per step must be ≥ 1".into()));
        }
        Ok(Self { threshold, max_tokens, max_history: 1024, history: VecDeque::new() })
    }

    /// Keep at most `n ≥ 6` history entries (older ones are forgotten first).
    pub fn with_max_history(mut self, n: usize) -> Self {
        self.max_history = n.max(6);
        self
    }

    /// The current threshold.
    pub fn threshold(&self) -> f32 {
        self.threshold
    }

    /// Most tokens drafted per step.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// History entries held.
    pub fn history_len(&self) -> usize {
        self.history.len()
    }

    /// After drafting a token with draft probability `prob`, `drafted` tokens in this step so far
    /// (it included): whether to draft another. The drafted token is kept either way.
    pub fn should_continue(&self, prob: f32, drafted: usize) -> bool {
        drafted < self.max_tokens && prob >= self.threshold
    }

    /// Learn one step: `probs` are the drafted tokens' draft probabilities in order, `accepted`
    /// how many of them the verifier accepted. Re-fits the threshold; returns whether it moved.
    pub fn record(&mut self, probs: &[f32], accepted: usize) -> bool {
        let accepted = accepted.min(probs.len());
        for &p in &probs[..accepted] {
            self.history.push_back((p, true));
        }
        if accepted < probs.len() {
            self.history.push_back((probs[accepted], false));
        }
        while self.history.len() > self.max_history {
            self.history.pop_front();
        }
        self.refit()
    }

    /// Re-fit from the history (transformers needs > 5 entries with both classes).
    pub fn refit(&mut self) -> bool {
        if self.history.len() <= 5 {
            return false;
        }
        let (probs, acc): (Vec<f32>, Vec<bool>) = self.history.iter().copied().unzip();
        match roc_threshold(&probs, &acc, FNR_WEIGHT) {
            Some(t) if t.is_finite() && t != self.threshold => {
                self.threshold = t;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Stream, StreamRng};

    #[test]
    fn features_of_a_distribution() {
        let probs = [0.1f32, 0.5, 0.2, 0.15, 0.05];
        let f = features(&probs, 2, 4);
        assert_eq!(&f[..4], &[0.5, 0.2, 0.15, 0.1]);
        let h: f64 = probs.iter().map(|&p| -(p as f64) * (p as f64).ln()).sum();
        assert!((f[4] as f64 - h).abs() < 1e-6);
        assert_eq!(f[5], 4.0 / INDEX_SCALE);
        assert_eq!(f[6], 0.2);
        // Fewer than 4 tokens: zero-padded.
        let g = features(&[1.0], 0, 0);
        assert_eq!(g, [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
    }

    /// Synthetic data: accepted iff a noisy linear score in the token probability is positive.
    fn synthetic(n: usize, seed: u64) -> (Vec<Features>, Vec<bool>) {
        let mut rng = StreamRng::new(seed, Stream::Aux);
        let mut xs = Vec::new();
        let mut ys = Vec::new();
        for _ in 0..n {
            let p = rng.uniform() as f32;
            let idx = (rng.uniform() * 20.0) as usize;
            let rest = (1.0 - p) / 4.0;
            let probs = [p, rest, rest, rest, rest];
            let f = features(&probs, 0, idx);
            let y = (p as f64 - 0.5 - 0.01 * idx as f64 + 0.2 * (rng.uniform() - 0.5)) > 0.0;
            xs.push(f);
            ys.push(y);
        }
        (xs, ys)
    }

    #[test]
    fn classifier_learns_a_separable_rule() {
        let (x, y) = synthetic(2000, 1);
        let m = DiscoModel::train(&x, &y).unwrap();
        let (tx, ty) = synthetic(1000, 2);
        let correct = tx.iter().zip(&ty).filter(|(f, &l)| (m.predict(f) >= 0.5) == l).count();
        assert!(correct > 900, "accuracy {correct}/1000");
        // Higher own probability ⇒ higher P(accept).
        let lo = features(&[0.2, 0.2, 0.2, 0.2, 0.2], 0, 0);
        let hi = features(&[0.9, 0.025, 0.025, 0.025, 0.025], 0, 0);
        assert!(m.predict(&hi) > m.predict(&lo));
    }

    #[test]
    fn model_round_trips_and_rejects_bad_files() {
        let (x, y) = synthetic(200, 3);
        let m = DiscoModel::train_with(&x, &y, &TrainOptions { epochs: 50, ..Default::default() }).unwrap();
        let back = DiscoModel::from_json(&m.to_json()).unwrap();
        assert_eq!(back, m);
        assert!(DiscoModel::from_json("{").is_err());
        assert!(DiscoModel::from_json("{}").is_err());
        let mut v: serde_json::Value = serde_json::from_str(&m.to_json()).unwrap();
        v["version"] = 99.into();
        assert!(DiscoModel::from_json(&v.to_string()).unwrap_err().to_string().contains("version"));
        let mut v: serde_json::Value = serde_json::from_str(&m.to_json()).unwrap();
        v["weights"] = serde_json::json!([1.0, 2.0]);
        assert!(DiscoModel::from_json(&v.to_string()).is_err());
        let mut v: serde_json::Value = serde_json::from_str(&m.to_json()).unwrap();
        v["std"][0] = 0.0.into();
        assert!(DiscoModel::from_json(&v.to_string()).is_err());
        assert!(DiscoModel::load(Path::new("/nonexistent/disco.json")).is_err());
    }

    #[test]
    fn bad_training_input_is_an_error() {
        assert!(DiscoModel::train(&[], &[]).is_err());
        assert!(DiscoModel::train(&[[0.0; FEATURE_COUNT]], &[true, false]).is_err());
        assert!(DiscoModel::train(&[[f32::NAN; FEATURE_COUNT]], &[true]).is_err());
    }

    #[test]
    fn roc_threshold_minimises_the_weighted_cost() {
        // Perfectly separated: the highest threshold keeping every positive.
        let t = roc_threshold(&[0.9, 0.8, 0.7, 0.2, 0.1], &[true, true, true, false, false], 3.0);
        assert_eq!(t, Some(0.7));
        // One class only: no fit.
        assert_eq!(roc_threshold(&[0.9, 0.8], &[true, true], 3.0), None);
        // Overlap: missing a positive costs 3/P, admitting a negative 1/N.
        let probs = [0.9, 0.6, 0.3, 0.5, 0.4, 0.2];
        let acc = [true, true, true, false, false, false];
        // t = 0.3: tpr 1, fpr 2/3 → 0.667; t = 0.6: tpr 2/3, fpr 0 → 1.0.
        assert_eq!(roc_threshold(&probs, &acc, 3.0), Some(0.3));
        assert_eq!(roc_threshold(&probs, &acc, 1.0), Some(0.6));
    }

    #[test]
    fn confidence_threshold_history_and_limits() {
        assert!(ConfidenceThreshold::new(-0.1, 20).is_err());
        assert!(ConfidenceThreshold::new(1.5, 20).is_err());
        assert!(ConfidenceThreshold::new(0.4, 0).is_err());
        let mut c = ConfidenceThreshold::default();
        assert_eq!((c.threshold(), c.max_tokens()), (0.4, 20));
        assert!(c.should_continue(0.5, 3));
        assert!(!c.should_continue(0.3, 3));
        assert!(!c.should_continue(0.9, 20));
        // Tokens after the first rejection are not recorded.
        c.record(&[0.9, 0.8, 0.3, 0.2], 2);
        assert_eq!(c.history_len(), 3);
        assert_eq!(c.threshold(), 0.4, "≤ 5 entries: no re-fit");
        c.record(&[0.95, 0.85, 0.75, 0.25], 3);
        assert_eq!(c.history_len(), 7);
        assert_eq!(c.threshold(), 0.75);
        let mut small = ConfidenceThreshold::default().with_max_history(6);
        for _ in 0..10 {
            small.record(&[0.9, 0.1], 1);
        }
        assert_eq!(small.history_len(), 6);
    }
}
