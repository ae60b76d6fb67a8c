//! The speculative generation loop for one request on its own target: prefill → { propose →
//! score → verify → commit → emit } … The step itself is [`Generation`]'s; this file only runs it
//! against one target (a batching scheduler runs the same steps with many requests per forward).
//!
//! One step: the drafter proposes a token tree rooted at the last emitted token; the target scores
//! the whole tree in ONE forward pass; the verifier walks it and returns the accepted path plus a
//! bonus token; both models keep only the accepted path; the emitted tokens are checked against
//! the stop conditions and streamed out. Plain decoding is the same loop with an empty tree.

use std::time::Instant;

use crate::backend::TokenBytes;
use crate::backend::{CausalLm, TreeBatch};
use crate::constraint::TokenConstraint;
use crate::drafter::{Drafter, ForwardCost};
use crate::error::{EngineError, Result};
use crate::generation::{Generation, ProposeAt, Scored, StepOutcome};
use crate::generation_io::{GenerateOutput, GenerateRequest};

/// Run one generation. `on_step` receives each step's outcome (its emitted tokens and the text
/// they released) and returns false to cancel. `bytes` decodes the text (and is needed for stop
/// strings); without it the outcome's text is empty.
pub fn generate(
    target: &mut dyn CausalLm,
    drafter: &mut dyn Drafter,
    request: &GenerateRequest,
    bytes: Option<&dyn TokenBytes>,
    on_step: &mut dyn FnMut(&StepOutcome) -> bool,
) -> Result<GenerateOutput> {
    generate_constrained(target, drafter, request, None, bytes, on_step)
}

/// [`generate`] under a grammar: every target distribution is the grammar-masked one, tokens the
/// grammar forces are verified as a free chain, and generation ends where the grammar does.
pub fn generate_constrained(
    target: &mut dyn CausalLm,
    drafter: &mut dyn Drafter,
    request: &GenerateRequest,
    mut constraint: Option<&mut dyn TokenConstraint>,
    bytes: Option<&dyn TokenBytes>,
    on_step: &mut dyn FnMut(&StepOutcome) -> bool,
) -> Result<GenerateOutput> {
    let mut generation = Generation::new(request.clone(), target.context_size(), target.vocab_size(), bytes)?;
    let t = Instant::now();
    target.truncate(0)?;
    target.prefill(generation.prompt_head())?;
    generation.begin(drafter, t.elapsed())?;
    while let Some(tree) =
        generation.propose(drafter, constraint.as_deref_mut(), ProposeAt::alone(target.committed_len()))?
    {
        let t = Instant::now();
        let logits = target.forward(&TreeBatch::from_tree(tree, 0))?;
        let forward = ForwardCost {
            rows: logits.rows(),
            prompt_rows: 0,
            time: t.elapsed(),
            graph_reused: logits.graph_reused(),
        };
        let scored = Scored { logits: &logits, forward };
        let step = generation.complete(drafter, constraint.as_deref_mut(), scored, bytes)?;
        target.commit(&step.path)?;
        if !on_step(&step) {
            generation.cancel(drafter);
            return Err(EngineError::Cancelled);
        }
        if step.done {
            break;
        }
    }
    Ok(generation.finish(drafter))
}
