//! `treespec serve`'s start-up, as `Server::llama` (`lifecycle/start.rs`) does it, loads each
//! model file once: one runtime gives the tokenizer fingerprint, the cost curves and every
//! worker's weights (it used to load the target up to three times). Counted with
//! `treespec_llama::models_loaded`, which is
//! process-wide: this file holds one test so that nothing else loads beside it.
//!
//! Needs `models/SmolLM2-135M-Instruct.Q4_1.gguf`; set TREESPEC_SKIP_MODEL_TESTS=1 to skip.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use treespec_engine::auto_budget::SharedCosts;
use treespec_engine::drafters::DySpecConfig;
use treespec_engine::Method;
use treespec_llama::{models_loaded, LoadOptions, ModelPaths, ModelRuntime};
use treespec_server::{BatchPool, LlamaConfig, Metrics, SchedulerConfig};

fn model_path() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if std::env::var("TREESPEC_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!("skipping: TREESPEC_SKIP_MODEL_TESTS=1");
        return None;
    }
    assert!(p.exists(), "{} is missing: run scripts/fetch-models.sh", p.display());
    Some(p)
}

/// Start a two-worker pool the way `treespec serve` does, with a default method that needs the
/// cost curves (dyspec, budget sized from them) after reading the tokenizer fingerprint; return
/// how many models that loaded.
fn serve_loads(model: &Path, draft: &Path, cache: &Path) -> usize {
    let before = models_loaded();
    let options = LoadOptions { threads: 1, ctx_size: 512, ..LoadOptions::default() };
    let paths = ModelPaths::new(model, Some(draft.to_path_buf()));
    let runtime =
        Arc::new(ModelRuntime::load(paths, options).unwrap().with_cost_cache_dir(Some(cache.into())));
    runtime.tokenizer_id().unwrap();
    let costs = runtime.cost_model(runtime.has_draft(), false).unwrap();
    let method = Method::DySpec(DySpecConfig { costs: Some(SharedCosts::new(costs)), ..Default::default() });
    let config = LlamaConfig::new(runtime.clone(), method);
    let (scheduler, ctx) =
        (SchedulerConfig { parallel: 2, queue: 4, ..Default::default() }, runtime.options().ctx_size);
    let pool = BatchPool::llama(config, scheduler, ctx, Arc::new(Metrics::default())).unwrap();
    // Asked again, the runtime answers from what it holds.
    runtime.tokenizer_id().unwrap();
    runtime.cost_model(true, false).unwrap();
    drop(pool);
    models_loaded() - before
}

#[test]
fn serve_loads_each_model_file_once() {
    let Some(model) = model_path() else { return };
    let dir = std::env::temp_dir().join(format!("treespec-load-once-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cache = dir.join("cache");

    assert_eq!(serve_loads(&model, &model, &cache), 1, "the draft is the target file");
    let link = dir.join("link.gguf");
    std::os::unix::fs::symlink(&model, &link).unwrap();
    assert_eq!(serve_loads(&model, &link, &cache), 1, "a symlink to the target is the same file");

    // Another file with the same weights: a hard link where the file system allows, else a copy.
    let other = dir.join(model.file_name().unwrap());
    if std::fs::hard_link(&model, &other).is_err() {
        std::fs::copy(&model, &other).unwrap();
    }
    assert_eq!(serve_loads(&model, &other, &cache), 2, "a separate draft file loads once");
    std::fs::remove_dir_all(dir).unwrap();
}
