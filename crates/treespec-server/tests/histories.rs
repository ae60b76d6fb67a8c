//! Each tenant's suffix history in its own file (issue #29): loaded at start, a bad directory
//! refused at start, saved whenever a request added to it (whatever the default method), and
//! given back to the same tenant only after a restart. Two servers on one file merge their
//! histories; files are private, named by a keyed hash under a per-install secret, migrated from
//! their old unkeyed names; an empty file is an empty history. And the first start: a cost-aware
//! method is stood in for by its fixed-budget neighbour until the curves are measured.

use std::path::PathBuf;
use std::sync::Arc;

use treespec_core::ngram::TokenizerId;
use treespec_engine::registry::{FixedContext, MethodKind, MethodSpec};
use treespec_engine::toy::toy_costs;
use treespec_engine::Method;
use treespec_server::histories::{HistoryNames, TenantHistories};
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
    let a_file = histories.names().unwrap().path_of(a).unwrap();
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

/// A drafted node's features, for recording one trial of learned prices.
const A_NODE: treespec_core::suffix::NodeFeatures =
    treespec_core::suffix::NodeFeatures { match_len: 4, depth: 1, share: 1.0, support: 1, global: false };

/// The texts a tenant's history holds, sorted.
fn texts(histories: &TenantHistories, tenant: Tenant) -> Vec<Vec<u32>> {
    let shared = histories.of(tenant).unwrap();
    let history = shared.history();
    let mut t: Vec<Vec<u32>> = history.documents().map(|(_, text)| text.to_vec()).collect();
    t.sort();
    t
}

/// A document of eight tokens, a different one for each seed below 676.
fn doc(seed: u32) -> Vec<u32> {
    let v = TOKENIZER.vocab;
    vec![seed % v, seed / v % v, 1, 2, 3, 4, 5, 6]
}

#[test]
fn two_servers_on_one_file_keep_both_histories() {
    let dir = scratch("two-servers");
    let base = dir.join("h.bin");
    let key = Tenant::of_key("alpha");
    // Two servers on one file, each serving different text and saving after every request.
    let one = TenantHistories::in_files(&base, TOKENIZER, CAP, [key]).unwrap();
    let two = TenantHistories::in_files(&base, TOKENIZER, CAP, [key]).unwrap();
    for round in 0..4u32 {
        for tenant in [Tenant::SHARED, key] {
            one.of(tenant).unwrap().add(1, &doc(round));
            two.of(tenant).unwrap().add(2, &doc(50 + round));
        }
        assert_eq!(one.save_changed().unwrap().len(), 2);
        let saved = two.save_changed().unwrap();
        assert!(saved.iter().all(|s| s.merged == 1 && s.replaced.is_none()), "{saved:?}");
    }
    let want: Vec<Vec<u32>> = {
        let mut w: Vec<Vec<u32>> = (0..4).flat_map(|r| [doc(r), doc(50 + r)]).collect();
        w.sort();
        w
    };
    // The second server drafts from the first's text too, and the first gets the second's at
    // its next save (nothing new of its own: nothing to save, nothing lost).
    assert_eq!(texts(&two, key), want);
    one.of(key).unwrap().add(1, &doc(99));
    one.save_changed().unwrap();
    let mut with_last = want.clone();
    with_last.push(doc(99));
    with_last.sort();
    assert_eq!(texts(&one, key), with_last);
    // The first is killed, the second stopped (its last save), a third starts: it has both.
    drop(one);
    two.save_changed().unwrap();
    let third = TenantHistories::in_files(&base, TOKENIZER, CAP, [key]).unwrap();
    assert_eq!(texts(&third, key), with_last);
    assert_eq!(texts(&third, Tenant::SHARED), want);
}

