//! The scheduling side: the jobs the backend speaks ([`job`]: `Job`, `Event`,
//! `GenerationBackend`), the bounded wait in front of the models ([`queue`]), continuous batching
//! ([`scheduler`]), the methods a request may name ([`methods`]) and each tenant's suffix state
//! ([`histories`]). The models themselves are [`crate::adapters`]'.

pub mod histories;
pub mod job;
pub mod methods;
pub(crate) mod queue;
pub mod scheduler;
