//! Fixed forward shapes: verifying trees in a few padded sizes so that a device replays them.
//!
//! A GPU step of a small model is bound by kernel launches, and llama.cpp hides them only when a
//! forward has exactly the shape of the one before (it then reuses the built graph, and ggml-cuda
//! replays the captured CUDA graph). A tree whose size changes every step never repeats a shape;
//! a tree padded up to one of a few [`ShapeBuckets`] does, as long as consecutive steps land in
//! the same bucket. Filler rows cost compute, though: on a CPU a row costs about half a step, and
//! padding loses. So the decision is read off measured times ([`ShapeTimes`]): each shape timed
//! after a forward of another shape (*changed*) and after forwards of its own (*replayed*).
//!
//! A padded forward always holds at least one filler row, because the filler rows are what keep
//! the forward's set of sequence ids fixed (llama.cpp's reuse needs the same number of distinct
//! sequences every time; the backend gives the filler every path id the tree leaves unused). So a
//! bucket of `b` rows verifies trees of up to `b − 1` rows. One row stays one row: plain decoding
//! repeats its own shape already.

use serde::{Deserialize, Serialize};

use crate::cost::CostCurve;
use crate::error::{Error, Result};

/// The buckets a device is padded to unless told otherwise: below ggml-cuda's switch from
/// matrix-vector to tiled kernels at 9 rows, and powers of two above it, out to the largest tree
/// a step drafts (64 rows).
pub const DEFAULT_BUCKETS: &[usize] = &[8, 16, 32, 64];

/// The largest bucket accepted (a forward's rows must fit a context and a batch buffer).
const MAX_BUCKET: usize = 4096;

/// The row counts forwards are padded up to (each ≥ 2, ascending).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShapeBuckets {
    sizes: Vec<usize>,
}

impl Default for ShapeBuckets {
    fn default() -> Self {
        Self { sizes: DEFAULT_BUCKETS.to_vec() }
    }
}

impl ShapeBuckets {
    /// Buckets of these row counts (any order; each between 2 and 4096, at least one).
    pub fn new(sizes: &[usize]) -> Result<Self> {
        let mut sizes = sizes.to_vec();
        sizes.sort_unstable();
        sizes.dedup();
        match sizes.iter().find(|&&s| !(2..=MAX_BUCKET).contains(&s)) {
            Some(s) => {
                Err(Error::Invalid(format!("shape bucket {s}: each must be between 2 and {MAX_BUCKET} rows")))
            }
            None if sizes.is_empty() => {
                Err(Error::Invalid("shape buckets: at least one size is needed".into()))
            }
            None => Ok(Self { sizes }),
        }
    }

    /// Buckets written as a comma-separated list of row counts (`8,16,32,64`).
    pub fn parse(text: &str) -> Result<Self> {
        let sizes = text
            .split(',')
            .map(|s| {
                s.trim()
                    .parse::<usize>()
                    .map_err(|_| Error::Invalid(format!("shape bucket '{}' is not a row count", s.trim())))
            })
            .collect::<Result<Vec<_>>>()?;
        Self::new(&sizes)
    }

    /// The bucket sizes, ascending.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// The rows a forward of `rows` real rows runs as: 1 stays 1, anything else the smallest
    /// bucket above it (at least one filler row, see the module doc), or itself beyond the largest.
    pub fn shape(&self, rows: usize) -> usize {
        if rows <= 1 {
            return rows;
        }
        self.sizes.iter().copied().find(|&b| b > rows).unwrap_or(rows)
    }

    /// The most real rows a padded forward holds (the largest bucket less its filler row).
    pub fn max_rows(&self) -> usize {
        self.sizes.last().map_or(0, |b| b - 1)
    }
}

/// One shape's measured times.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ShapeTime {
    /// Rows of the forward (filler included).
    pub rows: usize,
    /// ms when the forward before had another shape.
    pub changed_ms: f64,
    /// ms when the forwards before had this shape.
    pub replayed_ms: f64,
}

/// Each shape of some buckets (and one row) timed changed and replayed, padded as the backend
/// pads; `active` says whether forwards are padded now (decided with [`ShapeTimes::padding_pays`],
/// or forced).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShapeTimes {
    /// The buckets the times are for.
    pub buckets: ShapeBuckets,
    /// One row first, then each bucket in order.
    pub times: Vec<ShapeTime>,
    /// Whether forwards are padded to the buckets (not stored: decided per run).
    #[serde(skip)]
    pub active: bool,
}

