//! Prometheus text exposition, by hand: counters and histograms behind one mutex (updates are a
//! few per request and per generation, never per token).
//!
//! Throughput: `treespec_tokens_per_second{method}` is a gauge over every completed generation
//! (tokens / generation seconds since start); for a windowed rate use
//! `rate(treespec_completion_tokens_total[5m]) / rate(treespec_generation_seconds_total[5m])`.

mod gateway_load;
mod histogram;
mod spec_decode;

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use treespec_core::stats::DecodeStats;
use treespec_engine::shared_draft::DraftCounters;

use self::gateway_load::{CacheBooks, Load, SeenSessions};
use crate::tenant::Tenant;

/// The `status` label of an answer begun after its client had closed its side: nginx's 499,
/// "client closed request", so that `treespec_requests_total` counts what clients received apart
/// from what went to clients that had left.
pub const CLIENT_CLOSED: u16 = 499;

pub use histogram::Histogram;
pub use spec_decode::SpecDecode;

/// Per-method generation totals.
#[derive(Debug, Clone)]
struct MethodTotals {
    generations: u64,
    cancelled: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
    seconds: f64,
    target_forwards: u64,
    /// Draft-model forwards (0 for model-free methods).
    draft_forwards: u64,
    /// Target rows verified: drafted nodes plus one root row per forward.
    target_rows: u64,
    /// (reached, accepted) per depth.
    depth: Vec<(u64, u64)>,
    /// Per request: tokens emitted per target forward.
    accepted_length: Histogram,
    /// Per request: target rows per forward.
    rows_per_forward: Histogram,
}

impl Default for MethodTotals {
    fn default() -> Self {
        Self {
            generations: 0,
            cancelled: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            seconds: 0.0,
            target_forwards: 0,
            draft_forwards: 0,
            target_rows: 0,
            depth: Vec::new(),
            accepted_length: Histogram::new(histogram::ACCEPTED_LENGTH),
            rows_per_forward: Histogram::new(histogram::ROWS),
        }
    }
}

#[derive(Debug)]
struct Inner {
    /// (endpoint, status) → count.
    requests: BTreeMap<(String, u16), u64>,
    /// kind → count.
    errors: BTreeMap<String, u64>,
    methods: BTreeMap<String, MethodTotals>,
    in_flight: i64,
    /// Request arrival → first generated text.
    ttft: Histogram,
    /// Request arrival → generation finished.
    latency: Histogram,
    /// Batched steps: requests decoding per step, rows per forward, prompt tokens prefilled.
    batch_lanes: Histogram,
    batch_rows: Histogram,
    batch_steps: u64,
    prefilled_tokens: u64,
    /// Seconds in batched steps, and in their forwards.
    step_seconds: f64,
    forward_seconds: f64,
    /// The shared draft model's forwards.
    draft: DraftCounters,
    /// vLLM's and llama-server's speculative-decoding counters.
    spec: SpecDecode,
    /// The served model's id (vLLM's `model_name` label).
    model_name: String,
    /// The prefix cache and the session turns.
    cache: CacheBooks,
    /// KV cells the live requests hold, and all of them (server-wide only).
    cells: (usize, usize),
    /// Bytes of KV prefixes kept in host memory (`--cache-ram`; server-wide only).
    saved_prefix_bytes: usize,
    /// Forwards of the shared context that reused the graph before (server-wide only; None where
    /// the backend does not count).
    graph_reuses: Option<u64>,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            requests: BTreeMap::new(),
            errors: BTreeMap::new(),
            methods: BTreeMap::new(),
            in_flight: 0,
            ttft: Histogram::new(histogram::SECONDS),
            latency: Histogram::new(histogram::SECONDS),
            batch_lanes: Histogram::new(histogram::ROWS),
            batch_rows: Histogram::new(histogram::ROWS),
            batch_steps: 0,
            prefilled_tokens: 0,
            step_seconds: 0.0,
            forward_seconds: 0.0,
            draft: DraftCounters::default(),
            spec: SpecDecode::default(),
            model_name: String::new(),
            cache: CacheBooks::default(),
            cells: (0, 0),
            saved_prefix_bytes: 0,
            graph_reuses: None,
        }
    }
}

