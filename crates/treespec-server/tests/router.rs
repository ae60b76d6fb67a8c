//! Every endpoint and error path, in process (tower `oneshot`), on the toy backend behind the
//! continuous-batching scheduler (the cases are in `common/router_cases.rs`).

mod batch {
    use treespec_server::{BatchPool, SchedulerConfig};

    /// One lane: requests wait in the queue one behind the other.
    fn pool(config: ToyConfig, queue: usize, metrics: Arc<Metrics>) -> Arc<dyn GenerationBackend> {
        let scheduler = SchedulerConfig { parallel: 1, queue, ..Default::default() };
        Arc::new(BatchPool::toy(config, scheduler, metrics))
    }

    include!("common/router_cases.rs");
}
