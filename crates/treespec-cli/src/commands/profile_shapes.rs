//! `treespec profile --shapes` and `--replay-trace FILE`: the padded shapes' times, and recorded
//! runs' shape sequences replayed as real forwards, padded and not, beside plain decoding of the
//! same tokens and what the measured times predict (docs/GPU.md; `scripts/gpu-check.sh` runs
//! them on a device).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use treespec_core::cost::shapes::{PadShapes, ShapeBuckets, ShapeTimes};
use treespec_core::cost::CostCurve;
use treespec_engine::measure::profile::TimedSize;
use treespec_engine::measure::replay::{plain_sequence, predict_ms, replay, ReplayStep, ReplayTiming};
use treespec_engine::measure::shapes::time_shapes;
use treespec_engine::CausalLm;
use treespec_llama::LlamaModel;

/// Repeats of each shape's changed and replayed timings.
const SHAPE_REPEATS: usize = 5;

/// The buckets asked for with `--pad-shapes LIST`, the default ones otherwise.
pub fn buckets(pad: &PadShapes) -> ShapeBuckets {
    match pad {
        PadShapes::On(b) => b.clone(),
        _ => ShapeBuckets::default(),
    }
}

/// The shapes' times on `model`, and whether padding pays against the profiled `points`.
pub fn shapes_json(
    model: &LlamaModel,
    buckets: &ShapeBuckets,
    points: &[TimedSize],
) -> Result<(ShapeTimes, Value)> {
    let mut lm = model.new_lm()?;
    let times = time_shapes(&mut lm, buckets, SHAPE_REPEATS)?;
    let curve = curve_of(points)?;
    let rows: Vec<Value> = times
        .times
        .iter()
        .map(|t| json!({"rows": t.rows, "changed_ms": t.changed_ms, "replayed_ms": t.replayed_ms}))
        .collect();
    let value =
        json!({"buckets": buckets.sizes(), "times": rows, "padding_pays": times.padding_pays(&curve)});
    Ok((times, value))
}

/// A curve of the profiled points (T(1) must be among them).
fn curve_of(points: &[TimedSize]) -> Result<CostCurve> {
    let pts: Vec<(usize, f64)> = points.iter().map(|p| (p.n, p.median_ms)).collect();
    CostCurve::from_points(&pts).context("the profile's points make no curve (T(1) must be timed)")
}

/// The steps of a decision trace (`--decision-trace`): one JSON object a line with `context`,
/// `forward_rows` and `emitted`. A batched step (`batch_rows` > 0) is refused: its rows are other
/// requests' too.
pub fn read_trace(path: &Path) -> Result<Vec<ReplayStep>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut steps = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: Value =
            serde_json::from_str(line).with_context(|| format!("{} line {}", path.display(), i + 1))?;
        let field = |name: &str| {
            v.get(name).and_then(Value::as_u64).map(|n| n as usize).with_context(|| {
                format!("{} line {}: no `{name}` (not a decision trace?)", path.display(), i + 1)
            })
        };
        if v.get("batch_rows").and_then(Value::as_u64).unwrap_or(0) > 0 {
            bail!("{} line {}: a batched step; only single-request traces replay", path.display(), i + 1);
        }
        steps.push(ReplayStep {
            context: field("context")?,
            rows: field("forward_rows")?,
            emitted: field("emitted")?,
        });
    }
    if steps.is_empty() {
        bail!("{}: no steps", path.display());
    }
    Ok(steps)
}

/// Replay each trace unpadded, padded to `shapes`' buckets and as plain decoding of the same
/// tokens (at most `limit` steps of each trace), with the predictions of `shapes` and `points`.
pub fn replay_json(
    model: &LlamaModel,
    traces: &[PathBuf],
    limit: usize,
    shapes: &ShapeTimes,
    points: &[TimedSize],
) -> Result<Value> {
    let curve = curve_of(points)?;
    let mut out = Vec::new();
    for path in traces {
        let mut steps = read_trace(path)?;
        steps.truncate(limit);
        let plain = plain_sequence(&steps);
        let mut lm = model.new_lm()?;
        let base = replay(&mut lm, &plain)?;
        let unpadded = replay(&mut lm, &steps)?;
        lm.pad_shapes(Some(&shapes.buckets));
        let padded = replay(&mut lm, &steps)?;
        let run = |t: &ReplayTiming, predicted: f64| {
            json!({"wall_ms": t.wall_ms, "forward_ms": t.forward_ms, "predicted_ms": predicted,
                   "graph_reuses": t.graph_reuses, "forwards": t.steps,
                   "host_ms_per_step": t.host_ms_per_step(), "speedup_vs_plain": base.wall_ms / t.wall_ms})
        };
        out.push(json!({
            "trace": path.display().to_string(),
            "steps": steps.len(),
            "tokens": plain.len(),
            "plain": run(&base, predict_ms(&plain, &curve, shapes, false)),
            "unpadded": run(&unpadded, predict_ms(&steps, &curve, shapes, false)),
            "padded": run(&padded, predict_ms(&steps, &curve, shapes, true)),
        }));
    }
    Ok(Value::Array(out))
}
