//! `treespec serve`: an OpenAI-compatible HTTP server (see the treespec-server crate). The flags
//! and what they set up are in `args.rs`; here the models load and the flags become the
//! server's [`Start`], and the server starts, serves and stops itself
//! ([`treespec_server::lifecycle::Server`]: the histories, the default method and its curves,
//! the drain, the saves).

mod args;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use treespec_server::lifecycle::{HistoryFiles, LlamaStart, Server, Start};
use treespec_server::{ApiKeys, Draining, ServerConfig};

pub use args::ServeArgs;

use super::models::load_runtime;
use args::{alias, api_keys, scheduler_config, tls_files, ShareHistory};

/// Run `serve` until Ctrl-C or SIGTERM. With `--suffix-history`, every tenant's history is
/// loaded at start (its file checked for writing), saved every `--history-save-every` seconds
/// when a request added to it, and at shutdown, so that the next start drafts from it.
pub fn run(args: ServeArgs) -> Result<()> {
    let scheduler = scheduler_config(&args)?;
    let keys = api_keys(&args)?;
    let sampling = args.sampling.defaults()?;
    let alias = alias(&args)?;
    let tls = tls_files(&args)?;
    // One runtime: the fingerprint, the cost curves and every worker use the same loaded files.
    let runtime = Arc::new(load_runtime(&args.models)?);
    // The history files are the tenants' ([`treespec_server::histories::TenantHistories`]), not
    // the default method's.
    let mut spec = args.method.spec();
    if args.spec_default {
        spec.method = treespec_engine::MethodKind::Auto;
    }
    let histories = spec.knobs.suffix_history.take().map(|path| HistoryFiles {
        path,
        cap: spec.knobs.suffix_cap.unwrap_or(treespec_core::suffix::DEFAULT_CAP_TOKENS),
        save_every: (args.history_save_every > 0).then(|| Duration::from_secs(args.history_save_every)),
    });
    let cache_ram = usize::try_from(args.cache_ram.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
    let http = ServerConfig {
        api_keys: keys.clone(),
        metrics_key: args.metrics_key.clone(),
        metrics_open: args.metrics_open,
        max_body_bytes: args.max_body,
        draining: Draining::default(),
        timeout: Duration::from_secs(args.timeout),
        webui: !args.no_webui,
        sampling,
    };
    let start = Start { http, drain: Duration::from_secs(args.drain), histories, tls };
    let models = LlamaStart { runtime, spec, reprofile: args.method.reprofile, scheduler, cache_ram, alias };
    let server = Server::llama(start, models)?;
    report_keys(&args, &keys);
    if server.serve(&args.host, args.port)?.measuring {
        exit_while_measuring();
    }
    Ok(())
}

/// Say how many keys guard the server and who learns from whom.
fn report_keys(args: &ServeArgs, keys: &ApiKeys) {
    if !keys.required() {
        return;
    }
    let sharing = match args.share_history {
        ShareHistory::Tenant => "each key learns only from its own requests",
        ShareHistory::All => "every key learns from every request (--share-history all)",
    };
    eprintln!("treespec serve: {} API key(s); {sharing}", keys.len());
}

/// The curves are being measured on a thread of their own, inside llama.cpp: returning would run
/// llama.cpp's static destructors under it (a crash at exit). Everything of ours is saved and
/// the half-measured curve was never cached: leave at once.
fn exit_while_measuring() -> ! {
    eprintln!("treespec serve: stopped while measuring the cost curves (measured again at the next start)");
    use std::io::Write;
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` ends the process without running destructors or atexit handlers; no state
    // of ours is left unwritten (the histories were saved before, stdout is unused).
    unsafe { libc::_exit(0) }
}
