//! `auto`'s decision trace: one JSON line per step saying what each policy offered, what the
//! curve and the prices predicted for it, how the measured books corrected that, what was
//! chosen, and what the step really brought — so a user can see why `auto` drafted or did not,
//! and which of curve, prices, candidates or proposal length was wrong when it lost.
//! (`treespec generate --decision-trace FILE`; the format is in docs/METHODS.md.)

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use treespec_core::policy_bandit::{Correction, Policy, Prediction};

use crate::error::{EngineError, Result};

/// Where trace lines go: shared by every drafter of the method (lines are whole, one per step).
#[derive(Clone)]
pub struct DecisionTrace {
    out: Arc<Mutex<Box<dyn Write + Send>>>,
}

impl DecisionTrace {
    /// A trace written to `path` (created or truncated).
    pub fn to_file(path: &Path) -> Result<Self> {
        let file = File::create(path)
            .map_err(|e| EngineError::InvalidRequest(format!("decision trace {}: {e}", path.display())))?;
        Ok(Self::to_writer(BufWriter::new(file)))
    }

    /// A trace written to any writer (tests read it back from a buffer).
    pub fn to_writer(out: impl Write + Send + 'static) -> Self {
        Self { out: Arc::new(Mutex::new(Box::new(out))) }
    }

    /// Append one step's line; a failed write stops nothing (the trace is a diagnostic).
    pub(super) fn write(&self, step: &StepTrace) {
        let Ok(mut line) = serde_json::to_vec(step) else { return };
        line.push(b'\n');
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let _ = out.write_all(&line).and_then(|_| out.flush());
    }
}

impl std::fmt::Debug for DecisionTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DecisionTrace")
    }
}

/// Two handles are equal when they write to the same place.
impl PartialEq for DecisionTrace {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.out, &other.out)
    }
}

/// One policy's offer at a step.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Offer {
    pub policy: Policy,
    /// Drafted nodes it would verify.
    pub nodes: usize,
    /// Tokens and ms the curve and the prices predict.
    pub predicted: Prediction,
    /// How the books read that prediction.
    pub correction: Correction,
    /// The corrected gain the choice maximised.
    pub score: f64,
    /// Cut to what this request lets the free policies bet: a few nodes until a drafted step
    /// paid, then a few times the run such steps accepted (see `bet_cap`).
    pub probe: bool,
}

/// One step of `auto`, as traced.
#[derive(Debug, Clone, Serialize)]
pub(super) struct StepTrace {
    /// Step of the request (from 1).
    pub step: u64,
    /// Committed tokens the step's rows attend to.
    pub context: usize,
    /// Rows of other requests in the same forward (0 alone).
    pub batch_rows: usize,
    /// The rate to beat (tokens per ms).
    pub rate: f64,
    /// Tokens of the long-match chain on offer before its cut (0: the text's last
    /// `MATCH_TOKENS` tokens occur nowhere earlier).
    pub long_match_chain: usize,
    /// The long-match policy's learned per-token acceptance.
    pub long_match_acceptance: f64,
    /// The most nodes a free policy may bet at this step (see `bet_cap`): an offer above it
    /// is cut and marked `probe`.
    pub bet_cap: usize,
    pub offers: Vec<Offer>,
    pub chosen: Policy,
    /// Drafted nodes verified (after any batch cut).
    pub verified_nodes: usize,
    /// Tokens emitted (accepted and the target's own).
    pub emitted: usize,
    /// Rows and ms of the target forward (the whole batch's in a batch).
    pub forward_rows: usize,
    pub forward_ms: f64,
    /// What the curve says that forward takes: T(forward rows) plus every row's surcharge for the
    /// step's context (the time the step was priced on).
    pub curve_ms: f64,
    /// What the step cost this request, as the books record it (alone: the step's wall time
    /// from proposal to verification, less any catch-up).
    pub step_ms: f64,
    /// The draft model's catch-up at this step: the prefill of the whole text it was started
    /// without (0 at every other step). A one-off the catch-up rule priced when it chose it,
    /// so the books leave it out of the step's time.
    pub catch_up_ms: f64,
    /// Whether the target forward reused the graph of the one before (llama.cpp's count; on a
    /// device, a replay), where the backend says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph_reused: Option<bool>,
}
