//! Sessions, not prompts: multi-turn work replayed through the OpenAI chat API against running
//! servers (`treespec serve`, llama-server, anything OpenAI-compatible), as its users run it.
//!
//! - [`workload`]: session files (`bench/inputs/sessions/*.jsonl`) and the selection.
//! - [`edits`]: what a coding agent does between turns (fence the file, apply the answer).
//! - [`client`]: one streamed chat completion, timed, with the server's cache and forward counts.
//! - [`play`]: one session on one server, every answer generated live and fed back.
//! - [`summary`], [`chart`]: rows by (workload, server), `summary.md`, `sessions.svg`.
//!
//! Order: sessions are taken `concurrency` at a time; each group is played on every server in
//! turn (the group's sessions at once), the server order rotating from group to group, so slow
//! drift of the machine hits every server alike and no server always goes first. Servers run
//! side by side but only one is loaded at a time.

pub mod chart;
pub mod client;
pub mod edits;
pub mod play;
pub mod summary;
pub mod workload;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::machine::{load_average, MachineInfo};
use crate::runner::{progress_bar, ProgressMode};
pub use play::{RequestRecord, Sampling, Server};
pub use summary::{sessions_markdown, summarize_sessions, SessionRow};
pub use workload::{load_sessions, select_sessions, SessionSpec, Workload};

/// Schema id of `sessions.json`.
pub const SESSIONS_SCHEMA: &str = "treespec-sessions/1";

/// How to play the sessions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionBenchConfig {
    /// The servers, in the order of the report.
    pub servers: Vec<Server>,
    /// The server the session speeds are divided by.
    pub baseline: String,
    /// Sampling sent with every request.
    pub sampling: Sampling,
    /// Sessions played at once on a server.
    pub concurrency: usize,
    /// Plays of every session on every server.
    pub repeat: usize,
    /// One short unrecorded request per server first.
    pub warmup: bool,
    /// The session files.
    pub files: Vec<String>,
}

/// `sessions.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionResults {
    /// [`SESSIONS_SCHEMA`].
    pub schema: String,
    /// Where the client ran (the servers ran on the same machine in the scripts).
    pub machine: MachineInfo,
    /// The settings.
    pub config: SessionBenchConfig,
    /// Sessions played.
    pub sessions: Vec<String>,
    /// Seconds the whole run took.
    pub elapsed_s: f64,
    /// Every request, in the order played.
    pub records: Vec<RequestRecord>,
    /// Sessions that failed (server, session, error): a failed request ends its session.
    pub errors: Vec<String>,
    /// The summary rows.
    pub summary: Vec<SessionRow>,
}

/// Play `sessions` on every server of `config`. With `journal`, every request's record is also
/// appended to that file (JSON lines) as soon as its group is played, so a run stopped early
/// keeps what it measured.
pub fn run_sessions(
    sessions: &[SessionSpec],
    config: &SessionBenchConfig,
    progress: ProgressMode,
    journal: Option<&Path>,
) -> Result<SessionResults> {
    let started = Instant::now();
    let mut machine = MachineInfo::collect(0, Vec::new());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the HTTP client")?;
    let (records, errors) = runtime.block_on(play_all(sessions, config, progress, journal))?;
    machine.load_average_end = load_average();
    let greedy = config.sampling.temperature == 0.0;
    let summary = summarize_sessions(&records, &config.servers, &config.baseline, greedy);
    Ok(SessionResults {
        schema: SESSIONS_SCHEMA.into(),
        machine,
        config: config.clone(),
        sessions: sessions.iter().map(|s| s.id.clone()).collect(),
        elapsed_s: started.elapsed().as_secs_f64(),
        records,
        errors,
        summary,
    })
}

