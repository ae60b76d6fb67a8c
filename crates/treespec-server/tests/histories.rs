//! Each tenant's suffix history in its own file (issue #29): loaded at start, a bad directory
//! refused at start, saved whenever a request added to it (whatever the default method), and
//! given back to the same tenant only after a restart. And the first start: a cost-aware method
//! is stood in for by its fixed-budget neighbour until the curves are measured.

use std::path::PathBuf;
use std::sync::Arc;

use treespec_core::ngram::TokenizerId;
use treespec_engine::registry::{FixedContext, MethodKind, MethodSpec};
use treespec_engine::toy::toy_costs;
use treespec_engine::Method;
use treespec_server::histories::TenantHistories;
use treespec_server::methods::ServerMethods;
use treespec_server::Tenant;

const TOKENIZER: TokenizerId = TokenizerId { fingerprint: 0x5eed, vocab: 26 };
const CAP: usize = 1 << 16;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("treespec-histories-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn spec(method: MethodKind) -> MethodSpec {
    MethodSpec { method, knobs: Default::default() }
}

#[test]
fn each_tenant_keeps_its_own_file() {
    let dir = scratch("files");
    let base = dir.join("h.bin");
    let (a, b) = (Tenant::of_key("alpha"), Tenant::of_key("beta"));
    let histories = TenantHistories::in_files(&base, TOKENIZER, CAP, [a, b]).unwrap();
    // A plain default: a request that asks for `suffix` still learns into its tenant's history.
    let context = FixedContext { costs: Some(toy_costs()), ..Default::default() };
    let methods = ServerMethods::with_histories(Method::Plain, Arc::new(context), histories.clone());
    let Method::Suffix(config) = methods.for_request(Some(&spec(MethodKind::Suffix)), a).unwrap() else {
        panic!("a suffix spec resolves to suffix")
    };
    assert!(Arc::ptr_eq(&config.shared, &histories.of(a).unwrap()), "the tenant's own history");
    assert!(!Arc::ptr_eq(&config.shared, &histories.of(b).unwrap()));
    config.shared.add(1, &[3, 4, 5, 6, 7]);
    assert_eq!(histories.save_changed().unwrap().len(), 1, "A's history changed");
    let a_file = TenantHistories::path_of(&base, a);
    assert!(a_file.exists(), "{}", a_file.display());
    assert_ne!(a_file, base);
    // Nothing changed since: nothing written.
    assert!(histories.save_changed().unwrap().is_empty());
    // A restart gives A its history back, and B and the shared tenant none of it.
    let again = TenantHistories::in_files(&base, TOKENIZER, CAP, [a, b]).unwrap();
    assert_eq!(again.of(a).unwrap().history().docs(), 1);
    assert_eq!(again.of(b).unwrap().history().docs(), 0);
    assert_eq!(again.of(Tenant::SHARED).unwrap().history().docs(), 0);
}

#[test]
fn a_history_that_cannot_be_written_stops_the_start() {
    let dir = scratch("missing");
    let base = dir.join("no-such-dir").join("h.bin");
    let e = TenantHistories::in_files(&base, TOKENIZER, CAP, []).expect_err("a missing directory");
    assert!(format!("{e:#}").contains("no-such-dir"), "{e:#}");
}

#[test]
fn cost_aware_methods_stand_in_until_the_curves_are_measured() {
    let context = FixedContext { costs: Some(toy_costs()), ..Default::default() };
    let stand_in = spec(MethodKind::Auto).without_costs();
    assert_eq!(stand_in.method, MethodKind::Suffix);
    assert!(!stand_in.needs_costs());
    assert!(!spec(MethodKind::DySpec).without_costs().needs_costs());
    let meanwhile = stand_in.resolve(&context).unwrap();
    let methods =
        ServerMethods::measuring(meanwhile, Arc::new(context.clone()), TenantHistories::in_memory());
    assert!(methods.is_measuring());
    let t = Tenant::SHARED;
    assert_eq!(methods.for_request(None, t).unwrap().kind(), MethodKind::Suffix);
    // A request asking for `auto` meanwhile gets its fixed-budget neighbour, not a profile run.
    assert_eq!(methods.for_request(Some(&spec(MethodKind::Auto)), t).unwrap().kind(), MethodKind::Suffix);
    methods.measured(spec(MethodKind::Auto).resolve(&context).unwrap());
    assert!(!methods.is_measuring());
    assert_eq!(methods.for_request(None, t).unwrap().kind(), MethodKind::Auto);
    assert_eq!(methods.for_request(Some(&spec(MethodKind::Auto)), t).unwrap().kind(), MethodKind::Auto);
}
