//! Every endpoint and error path, in process (tower `oneshot`), on the toy backend — once behind
//! the FIFO worker pool and once behind the continuous-batching scheduler (the cases are in
//! `common/router_cases.rs`, included in both modules).

mod fifo {
    use treespec_server::EnginePool;

    /// One worker thread.
    fn pool(config: ToyConfig, queue: usize, metrics: Arc<Metrics>) -> Arc<dyn GenerationBackend> {
        Arc::new(EnginePool::toy(config, 1, queue, metrics))
    }

    include!("common/router_cases.rs");
}

mod batch {
    use treespec_server::{BatchPool, SchedulerConfig};

    /// One lane: the same queueing as one FIFO worker, so every case means the same.
    fn pool(config: ToyConfig, queue: usize, metrics: Arc<Metrics>) -> Arc<dyn GenerationBackend> {
        let scheduler = SchedulerConfig { parallel: 1, queue, ..Default::default() };
        Arc::new(BatchPool::toy(config, scheduler, metrics))
    }

    include!("common/router_cases.rs");
}
