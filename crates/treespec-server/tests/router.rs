//! Every endpoint and error path, in process (tower `oneshot`), on the toy backend — once behind
//! the FIFO worker pool and once behind the continuous-batching scheduler (the cases are in
//! `common/router_cases.rs`, included in both modules).

mod fifo {
    #![allow(unused_imports)]
    use std::sync::Arc;
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::{header, Request, StatusCode};
    use axum::Router;
    use http_body_util::BodyExt;
    use serde_json::{json, Value};
    use tower::ServiceExt;
    use treespec_server::{
        router, BatchPool, EnginePool, GenerationBackend, Metrics, SchedulerConfig, ServerConfig, ToyConfig,
    };

    fn app_with(
        config: ToyConfig,
        queue: usize,
        server: ServerConfig,
    ) -> (Router, Arc<dyn GenerationBackend>, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::default());
        let pool: Arc<dyn GenerationBackend> = Arc::new(EnginePool::toy(config, 1, queue, metrics.clone()));
        (router(pool.clone(), metrics.clone(), server), pool, metrics)
    }

    include!("common/router_cases.rs");
}

mod batch {
    #![allow(unused_imports)]
    use std::sync::Arc;
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::{header, Request, StatusCode};
    use axum::Router;
    use http_body_util::BodyExt;
    use serde_json::{json, Value};
    use tower::ServiceExt;
    use treespec_server::{
        router, BatchPool, EnginePool, GenerationBackend, Metrics, SchedulerConfig, ServerConfig, ToyConfig,
    };

    fn app_with(
        config: ToyConfig,
        queue: usize,
        server: ServerConfig,
    ) -> (Router, Arc<dyn GenerationBackend>, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::default());
        // One lane: the same queueing as one FIFO worker, so every case means the same.
        let scheduler = SchedulerConfig { parallel: 1, queue, ..Default::default() };
        let pool: Arc<dyn GenerationBackend> = Arc::new(BatchPool::toy(config, scheduler, metrics.clone()));
        (router(pool.clone(), metrics.clone(), server), pool, metrics)
    }

    include!("common/router_cases.rs");
}
