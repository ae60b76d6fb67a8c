//! The model adapters: llama.cpp's models ([`llama_cpp`]: what both of its backends share, above
//! all the one request preparation; [`llama_cpp_lanes`]: the batch scheduler's lanes;
//! [`llama_cpp_worker`]: the FIFO workers) and the toy models of the tests ([`toy`]: its FIFO
//! worker; [`toy_lanes`]: its lanes). A new model adapter is a file here.

pub mod llama_cpp;
pub(crate) mod llama_cpp_lanes;
pub(crate) mod llama_cpp_worker;
pub mod toy;
pub(crate) mod toy_lanes;
