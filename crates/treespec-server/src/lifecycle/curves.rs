//! The default method of a llama.cpp server, stood in for while this machine's cost curves are
//! measured in the background, and the switch-over once they are in.

use std::sync::Arc;

use anyhow::Result;
use treespec_engine::measure::serving_gate;
use treespec_engine::{Method, MethodSpec};
use treespec_llama::ModelRuntime;

use crate::histories::TenantHistories;
use crate::methods::{ServerMethods, SharedContext};
use crate::metrics::Metrics;

/// The server's methods. A cost-aware default whose curves this machine has not measured yet
/// (or `reprofile`) does not hold the server up: it listens at once, serving the default's
/// fixed-budget neighbour ([`MethodSpec::without_costs`]) while a background thread measures the
/// curves in the gaps between requests (it pauses while any is in flight, so serving never pays
/// for it: [`serving_gate`]), then switches (`/health` says which, and whether the curve is
/// provisional; a failed measurement keeps the stand-in and warns).
pub(super) fn default_methods(
    runtime: &Arc<ModelRuntime>,
    spec: &MethodSpec,
    reprofile: bool,
    histories: Arc<TenantHistories>,
    metrics: &Arc<Metrics>,
) -> Result<Arc<ServerMethods>> {
    let context = runtime.clone() as SharedContext;
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
    std::thread::Builder::new()
        .name("treespec-costs".into())
        .spawn(move || switch_when_measured(&runtime, &spec, reprofile, &handle, &metrics))?;
    Ok(methods)
}

/// On the background thread: measure the curves between requests, then serve the default
/// method itself from now on (or warn and keep the stand-in).
fn switch_when_measured(
    runtime: &ModelRuntime,
    spec: &MethodSpec,
    reprofile: bool,
    methods: &ServerMethods,
    metrics: &Metrics,
) {
    match serving_gate::in_background(|| resolve(runtime, spec, reprofile)) {
        Ok(method) => {
            let provisional = runtime.cost_curves_provisional();
            let how = if provisional {
                " on cores that stayed busy (provisional: refined as requests run, measured again next start)"
            } else {
                ""
            };
            eprintln!("treespec serve: cost curves measured{how}; '{}' serves from now on", method.name());
            methods.measured(method);
            metrics.costs_provisional(provisional);
            metrics.measuring_costs(None);
        }
        Err(e) => eprintln!(
            "treespec serve: warning: measuring the cost curves failed ({e:#}); the fixed budget stays"
        ),
    }
}

/// `spec` on `runtime`, its cost curves measured again first with `reprofile`.
fn resolve(runtime: &ModelRuntime, spec: &MethodSpec, reprofile: bool) -> Result<Method> {
    if reprofile && spec.needs_costs() {
        runtime.cost_model(runtime.has_draft(), true)?;
    }
    Ok(spec.resolve(runtime)?)
}
