//! The scheduling side: the jobs every backend speaks ([`job`]: `Job`, `Event`,
//! `GenerationBackend`), the bounded wait in front of the models ([`queue`]), continuous batching
//! ([`scheduler`], the default) and beside it one request per worker ([`fifo`], `--scheduler
//! fifo`), the methods a request may name ([`methods`]) and each tenant's suffix state
//! ([`histories`]). The models themselves are [`crate::adapters`]'.

pub mod fifo;
pub mod histories;
pub mod job;
pub mod methods;
pub(crate) mod queue;
pub mod scheduler;