/// Whose figures a `/metrics` scrape reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// Everything, server-wide: the operator's (`--metrics-key`, `--metrics-open`, or a server
    /// without keys, where everybody is one tenant).
    Server,
    /// One tenant's own requests and nothing else: every other tenant's activity stays out, so
    /// two scrapes around another tenant's request read nothing of it (docs/SECURITY.md).
    Tenant(Tenant),
}

/// The books: server-wide, and the same per tenant for what belongs to one request.
#[derive(Debug, Default)]
struct Books {
    server: Inner,
    tenants: BTreeMap<Tenant, Inner>,
    sessions: SeenSessions,
}

impl Books {
    /// The server's books and, for a request with a tenant, that tenant's (made on first use;
    /// tenants come from the configured keys, so the map is bounded by them).
    fn each(&mut self, tenant: Option<Tenant>, mut f: impl FnMut(&mut Inner)) {
        f(&mut self.server);
        if let Some(t) = tenant {
            f(self.tenants.entry(t).or_default());
        }
    }
}

/// The server's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Books>,
    /// While this machine's cost curves are measured in the background: the method that stands
    /// in for the cost-aware default meanwhile.
    stand_in: Mutex<Option<String>>,
    /// The curves in use are provisional: measured while the cores stayed busy past the bounded
    /// wait, refined by the requests, not cached.
    provisional: std::sync::atomic::AtomicBool,
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Books) -> R) -> R {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// Record `f` server-wide and in `tenant`'s books.
    fn record(&self, tenant: Option<Tenant>, f: impl FnMut(&mut Inner)) {
        self.with(|b| b.each(tenant, f));
    }

    /// One batched step of `step` seconds: `lanes` requests decoded a step in one forward of
    /// `rows` rows and `forward` seconds, which also prefilled `prefilled` prompt tokens.
    /// Server-wide only: a step holds every tenant's rows.
    pub fn batch_step(&self, lanes: usize, rows: usize, prefilled: usize, step: Duration, forward: Duration) {
        self.with(|b| {
            let m = &mut b.server;
            m.batch_steps += 1;
            m.step_seconds += step.as_secs_f64();
            m.forward_seconds += forward.as_secs_f64();
            m.prefilled_tokens += prefilled as u64;
            m.batch_lanes.observe(lanes as f64);
            m.batch_rows.observe(rows as f64);
        });
    }

    /// The shared draft model's forwards so far (server-wide).
    pub fn draft_forwards(&self, counters: DraftCounters) {
        self.with(|b| b.server.draft = counters);
    }

    /// The cost curves are being measured and `method` serves meanwhile (None: measured).
    pub fn measuring_costs(&self, method: Option<&str>) {
        *self.stand_in.lock().unwrap_or_else(|p| p.into_inner()) = method.map(String::from);
    }

    /// Whether the measured curves in use are provisional (see [`Metrics::provisional`]).
    pub fn costs_provisional(&self, provisional: bool) {
        self.provisional.store(provisional, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the cost curves in use are provisional.
    pub fn provisional(&self) -> bool {
        self.provisional.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The method standing in for the default while the cost curves are measured, if they are.
    pub fn stand_in(&self) -> Option<String> {
        self.stand_in.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// One answered HTTP request, of `tenant` when it carried a tenant's key.
    /// `status` is the HTTP status sent, or [`CLIENT_CLOSED`] for an answer begun after its
    /// client had closed its side (it was not received, or not as a normal answer).
    pub fn request(&self, tenant: Option<Tenant>, endpoint: &str, status: u16) {
        self.record(tenant, |m| *m.requests.entry((endpoint.to_string(), status)).or_default() += 1);
        // A client that left is not an error of the request, nor of the server.
        if status >= 400 && status != CLIENT_CLOSED {
            self.error(tenant, if status >= 500 { "server" } else { "client" });
        }
    }

    /// One error of `kind`.
    pub fn error(&self, tenant: Option<Tenant>, kind: &str) {
        self.record(tenant, |m| *m.errors.entry(kind.to_string()).or_default() += 1);
    }

    /// A request of `tenant` arrived naming session `key` (if any): a turn of a conversation this
    /// replica has seen, or a new one.
    pub fn session_turn(&self, tenant: Tenant, key: Option<&str>) {
        let Some(key) = key else { return };
        self.with(|b| {
            let known = b.sessions.visit(tenant, key);
            b.each(Some(tenant), |m| match known {
                true => m.cache.known_sessions += 1,
                false => m.cache.new_sessions += 1,
            });
        });
    }

    /// The KV cells the live requests hold now, all of them, the bytes of finished requests'
    /// prefixes kept in host memory, and the shared context's forwards that reused the graph of
    /// the one before (after every batched step).
    pub fn set_context_figures(
        &self,
        used: usize,
        total: usize,
        saved_prefix_bytes: usize,
        graph_reuses: Option<u64>,
    ) {
        self.with(|b| {
            b.server.cells = (used, total);
            b.server.saved_prefix_bytes = saved_prefix_bytes;
            b.server.graph_reuses = graph_reuses;
        });
    }

    /// The KV cells the live requests hold, and all of them (0, 0 before the first step).
    pub fn kv_cells(&self) -> (usize, usize) {
        self.with(|b| b.server.cells)
    }

    /// A generation of `tenant` started (+1) or ended (−1).
    pub fn in_flight(&self, tenant: Tenant, delta: i64) {
        self.record(Some(tenant), |m| m.in_flight += delta);
    }

    /// Generations running now: all of them, or one tenant's.
    pub fn generations_in_flight(&self, view: View) -> usize {
        self.with(|b| match view {
            View::Server => b.server.in_flight.max(0) as usize,
            View::Tenant(t) => b.tenants.get(&t).map_or(0, |m| m.in_flight.max(0) as usize),
        })
    }

    /// The served model's id, for the labels that carry it.
    pub fn set_model_name(&self, name: &str) {
        self.with(|b| b.server.model_name = name.to_string());
    }

    /// A finished generation of `tenant`: its method, its prompt's tokens and how many of them
    /// were reused from the prefix cache, its statistics.
    pub fn generation(&self, tenant: Tenant, method: &str, prompt: (usize, usize), stats: &DecodeStats) {
        let (prompt_tokens, cached_tokens) = prompt;
        self.record(Some(tenant), |m| {
            m.cache.prompt(prompt_tokens, cached_tokens);
            let t = m.methods.entry(method.to_string()).or_default();
            t.generations += 1;
            t.prompt_tokens += prompt_tokens as u64;
            t.completion_tokens += stats.new_tokens;
            t.seconds += stats.wall.as_secs_f64();
            t.target_forwards += stats.target_forwards;
            t.draft_forwards += stats.draft_forwards;
            let rows = stats.drafted + stats.target_forwards;
            t.target_rows += rows;
            if stats.target_forwards > 0 {
                let f = stats.target_forwards as f64;
                t.accepted_length.observe(stats.new_tokens as f64 / f);
                t.rows_per_forward.observe(rows as f64 / f);
            }
            if t.depth.len() < stats.per_depth.len() {
                t.depth.resize(stats.per_depth.len(), (0, 0));
            }
            for (acc, d) in t.depth.iter_mut().zip(&stats.per_depth) {
                acc.0 += d.reached;
                acc.1 += d.accepted;
            }
            m.spec.record(stats);
        });
    }

    /// A generation of `tenant` cancelled because its client went away (`queued`: before it
    /// started).
    pub fn cancelled(&self, tenant: Tenant, method: &str) {
        self.record(Some(tenant), |m| m.methods.entry(method.to_string()).or_default().cancelled += 1);
    }

    /// Time from a request's arrival to its first generated text.
    pub fn first_token(&self, tenant: Tenant, d: Duration) {
        self.record(Some(tenant), |m| m.ttft.observe(d.as_secs_f64()));
    }

    /// Time from a request's arrival to the end of its generation.
    pub fn finished(&self, tenant: Tenant, d: Duration) {
        self.record(Some(tenant), |m| m.latency.observe(d.as_secs_f64()));
    }

    /// The server-wide Prometheus text, with the current queue depth.
    pub fn render_server(&self, queue_depth: usize) -> String {
        self.render(View::Server, queue_depth)
    }

    /// The Prometheus text `view` may read, with its queue depth (the whole queue's, or the
    /// tenant's own waiting requests). A tenant's text has the per-request families only: the
    /// batched steps and the shared draft model hold every tenant's rows.
    pub fn render(&self, view: View, queue_depth: usize) -> String {
        let measuring = self.stand_in().is_some();
        self.with(|b| {
            let empty = Inner::default();
            let m = match view {
                View::Server => &b.server,
                View::Tenant(t) => b.tenants.get(&t).unwrap_or(&empty),
            };
            let model_name = &b.server.model_name;
            let mut s = String::new();
            head(
                &mut s,
                "treespec_cost_curve_measuring",
                "gauge",
                "1 while this machine's cost curves are measured.",
            );
            let _ = writeln!(s, "treespec_cost_curve_measuring {}", u8::from(measuring));
            head(
                &mut s,
                "treespec_cost_curve_provisional",
                "gauge",
                "1 while the curves in use were measured on busy cores (refined as requests run, not cached).",
            );
            let _ = writeln!(s, "treespec_cost_curve_provisional {}", u8::from(self.provisional()));
            render_requests(&mut s, m, queue_depth);
            render_methods(&mut s, m);
            render_request_histograms(&mut s, m);
            if view == View::Server {
                render_steps(&mut s, m);
            }
            m.spec.render(&mut s, model_name);
            let load = Load {
                running: m.in_flight.max(0) as usize,
                waiting: queue_depth,
                cells: (view == View::Server).then_some(b.server.cells),
            };
            gateway_load::render(&mut s, model_name, load, &m.cache);
            s
        })
    }
}

/// HELP and TYPE lines.
fn head(s: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(s, "# HELP {name} {help}");
    let _ = writeln!(s, "# TYPE {name} {kind}");
}

/// Requests, errors, queue, in flight.
fn render_requests(s: &mut String, m: &Inner, queue_depth: usize) {
    head(s, "treespec_requests_total", "counter", "HTTP requests by endpoint and status.");
    for ((e, st), n) in &m.requests {
        let _ = writeln!(s, "treespec_requests_total{{endpoint=\"{e}\",status=\"{st}\"}} {n}");
    }
    head(s, "treespec_errors_total", "counter", "Errors by kind (client = 4xx, server = 5xx).");
    for (k, n) in &m.errors {
        let _ = writeln!(s, "treespec_errors_total{{kind=\"{k}\"}} {n}");
    }
    head(s, "treespec_queue_depth", "gauge", "Requests waiting for the model.");
    let _ = writeln!(s, "treespec_queue_depth {queue_depth}");
    head(s, "treespec_generations_in_flight", "gauge", "Generations running now.");
    let _ = writeln!(s, "treespec_generations_in_flight {}", m.in_flight);
}

/// Per-method counters and gauges, and the acceptance rate per depth.
fn render_methods(s: &mut String, m: &Inner) {
    type Field = fn(&MethodTotals) -> String;
    let per_method: [(&str, &str, &str, Field); 11] = [
        ("treespec_generations_total", "counter", "Finished generations by method.", |t| {
            t.generations.to_string()
        }),
        ("treespec_cancelled_total", "counter", "Generations cancelled by a disconnect.", |t| {
            t.cancelled.to_string()
        }),
        ("treespec_prompt_tokens_total", "counter", "Prompt tokens processed.", |t| {
            t.prompt_tokens.to_string()
        }),
        ("treespec_completion_tokens_total", "counter", "Tokens generated.", |t| {
            t.completion_tokens.to_string()
        }),
        ("treespec_generation_seconds_total", "counter", "Wall time spent generating.", |t| {
            format!("{:.6}", t.seconds)
        }),
        ("treespec_target_forwards_total", "counter", "Target forwards (decode steps).", |t| {
            t.target_forwards.to_string()
        }),
        (
            "treespec_draft_forwards_total",
            "counter",
            "Draft-model forwards (0 for model-free drafts).",
            |t| t.draft_forwards.to_string(),
        ),
        (
            "treespec_target_rows_total",
            "counter",
            "Target rows verified (drafted nodes + 1 per forward).",
            |t| t.target_rows.to_string(),
        ),
        ("treespec_rows_per_forward", "gauge", "Mean target rows per forward (batch rows per step).", |t| {
            let f = t.target_forwards;
            format!("{:.4}", if f > 0 { t.target_rows as f64 / f as f64 } else { 0.0 })
        }),
        ("treespec_tokens_per_second", "gauge", "Generated tokens per generation second.", |t| {
            format!("{:.3}", if t.seconds > 0.0 { t.completion_tokens as f64 / t.seconds } else { 0.0 })
        }),
        ("treespec_mean_accepted_length", "gauge", "Mean tokens emitted per target forward.", |t| {
            let f = t.target_forwards;
            format!("{:.4}", if f > 0 { t.completion_tokens as f64 / f as f64 } else { 0.0 })
        }),
    ];
    for (name, kind, help, field) in per_method {
        head(s, name, kind, help);
        for (method, t) in &m.methods {
            let _ = writeln!(s, "{name}{{method=\"{method}\"}} {}", field(t));
        }
    }
    let name = "treespec_depth_acceptance_rate";
    head(s, name, "gauge", "Conditional acceptance rate at each tree depth.");
    for (method, t) in &m.methods {
        for (i, (reached, accepted)) in t.depth.iter().enumerate() {
            let rate = if *reached > 0 { *accepted as f64 / *reached as f64 } else { 0.0 };
            let _ = writeln!(
                s,
                "treespec_depth_acceptance_rate{{method=\"{method}\",depth=\"{}\"}} {rate:.4}",
                i + 1
            );
        }
    }
}

/// Per-request histograms: time to first token and latency (all requests), acceptance and rows
/// per forward (by method).
fn render_request_histograms(s: &mut String, m: &Inner) {
    let whole: [(&str, &str, &Histogram); 2] = [
        (
            "treespec_time_to_first_token_seconds",
            "Seconds from a generation request's arrival to its first generated text.",
            &m.ttft,
        ),
        (
            "treespec_request_duration_seconds",
            "Seconds from a generation request's arrival to its end (finished ones).",
            &m.latency,
        ),
    ];
    for (name, help, h) in whole {
        head(s, name, "histogram", help);
        h.render(s, name, "");
    }
    type Pick = fn(&MethodTotals) -> &Histogram;
    let per_method: [(&str, &str, Pick); 2] = [
        ("treespec_request_mean_accepted_length", "Per request: tokens emitted per target forward.", |t| {
            &t.accepted_length
        }),
        (
            "treespec_request_rows_per_forward",
            "Per request: target rows (drafted nodes + 1) verified per forward.",
            |t| &t.rows_per_forward,
        ),
    ];
    for (name, help, pick) in per_method {
        head(s, name, "histogram", help);
        for (method, t) in &m.methods {
            pick(t).render(s, name, &format!("method=\"{method}\""));
        }
    }
}

/// The batched steps and the shared draft model (server-wide: every tenant's rows).
fn render_steps(s: &mut String, m: &Inner) {
    let steps: [(&str, &str, &Histogram); 2] = [
        (
            "treespec_batch_size",
            "Per batched step: requests that decoded a step in its forward.",
            &m.batch_lanes,
        ),
        (
            "treespec_batch_rows",
            "Per batched step: rows in its forward (prompt chunks and draft trees).",
            &m.batch_rows,
        ),
    ];
    for (name, help, h) in steps {
        head(s, name, "histogram", help);
        h.render(s, name, "");
    }
    head(s, "treespec_batch_steps_total", "counter", "Batched steps (one forward each).");
    let _ = writeln!(s, "treespec_batch_steps_total {}", m.batch_steps);
    head(s, "treespec_prefill_tokens_total", "counter", "Prompt tokens prefilled by batched steps.");
    let _ = writeln!(s, "treespec_prefill_tokens_total {}", m.prefilled_tokens);
    head(
        s,
        "treespec_prefix_cache_bytes",
        "gauge",
        "Bytes of finished requests' KV prefixes kept in host memory for later turns (--cache-ram).",
    );
    let _ = writeln!(s, "treespec_prefix_cache_bytes {}", m.saved_prefix_bytes);
    if let Some(n) = m.graph_reuses {
        head(
            s,
            "treespec_graph_reuses_total",
            "counter",
            "Forwards of the shared context that reused the computation graph of the forward before \
             (llama.cpp's n_reused; on a GPU a replay; see --pad-shapes).",
        );
        let _ = writeln!(s, "treespec_graph_reuses_total {n}");
    }
    let seconds: [(&str, &str, f64); 2] = [
        ("treespec_batch_step_seconds_total", "Wall time of batched steps.", m.step_seconds),
        (
            "treespec_batch_forward_seconds_total",
            "Of which in their target forwards (the rest: proposing, verifying, settling).",
            m.forward_seconds,
        ),
    ];
    for (name, help, v) in seconds {
        head(s, name, "counter", help);
        let _ = writeln!(s, "{name} {v:.3}");
    }
    let draft: [(&str, &str, u64); 3] = [
        (
            "treespec_shared_draft_forwards_total",
            "Batched forwards of the shared draft model.",
            m.draft.forwards,
        ),
        (
            "treespec_shared_draft_feeds_total",
            "Request feeds those forwards held (feeds / forwards = requests per draft forward).",
            m.draft.feeds,
        ),
        ("treespec_shared_draft_rows_total", "Rows those forwards held.", m.draft.rows),
    ];
    for (name, help, v) in draft {
        head(s, name, "counter", help);
        let _ = writeln!(s, "{name} {v}");
    }
}

/// One generation request's clock, from its arrival: records the time to its first text and
/// its latency, each once.
#[derive(Debug)]
pub struct RequestTimer {
    metrics: Arc<Metrics>,
    tenant: Tenant,
    arrived: Instant,
    first_seen: bool,
}

impl RequestTimer {
    /// `tenant`'s request, started at `arrived`.
    pub fn new(metrics: Arc<Metrics>, tenant: Tenant, arrived: Instant) -> Self {
        Self { metrics, tenant, arrived, first_seen: false }
    }

    /// Generated text arrived (only the first call counts).
    pub fn text(&mut self) {
        if !std::mem::replace(&mut self.first_seen, true) {
            self.metrics.first_token(self.tenant, self.arrived.elapsed());
        }
    }

    /// The generation finished.
    pub fn done(&mut self) {
        self.metrics.finished(self.tenant, self.arrived.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use treespec_core::stats::DepthCounts;

    #[test]
    fn renders_counters_and_rates() {
        let m = Metrics::default();
        m.request(None, "/v1/chat/completions", 200);
        m.request(None, "/v1/chat/completions", 400);
        let stats = DecodeStats {
            new_tokens: 10,
            target_forwards: 4,
            per_depth: vec![DepthCounts { reached: 4, accepted: 3 }, DepthCounts { reached: 3, accepted: 1 }],
            wall: Duration::from_secs(2),
            ..Default::default()
        };
        m.generation(Tenant::SHARED, "chain", (5, 0), &stats);
        m.draft_forwards(DraftCounters { forwards: 2, feeds: 7, rows: 9 });
        let text = m.render_server(3);
        // One HELP per metric name: a name reused by two metrics breaks the exposition.
        let helps: Vec<&str> = text.lines().filter(|l| l.starts_with("# HELP ")).collect();
        let names: std::collections::BTreeSet<&str> =
            helps.iter().filter_map(|l| l.split_whitespace().nth(2)).collect();
        assert_eq!(names.len(), helps.len(), "a metric name declared twice in\n{text}");
        for line in [
            "treespec_shared_draft_feeds_total 7",
            "treespec_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"} 1",
            "treespec_errors_total{kind=\"client\"} 1",
            "treespec_queue_depth 3",
            "treespec_completion_tokens_total{method=\"chain\"} 10",
            "treespec_tokens_per_second{method=\"chain\"} 5.000",
            "treespec_mean_accepted_length{method=\"chain\"} 2.5000",
            "treespec_depth_acceptance_rate{method=\"chain\",depth=\"2\"} 0.3333",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
    }

    /// Sample lines by series name (the part before `{` or the space).
    fn samples(text: &str) -> Vec<(String, String, f64)> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let (series, value) = l.rsplit_once(' ').expect("name value");
                let (name, labels) = series.split_once('{').unwrap_or((series, ""));
                (name.to_string(), labels.trim_end_matches('}').to_string(), value.parse().expect("number"))
            })
            .collect()
    }

    #[test]
    fn exposition_parses_with_help_type_and_monotone_buckets() {
        let m = Metrics::default();
        let stats = DecodeStats {
            new_tokens: 12,
            target_forwards: 4,
            drafted: 20,
            wall: Duration::from_secs(1),
            ..Default::default()
        };
        m.generation(Tenant::SHARED, "tree", (3, 0), &stats);
        m.first_token(Tenant::SHARED, Duration::from_millis(30));
        m.finished(Tenant::SHARED, Duration::from_millis(700));
        let text = m.render_server(2);
        let mut declared = BTreeMap::new();
        for l in text.lines().filter(|l| l.starts_with('#')) {
            let parts: Vec<&str> = l.splitn(4, ' ').collect();
            assert!(parts.len() == 4 && (parts[1] == "HELP" || parts[1] == "TYPE"), "bad comment {l}");
            if parts[1] == "TYPE" {
                assert!(["counter", "gauge", "histogram"].contains(&parts[3]), "{l}");
                assert!(text.contains(&format!("# HELP {} ", parts[2])), "no HELP for {}", parts[2]);
                declared.insert(parts[2].to_string(), parts[3].to_string());
            }
        }
        let hists = [
            "treespec_time_to_first_token_seconds",
            "treespec_request_duration_seconds",
            "treespec_request_mean_accepted_length",
            "treespec_request_rows_per_forward",
        ];
        for h in hists {
            assert_eq!(declared.get(h).map(String::as_str), Some("histogram"), "{h}");
        }
        let all = samples(&text);
        for (name, _, _) in &all {
            let base = name.trim_end_matches("_bucket").trim_end_matches("_sum").trim_end_matches("_count");
            // A counter family may be named without its samples' `_total` (as vLLM's are).
            let counter = declared.get(name.trim_end_matches("_total")).is_some_and(|k| k == "counter");
            assert!(
                declared.contains_key(name) || declared.contains_key(base) || counter,
                "undeclared {name}"
            );
        }
        for h in hists {
            let buckets: Vec<_> = all.iter().filter(|(n, ..)| *n == format!("{h}_bucket")).collect();
            let count = all.iter().find(|(n, ..)| *n == format!("{h}_count")).expect("count").2;
            assert!(buckets.windows(2).all(|w| w[0].2 <= w[1].2), "{h} buckets not monotone");
            let last = buckets.last().expect("buckets");
            assert!(last.1.ends_with("le=\"+Inf\"") && last.2 == count && count == 1.0, "{h}: {last:?}");
        }
        let value = |name: &str| all.iter().find(|(n, ..)| n == name).map(|x| x.2);
        assert_eq!(value("treespec_target_rows_total"), Some(24.0));
        assert_eq!(value("treespec_rows_per_forward"), Some(6.0));
        assert_eq!(value("treespec_queue_depth"), Some(2.0));
        let le = |h: &str, le: &str| {
            all.iter().find(|(n, l, _)| n == h && l.ends_with(&format!("le=\"{le}\""))).map(|x| x.2)
        };
        assert_eq!(le("treespec_time_to_first_token_seconds_bucket", "0.025"), Some(0.0));
        assert_eq!(le("treespec_time_to_first_token_seconds_bucket", "0.05"), Some(1.0));
        assert_eq!(le("treespec_request_mean_accepted_length_bucket", "3"), Some(1.0));
        assert_eq!(le("treespec_request_mean_accepted_length_bucket", "2.5"), Some(0.0));
    }
}
