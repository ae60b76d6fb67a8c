//! treespec-bench: the benchmark harness behind `treespec bench`.
//!
//! - [`prompts`]: Spec-Bench / MT-Bench JSON lines (`question_id`, `category`, `turns`; the first
//!   turn is used) and plain `{"prompt": ...}` lines; category filters and limits.
//! - [`runner`]: every method on every prompt, interleaved per prompt (plain, A, B, … then the next
//!   prompt) after a warm-up pass, with repeats; generic over the model [`runner::Backend`]
//!   (llama.cpp in the CLI, [`runner::ToyBackend`] in tests). At temperature 0 every run is
//!   checked token by token against plain's run of the same prompt.
//! - [`summary`]: medians per (method, category) and over all prompts; speed-up = ratio of the
//!   method's median tokens/s to plain's over the same runs; each row carries its run count and
//!   min–max spread. The module docs hold the exact definitions.
//! - [`record`]: the schema of `results.json` (runs, settings, summary rows).
//! - [`report`]: `results.json`, `summary.md`, `speedup.svg`, `acceptance.svg` (plotters' SVG
//!   backend without a font backend: text is written as SVG `<text>` and drawn by the viewer, so
//!   no font file is needed to build, run or view).
//! - [`compare`]: the change between two result sets.
//! - [`sessions`]: multi-turn sessions replayed against running servers (`treespec bench
//!   --sessions FILE --server NAME=URL`), each answer generated live and fed back.

// Tests are exempt from the 80-line limit (clippy.toml): a test reads top to bottom as one story.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod compare;
pub mod machine;
pub mod prompts;
pub mod record;
pub mod report;
pub mod runner;
pub mod sessions;
pub mod summary;

pub use compare::compare_text;
pub use machine::{load_average, MachineInfo, ModelFile};
pub use prompts::{load_prompts, select, Prompt, Selection};
pub use record::{BenchConfig, MethodConfig, Results, RunRecord, SamplingConfig, SCHEMA};
pub use report::write_all;
pub use runner::{
    check_method_names, run_bench, Backend, BenchMethod, ProgressMode, RunConfig, RunOutput, Session,
    ToyBackend,
};
pub use summary::{median, summarize, SummaryRow, ALL};