impl ShapeTimes {
    /// Times for `buckets`: `times` must hold one row and every bucket, each positive and finite.
    pub fn new(buckets: ShapeBuckets, mut times: Vec<ShapeTime>) -> Result<Self> {
        times.sort_by_key(|t| t.rows);
        let rows: Vec<usize> = times.iter().map(|t| t.rows).collect();
        let want: Vec<usize> = std::iter::once(1).chain(buckets.sizes().iter().copied()).collect();
        if rows != want {
            return Err(Error::Invalid(format!("shape times for rows {rows:?}: need exactly {want:?}")));
        }
        let bad = |ms: f64| !(ms.is_finite() && ms > 0.0);
        if let Some(t) = times.iter().find(|t| bad(t.changed_ms) || bad(t.replayed_ms)) {
            return Err(Error::Invalid(format!(
                "shape time of {} rows is not a positive time: {t:?}",
                t.rows
            )));
        }
        Ok(Self { buckets, times, active: false })
    }

    /// The measured times of a forward of exactly `rows` rows, if it is one of the shapes.
    pub fn time(&self, rows: usize) -> Option<&ShapeTime> {
        self.times.iter().find(|t| t.rows == rows)
    }

    /// What a forward of `rows` real rows costs when forwards are padded: its shape's replayed
    /// time when `previous` (the shape of the forward before) is the same, its changed time
    /// otherwise; a size beyond the buckets is priced off `curve` as it is.
    pub fn padded_ms(&self, curve: &CostCurve, rows: usize, previous: Option<usize>) -> f64 {
        self.shape_ms(curve, self.buckets.shape(rows), previous)
    }

    /// What a forward of exactly `shape` rows costs after a forward of `previous` rows: replayed
    /// or changed where the shape was timed, T(shape) off `curve` elsewhere.
    pub fn shape_ms(&self, curve: &CostCurve, shape: usize, previous: Option<usize>) -> f64 {
        match self.time(shape) {
            Some(t) if previous == Some(shape) => t.replayed_ms,
            Some(t) => t.changed_ms,
            None => curve.ms(shape),
        }
    }

    /// Whether padding pays on this machine: over every tree size a bucket holds (2 rows up to the
    /// largest bucket's), a step that stays in its bucket (replayed, padded) costs less on
    /// average than the same step unpadded, whose size changes from step to step (the curve's
    /// T(n), timed as it comes after other sizes). On a CPU a filler row costs about what a real
    /// one does, and nothing is replayed, so padding loses there; on a device that replays a
    /// repeated shape it wins. Decided by the times, never by the device's name.
    pub fn padding_pays(&self, curve: &CostCurve) -> bool {
        let sizes = 2..=self.buckets.max_rows();
        let padded: f64 = sizes.clone().map(|n| self.padded_ms(curve, n, Some(self.buckets.shape(n)))).sum();
        let unpadded: f64 = sizes.map(|n| curve.ms(n)).sum();
        padded < unpadded
    }

    /// These times with `active` set: forwards are padded.
    pub fn activated(mut self, active: bool) -> Self {
        self.active = active;
        self
    }
}

/// Whether forwards are padded: never, always (to these buckets), or where the measured times
/// say padding pays (`--pad-shapes off|on|auto|8,16,32,64`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PadShapes {
    /// Never.
    Off,
    /// Always, to these buckets (filler rows change no output, so this is for tests and
    /// measurements: where it does not pay it only costs time).
    On(ShapeBuckets),
    /// To the buckets the target's curve was timed on, where [`ShapeTimes::padding_pays`] says
    /// so; never on a curve timed without shapes.
    #[default]
    Auto,
}

impl PadShapes {
    /// `off`, `on` (the default buckets), `auto`, or a list of bucket sizes (on, to those).
    pub fn parse(text: &str) -> Result<Self> {
        match text.trim() {
            "off" | "none" => Ok(Self::Off),
            "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On(ShapeBuckets::default())),
            list => ShapeBuckets::parse(list).map(Self::On).map_err(|e| {
                Error::Invalid(format!("--pad-shapes takes off, on, auto or a list of row counts: {e}"))
            }),
        }
    }