#[test]
fn repeated_saves_do_not_duplicate_documents() {
    let dir = scratch("no-copies");
    let base = dir.join("h.bin");
    let one = TenantHistories::in_files(&base, TOKENIZER, CAP, []).unwrap();
    let two = TenantHistories::in_files(&base, TOKENIZER, CAP, []).unwrap();
    let t = Tenant::SHARED;
    one.of(t).unwrap().add(1, &doc(1));
    two.of(t).unwrap().add(2, &doc(2));
    // The same text served by both is one document.
    one.of(t).unwrap().add(3, &doc(3));
    two.of(t).unwrap().add(4, &doc(3));
    for i in 0..20u32 {
        // Each learns a little now and then (so it saves), and saves every "second".
        if i % 5 == 0 {
            one.of(t).unwrap().add(5, &doc(10 + i));
        }
        two.of(t).unwrap().pricing().record(&A_NODE, true);
        one.save_changed().unwrap();
        two.save_changed().unwrap();
    }
    let distinct = 3 + 4;
    let third = TenantHistories::in_files(&base, TOKENIZER, CAP, []).unwrap();
    for h in [&one, &two, &third] {
        assert_eq!(h.of(t).unwrap().history().docs(), distinct);
    }
}

#[test]
fn a_server_without_keys_makes_no_secret() {
    let dir = scratch("no-keys");
    let base = dir.join("h.bin");
    let histories = TenantHistories::in_files(&base, TOKENIZER, CAP, []).unwrap();
    histories.of(Tenant::SHARED).unwrap().add(1, &doc(1));
    histories.save_changed().unwrap();
    assert!(!histories.names().unwrap().secret_path().exists());
}

#[test]
fn file_names_are_keyed_by_a_per_install_secret() {
    let dir = scratch("keyed");
    let base = dir.join("h.bin");
    let names = HistoryNames::new(&base);
    let (k1, k2) = (Tenant::of_key("key1"), Tenant::of_key("key2"));
    let id = |p: PathBuf| {
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        name.strip_prefix("h.").unwrap().strip_suffix(".bin").unwrap().to_string()
    };
    let (n1, n2) = (id(names.path_of(k1).unwrap()), id(names.path_of(k2).unwrap()));
    assert_eq!(n1.len(), 32, "{n1}");
    assert!(n1.chars().all(|c| c.is_ascii_hexdigit()), "{n1}");
    // Close keys: unrelated names (about 2 of 32 hex digits agree by chance), unlike their
    // unkeyed fingerprints, which the file names used to be.
    let agree = n1.chars().zip(n2.chars()).filter(|(a, b)| a == b).count();
    assert!(agree <= 12, "{n1} and {n2} agree in {agree} places");
    assert!(!n1.contains(&k1.to_string()) && !n2.contains(&k2.to_string()));
    // The secret: 32 bytes, private, and the same names at every start that reads it.
    let secret = names.secret_path();
    assert_eq!(secret, dir.join("h.bin.secret"));
    assert_eq!(std::fs::read(&secret).unwrap().len(), 32);
    #[cfg(unix)]
    assert_eq!(mode(&secret), 0o600);
    let again = HistoryNames::new(&base);
    assert_eq!(id(again.path_of(k1).unwrap()), n1);
    assert_eq!(id(again.path_of(k2).unwrap()), n2);
    // Another install (another secret): other names.
    let other = scratch("keyed-other").join("h.bin");
    assert_ne!(id(HistoryNames::new(&other).path_of(k1).unwrap()), n1);
    // The shared tenant's file is the path given.
    assert_eq!(names.path_of(Tenant::SHARED).unwrap(), base);
    // A damaged secret stops the start, naming it.
    std::fs::write(&secret, b"short").unwrap();
    let e = TenantHistories::in_files(&base, TOKENIZER, CAP, [k1]).expect_err("a 5-byte secret");
    assert!(format!("{e:#}").contains("h.bin.secret"), "{e:#}");
}