async fn play_all(
    sessions: &[SessionSpec],
    config: &SessionBenchConfig,
    progress: ProgressMode,
    journal: Option<&Path>,
) -> Result<(Vec<RequestRecord>, Vec<String>)> {
    let client = reqwest::Client::builder().build().context("building the HTTP client")?;
    let mut models = Vec::new();
    for s in &config.servers {
        let model = client::model_id(&client, &s.url).await.with_context(|| format!("server {}", s.name))?;
        if config.warmup {
            let body = json!({ "model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8,
                               "temperature": 0.0 });
            client::chat(&client, &s.url, body, "warm-up")
                .await
                .with_context(|| format!("warm-up request to {}", s.name))?;
        }
        models.push(model);
    }
    // Opened once every server has answered: a run that cannot start leaves no file.
    let mut journal = match journal {
        Some(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            }
            Some((
                std::fs::File::create(path).with_context(|| format!("cannot write {}", path.display()))?,
                path,
            ))
        }
        None => None,
    };
    let concurrency = config.concurrency.max(1);
    let groups: Vec<&[SessionSpec]> = sessions.chunks(concurrency).collect();
    let bar = Bar::new(progress, groups.len() * config.servers.len() * config.repeat, sessions, config);
    let (mut records, mut errors) = (Vec::new(), Vec::new());
    for repeat in 0..config.repeat {
        for (g, group) in groups.iter().enumerate() {
            for k in 0..config.servers.len() {
                let i = (g + repeat + k) % config.servers.len();
                let (server, model) = (&config.servers[i], &models[i]);
                bar.message(format!("{} × {}", group.len(), server.name));
                let keep_messages = server.name == config.baseline;
                let player =
                    play::Player { client: &client, server, model, sampling: config.sampling, keep_messages };
                let plays = group.iter().map(|s| player.play(s, repeat));
                for (s, played) in group.iter().zip(futures_util::future::join_all(plays).await) {
                    if let Some((file, path)) = journal.as_mut() {
                        for r in &played.records {
                            writeln!(file, "{}", serde_json::to_string(r)?)
                                .with_context(|| format!("cannot write {}", path.display()))?;
                        }
                    }
                    records.extend(played.records);
                    if let Some(e) = played.error {
                        let line = format!("{} on {}: {e:#}", s.id, server.name);
                        bar.line(format!("[sessions] FAILED {line}"));
                        errors.push(line);
                    }
                }
                bar.done(&format!("group {}/{} on {}", g + 1, groups.len(), server.name));
            }
        }
    }
    bar.finish();
    Ok((records, errors))
}

/// Progress over (group, server, repeat) plays, with an ETA.
struct Bar {
    bar: Option<ProgressBar>,
    log: bool,
}

impl Bar {
    fn new(mode: ProgressMode, total: usize, sessions: &[SessionSpec], config: &SessionBenchConfig) -> Self {
        let bar = progress_bar(mode, total, "plays");
        let log = mode == ProgressMode::Log || (mode == ProgressMode::Auto && bar.is_none());
        let this = Self { bar, log };
        this.line(format!(
            "[sessions] {} sessions × {} servers × {} repeat(s), {} at a time",
            sessions.len(),
            config.servers.len(),
            config.repeat,
            config.concurrency
        ));
        this
    }

    fn message(&self, m: String) {
        if let Some(b) = &self.bar {
            b.set_message(m);
        }
    }

    fn line(&self, line: String) {
        match &self.bar {
            Some(b) => b.println(line),
            None if self.log => eprintln!("{line}"),
            None => {}
        }
    }

    fn done(&self, what: &str) {
        if let Some(b) = &self.bar {
            b.inc(1);
        } else if self.log {
            eprintln!("[sessions] done: {what}");
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// Write `sessions.json`, `summary.md` and `sessions.svg` into `dir`; the paths written.
pub fn write_sessions(dir: &Path, results: &SessionResults) -> Result<Vec<PathBuf>> {
    let names: Vec<String> = results.config.servers.iter().map(|s| s.name.clone()).collect();
    let files = [
        ("sessions.json", serde_json::to_string_pretty(results)? + "\n"),
        ("summary.md", sessions_summary_md(results)),
        ("sessions.svg", chart::sessions_svg(&results.summary, &names, &results.config.baseline)?),
    ];
    crate::report::write_files(dir, &files)
}

/// `summary.md`: the machine, the servers, the table and any failed sessions.
pub fn sessions_summary_md(r: &SessionResults) -> String {
    let m = &r.machine;
    let mut s = format!(
        "# Sessions\n\n{} sessions ({}), {} at a time, {} repeat(s), temperature {}; {} in {:.0} s.\n\n\
         Machine: {} ({}), {} logical CPUs; load average {} → {}.\n\nServers:\n",
        r.sessions.len(),
        r.config.files.join(", "),
        r.config.concurrency,
        r.config.repeat,
        r.config.sampling.temperature,
        r.records.len(),
        r.elapsed_s,
        m.cpu,
        m.simd.join(" "),
        m.logical_cpus,
        m.load_average_start.map_or("?".into(), |l| format!("{l:.2}")),
        m.load_average_end.map_or("?".into(), |l| format!("{l:.2}")),
    );
    for sv in &r.config.servers {
        s += &format!("- `{}`: {}\n", sv.name, sv.url);
    }
    s += "\n";
    s += &sessions_markdown(&r.summary, &r.config.baseline);
    if !r.errors.is_empty() {
        s += &format!("\n## Failed sessions ({})\n\n", r.errors.len());
        for e in &r.errors {
            s += &format!("- {e}\n");
        }
    }
    s
}
