//! Every endpoint and error path, in process (tower `oneshot`), on the toy backend behind the
//! continuous-batching scheduler (the cases are in `common/router_cases.rs`).

// Tests are exempt from the 80-line limit (clippy.toml): a test reads top to bottom as one story.
#![allow(clippy::too_many_lines)]

mod batch {
    use treespec_server::{BatchPool, SchedulerConfig};

    /// One lane: requests wait in the queue one behind the other.
    fn pool(config: ToyConfig, queue: usize, metrics: Arc<Metrics>) -> Arc<dyn GenerationBackend> {
        let scheduler = SchedulerConfig { parallel: 1, queue, ..Default::default() };
        Arc::new(BatchPool::toy(config, scheduler, metrics))
    }

    include!("common/router_cases.rs");
}
