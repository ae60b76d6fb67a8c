//! The model adapters: llama.cpp's models ([`llama_cpp`]: the served model's text, identity and
//! checks; [`llama_cpp_lanes`]: the batch scheduler's lanes on them) and the toy models of the
//! tests ([`toy`]: the toys' text and prompts; [`toy_lanes`]: their lanes). A new model adapter
//! is a file here: a `LaneModels` for the scheduler.

pub mod llama_cpp;
pub(crate) mod llama_cpp_lanes;
pub mod toy;
pub(crate) mod toy_lanes;
