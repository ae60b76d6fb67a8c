//! `treespec bench --sessions FILE --server NAME=URL …`: multi-turn sessions against running
//! servers (the harness is `treespec_bench::sessions`); the report goes where `bench` reports go.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use treespec_bench::sessions::{
    load_sessions, run_sessions, select_sessions, sessions_summary_md, write_sessions, Sampling, Server,
    SessionBenchConfig, Workload,
};
use treespec_bench::ProgressMode;

use super::BenchArgs;

/// Parse `NAME=URL`.
fn server(arg: &str) -> Result<Server> {
    let Some((name, url)) = arg.split_once('=') else {
        bail!("--server {arg}: expected NAME=URL (e.g. treespec:auto=http://127.0.0.1:8080)")
    };
    if name.is_empty() || !(url.starts_with("http://") || url.starts_with("https://")) {
        bail!("--server {arg}: expected NAME=URL with an http:// or https:// URL");
    }
    Ok(Server { name: name.to_string(), url: url.to_string() })
}

fn workloads(names: &[String]) -> Result<Vec<Workload>> {
    names
        .iter()
        .map(|n| {
            serde_json::from_value(serde_json::Value::String(n.clone())).with_context(|| {
                format!("unknown workload {n:?} (agent-whole, agent-search-replace, chat, tools, doc-qa)")
            })
        })
        .collect()
}

/// Run the sessions and write the report.
pub fn run(args: &BenchArgs, files: &[PathBuf]) -> Result<()> {
    let servers = args.servers.iter().map(|s| server(s)).collect::<Result<Vec<_>>>()?;
    let mut names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
    names.sort();
    if names.windows(2).any(|w| w[0] == w[1]) {
        bail!("two --server flags share a name");
    }
    let baseline = args.baseline.clone().unwrap_or_else(|| servers[0].name.clone());
    if !servers.iter().any(|s| s.name == baseline) {
        bail!("--baseline {baseline} is not one of the --server names");
    }
    if args.concurrency == 0 || args.repeat == 0 {
        bail!("--concurrency and --repeat must be at least 1");
    }
    let wanted = args.categories.as_deref().map(workloads).transpose()?;
    let all = load_sessions(files)?;
    let sessions = select_sessions(&all, wanted.as_deref(), args.per_category, args.limit)?;
    let config = SessionBenchConfig {
        servers,
        baseline,
        sampling: Sampling { temperature: args.sampling.temp, seed: args.sampling.seed() },
        concurrency: args.concurrency,
        repeat: args.repeat,
        warmup: !args.no_warmup,
        files: files.iter().map(|f| f.display().to_string()).collect(),
    };
    let progress = if args.log { ProgressMode::Log } else { ProgressMode::Auto };
    let out: &Path = args.out.as_deref().unwrap_or(Path::new("bench-out/sessions"));
    let results = run_sessions(&sessions, &config, progress, Some(&out.join("requests.jsonl")))?;
    let written = write_sessions(out, &results)?;
    print!("{}", sessions_summary_md(&results));
    eprintln!("\n[bench] sessions done in {:.1} s; wrote:", results.elapsed_s);
    for f in written {
        eprintln!("  {}", f.display());
    }
    if !results.errors.is_empty() {
        bail!("{} session(s) failed (listed above and in summary.md)", results.errors.len());
    }
    Ok(())
}
