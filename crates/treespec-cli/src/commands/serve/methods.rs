//! What `treespec serve` serves with: every tenant's suffix history, and the default method,
//! stood in for while this machine's cost curves are measured in the background.

use std::sync::Arc;

use anyhow::Result;
use treespec_engine::measure::serving_gate;
use treespec_engine::MethodSpec;
use treespec_server::histories::TenantHistories;
use treespec_server::methods::ServerMethods;
use treespec_server::{ApiKeys, Metrics, Tenant};

use crate::commands::models::resolve;

/// Every tenant's suffix history: from the files named after `path` (each loaded now, its file
/// checked for writing), or in memory only.
pub(super) fn load_histories(
    path: Option<&std::path::Path>,
    spec: &MethodSpec,
    runtime: &treespec_llama::ModelRuntime,
    keys: &ApiKeys,
) -> Result<Arc<TenantHistories>> {
    let Some(path) = path else { return Ok(TenantHistories::in_memory()) };
    let cap = spec.knobs.suffix_cap.unwrap_or(treespec_core::suffix::DEFAULT_CAP_TOKENS);
    let tenants: Vec<Tenant> = keys.tenants().collect();
    let histories = TenantHistories::in_files(path, runtime.tokenizer_id()?, cap, tenants)?;
    for h in histories.held().iter().filter(|h| h.docs > 0) {
        eprintln!(
            "treespec serve: loaded the suffix history {} ({} tokens in {} documents)",
            h.path.display(),
            h.tokens,
            h.docs
        );
    }
    Ok(histories)
}

/// The server's methods. A cost-aware default whose curves this machine has not measured yet
/// (or `--reprofile`) does not hold the server up: it listens at once, serving the default's
/// fixed-budget neighbour ([`MethodSpec::without_costs`]) while a background thread measures the
/// curves in the gaps between requests (it pauses while any is in flight, so serving never pays
/// for it: `treespec_engine::measure::serving_gate`), then switches (`/health` says which, and whether the
/// curve is provisional; a failed measurement keeps the stand-in and warns).
pub(super) fn default_methods(
    runtime: &Arc<treespec_llama::ModelRuntime>,
    spec: &MethodSpec,
    reprofile: bool,
    histories: Arc<TenantHistories>,
    metrics: &Arc<Metrics>,
) -> Result<Arc<ServerMethods>> {
    let context = runtime.clone() as treespec_server::methods::SharedContext;
    if !spec.needs_costs() || (!reprofile && runtime.has_cost_curves(runtime.has_draft())) {
        let method = resolve(runtime, spec, reprofile)?;
        return Ok(Arc::new(ServerMethods::with_histories(method, context, histories)));
    }
    // Knobs are checked now, not when the curves are in.
    spec.validate()?;
    let stand_in = resolve(runtime, &spec.without_costs(), false)?;
    eprintln!(
        "treespec serve: measuring this machine's cost curves in the background, between requests; \
         '{}' on a fixed budget serves until then (see /health)",
        stand_in.name()
    );
    metrics.measuring_costs(Some(stand_in.name()));
    let methods = Arc::new(ServerMethods::measuring(stand_in, context, histories));
    let (runtime, spec, metrics, handle) = (runtime.clone(), spec.clone(), metrics.clone(), methods.clone());
    std::thread::Builder::new().name("treespec-costs".into()).spawn(move || {
        match serving_gate::in_background(|| resolve(&runtime, &spec, reprofile)) {
            Ok(method) => {
                let provisional = runtime.cost_curves_provisional();
                let how = if provisional {
                    " on cores that stayed busy (provisional: refined as requests run, measured again next start)"
                } else {
                    ""
                };
                eprintln!("treespec serve: cost curves measured{how}; '{}' serves from now on", method.name());
                handle.measured(method);
                metrics.costs_provisional(provisional);
                metrics.measuring_costs(None);
            }
            Err(e) => eprintln!(
                "treespec serve: warning: measuring the cost curves failed ({e:#}); the fixed budget stays"
            ),
        }
    })?;
    Ok(methods)
}
