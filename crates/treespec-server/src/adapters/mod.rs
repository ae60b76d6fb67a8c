//! The model adapters: llama.cpp's models ([`llama_cpp`]: the served model's identity, device
//! and checks; [`llama_cpp_lanes`]: the batch scheduler's lanes on them) and the toy models of the
//! tests ([`toy`]: the toys' methods and token bytes; [`toy_lanes`]: their lanes). A new model
//! adapter is a file here: a `LaneModels` for the scheduler (the batched target, the shared draft,
//! a lane's context) on a model that implements the one model trait, `PromptModel`; the scheduler
//! prepares its requests itself.

pub mod llama_cpp;
pub(crate) mod llama_cpp_lanes;
pub mod toy;
pub(crate) mod toy_lanes;