#[cfg(unix)]
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[cfg(unix)]
#[test]
fn every_file_the_server_creates_is_private() {
    let dir = scratch("private");
    let base = dir.join("h.bin");
    let key = Tenant::of_key("alpha");
    let histories = TenantHistories::in_files(&base, TOKENIZER, CAP, [key]).unwrap();
    for tenant in [Tenant::SHARED, key] {
        let shared = histories.of(tenant).unwrap();
        shared.add(1, &doc(1));
        shared.pricing().record(&A_NODE, true);
    }
    assert_eq!(histories.save_changed().unwrap().len(), 2);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    // Both histories, their prices and locks, and the secret.
    assert_eq!(files.len(), 7, "{files:?}");
    for f in files {
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }
}

#[test]
fn histories_under_their_old_unkeyed_names_are_moved_to_their_keyed_names() {
    let dir = scratch("migrate");
    let base = dir.join("h.bin");
    let key = Tenant::of_key("alpha");
    // What an older build left: the tenant's history, prices and lock under its fingerprint.
    let old = dir.join(format!("h.{key}.bin"));
    let mut history = treespec_core::suffix::GlobalHistory::new(CAP).unwrap();
    history.add(7, &doc(7));
    let old_file = treespec_engine::drafters::HistoryFile::open(&old).unwrap();
    let mut pricing = treespec_core::suffix::SuffixPricing::new();
    pricing.record(&A_NODE, true);
    old_file.save_with_pricing(&history, &pricing, TOKENIZER).unwrap();
    assert!(dir.join(format!("h.{key}.bin.lock")).exists());
    // The older build's files were as the umask made them (world-readable, often).
    use std::os::unix::fs::PermissionsExt;
    let old_prices = dir.join(format!("h.{key}.bin.prices.json"));
    for f in [&old, &old_prices] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let histories = TenantHistories::in_files(&base, TOKENIZER, CAP, [key]).unwrap();
    let new = histories.names().unwrap().path_of(key).unwrap();
    assert!(new.exists() && !old.exists(), "{}", new.display());
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let new_prices = std::path::PathBuf::from(format!("{}.prices.json", new.display()));
    assert_eq!((mode(&new), mode(&new_prices)), (0o600, 0o600), "taken over and made private");
    assert_eq!(texts(&histories, key), vec![doc(7)]);
    assert_eq!(histories.of(key).unwrap().pricing_snapshot(), pricing);
    let leftovers: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains(&key.to_string()))
        .collect();
    assert_eq!(leftovers, Vec::<String>::new(), "nothing keeps the unkeyed name");
    // Once moved, a later start finds it under the keyed name; an old file that reappears
    // beside it (an older build still running) does not replace it.
    std::fs::write(&old, b"").unwrap();
    let again = TenantHistories::in_files(&base, TOKENIZER, CAP, [key]).unwrap();
    assert_eq!(texts(&again, key), vec![doc(7)]);
    assert!(old.exists());
    // The lock file an older build made at start for a key that never saved goes too.
    let idle = Tenant::of_key("beta");
    let stray = dir.join(format!("h.{idle}.bin.lock"));
    std::fs::write(&stray, b"").unwrap();
    TenantHistories::in_files(&base, TOKENIZER, CAP, [idle]).unwrap();
    assert!(!stray.exists());
}

#[test]
fn an_empty_history_file_is_an_empty_history() {
    let dir = scratch("touched");
    let base = dir.join("h.bin");
    // What SECURITY.md advises: create the file, then set its permissions, then start.
    std::fs::write(&base, b"").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let histories = TenantHistories::in_files(&base, TOKENIZER, CAP, []).unwrap();
    assert_eq!(histories.of(Tenant::SHARED).unwrap().history().docs(), 0);
    histories.of(Tenant::SHARED).unwrap().add(1, &doc(1));
    assert_eq!(histories.save_changed().unwrap().len(), 1);
    let again = TenantHistories::in_files(&base, TOKENIZER, CAP, []).unwrap();
    assert_eq!(texts(&again, Tenant::SHARED), vec![doc(1)]);
    #[cfg(unix)]
    assert_eq!(mode(&base), 0o600);
}