    /// The buckets forwards are padded to, for a target priced on `curve` (None: not padded).
    pub fn decide(&self, curve: Option<&CostCurve>) -> Option<ShapeBuckets> {
        match self {
            Self::Off => None,
            Self::On(b) => Some(b.clone()),
            Self::Auto => {
                let curve = curve?;
                curve.shapes().filter(|s| s.padding_pays(curve)).map(|s| s.buckets.clone())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times(
        buckets: &ShapeBuckets,
        changed: impl Fn(usize) -> f64,
        replayed: impl Fn(usize) -> f64,
    ) -> ShapeTimes {
        let rows = std::iter::once(1).chain(buckets.sizes().iter().copied());
        let t =
            rows.map(|r| ShapeTime { rows: r, changed_ms: changed(r), replayed_ms: replayed(r) }).collect();
        ShapeTimes::new(buckets.clone(), t).unwrap()
    }

    #[test]
    fn a_forward_pads_to_the_bucket_above_it_with_one_filler_row_at_least() {
        let b = ShapeBuckets::default();
        assert_eq!(b.shape(1), 1, "one row is plain decoding's own shape");
        assert_eq!(b.shape(2), 8);
        assert_eq!(b.shape(7), 8);
        assert_eq!(b.shape(8), 16, "a full bucket leaves no row for the filler that fixes the ids");
        assert_eq!(b.shape(63), 64);
        assert_eq!(b.shape(64), 64, "beyond the buckets a forward runs as it is");
        assert_eq!(b.shape(100), 100);
        assert_eq!(b.max_rows(), 63);
    }

    #[test]
    fn buckets_are_checked_and_parsed() {
        assert_eq!(ShapeBuckets::parse("32, 8,16").unwrap().sizes(), &[8, 16, 32]);
        assert!(ShapeBuckets::parse("8,x").is_err());
        assert!(ShapeBuckets::parse("1,8").is_err(), "a one-row bucket has no room for filler");
        assert!(ShapeBuckets::new(&[]).is_err());
        assert!(ShapeBuckets::new(&[5000]).is_err());
    }

    #[test]
    fn shape_times_must_cover_one_row_and_every_bucket() {
        let b = ShapeBuckets::new(&[8, 16]).unwrap();
        let t = |rows| ShapeTime { rows, changed_ms: 1.0, replayed_ms: 1.0 };
        assert!(ShapeTimes::new(b.clone(), vec![t(1), t(8)]).is_err());
        assert!(ShapeTimes::new(b.clone(), vec![t(16), t(1), t(8)]).is_ok());
        let bad = ShapeTime { rows: 8, changed_ms: f64::NAN, replayed_ms: 1.0 };
        assert!(ShapeTimes::new(b, vec![t(1), bad, t(16)]).is_err());
    }

    #[test]
    fn staying_in_a_bucket_is_priced_at_its_replay_and_a_switch_at_its_changed_time() {
        let b = ShapeBuckets::new(&[8, 16]).unwrap();
        let s = times(&b, |r| 5.0 + r as f64 * 0.1, |r| 2.0 + r as f64 * 0.01);
        let curve = CostCurve::linear(5.0, 0.1, 64).unwrap();
        assert_eq!(s.padded_ms(&curve, 5, Some(8)), s.time(8).unwrap().replayed_ms);
        assert_eq!(s.padded_ms(&curve, 5, Some(16)), s.time(8).unwrap().changed_ms);
        assert_eq!(s.padded_ms(&curve, 5, None), s.time(8).unwrap().changed_ms);
        assert_eq!(s.padded_ms(&curve, 1, Some(1)), s.time(1).unwrap().replayed_ms);
        assert_eq!(s.padded_ms(&curve, 40, Some(40)), curve.ms(40), "beyond the buckets: the curve");
    }

    #[test]
    fn padding_pays_where_replays_are_cheap_and_not_where_rows_cost_what_they_do() {
        let b = ShapeBuckets::default();
        // A CPU: a row costs half a step and a repeated shape runs no faster.
        let cpu = CostCurve::linear(40.0, 20.0, 64).unwrap();
        let on_cpu = times(&b, |r| cpu.ms(r), |r| cpu.ms(r) * 0.99);
        assert!(!on_cpu.padding_pays(&cpu));
        // A device bound by launches: 2.15 ms replayed, 4.5–9 ms for a changed shape (the H200's
        // 1.5B curve), replays of any bucket barely above one row's.
        let dev = CostCurve::from_points(&[(1, 2.15), (4, 4.49), (16, 5.6), (64, 9.0)]).unwrap();
        let on_dev = times(&b, |r| dev.ms(r), |r| 2.15 + 0.02 * r as f64);
        assert!(on_dev.padding_pays(&dev));
    }

    #[test]
    fn the_pad_shapes_setting_parses_and_decides_by_the_curve_in_auto() {
        assert_eq!(PadShapes::parse("off").unwrap(), PadShapes::Off);
        assert_eq!(PadShapes::parse("on").unwrap(), PadShapes::On(ShapeBuckets::default()));
        assert_eq!(PadShapes::parse("16,8").unwrap(), PadShapes::On(ShapeBuckets::new(&[8, 16]).unwrap()));
        assert!(PadShapes::parse("sometimes").unwrap_err().to_string().contains("--pad-shapes"));
        let b = ShapeBuckets::default();
        let dev = CostCurve::from_points(&[(1, 2.15), (4, 4.49), (16, 5.6), (64, 9.0)]).unwrap();
        let paying = times(&b, |r| dev.ms(r), |r| 2.15 + 0.02 * r as f64);
        let curve = dev.clone().with_shapes(Some(paying));
        assert_eq!(PadShapes::Auto.decide(Some(&curve)), Some(b.clone()));
        assert_eq!(PadShapes::Auto.decide(Some(&dev)), None, "no shapes timed: not padded");
        assert_eq!(PadShapes::Auto.decide(None), None);
        assert_eq!(PadShapes::Off.decide(Some(&curve)), None);
        assert_eq!(PadShapes::On(b.clone()).decide(None), Some(b));
    }
}
