//! What a gateway reads of a replica's load and cache, under the names it already scrapes
//! (vLLM's: `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`,
//! `vllm:prefix_cache_queries` and `_hits`, in tokens), and whether the conversations sent here
//! were seen here before (`treespec_session_turns_total{seen}`: a gateway that keeps each
//! conversation on its replica makes every turn after the first `known`).
//!
//! `vllm:num_preemptions` is left out: a request keeps its lane until it ends here, so there is
//! nothing to count.

use std::collections::{HashSet, VecDeque};
use std::fmt::Write;

use crate::tenant::Tenant;

/// Per view: the prefix cache and the session turns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheBooks {
    /// Prompt tokens of finished generations (vLLM's prefix-cache queries).
    pub prompt_tokens: u64,
    /// Of those, tokens whose KV was reused (hits).
    pub cached_tokens: u64,
    /// Turns naming a session this replica had not seen (since start, within the memory).
    pub new_sessions: u64,
    /// Turns naming a session it had seen.
    pub known_sessions: u64,
}

impl CacheBooks {
    /// One finished generation's prompt and its reused part.
    pub fn prompt(&mut self, prompt_tokens: usize, cached_tokens: usize) {
        self.prompt_tokens += prompt_tokens as u64;
        self.cached_tokens += cached_tokens.min(prompt_tokens) as u64;
    }
}

/// Sessions remembered per replica (oldest forgotten first).
const REMEMBERED_SESSIONS: usize = 1 << 16;

/// The sessions this replica has seen, per tenant (a key names a conversation of its tenant).
#[derive(Debug, Default)]
pub struct SeenSessions {
    seen: HashSet<(Tenant, u64)>,
    order: VecDeque<(Tenant, u64)>,
}

impl SeenSessions {
    /// Whether `tenant`'s session `key` was seen before; it is remembered from now on.
    pub fn visit(&mut self, tenant: Tenant, key: &str) -> bool {
        let id = (tenant, hash(key));
        if self.seen.contains(&id) {
            return true;
        }
        if self.order.len() == REMEMBERED_SESSIONS {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
        self.seen.insert(id);
        self.order.push_back(id);
        false
    }
}

fn hash(key: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

/// The load a scrape sees now.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub running: usize,
    pub waiting: usize,
    /// KV cells in use and in all (None: a tenant's view, which sees no cells).
    pub cells: Option<(usize, usize)>,
}

/// The gauges and counters, vLLM's labelled with the served model.
pub fn render(s: &mut String, model: &str, load: Load, books: &CacheBooks) {
    let labels = format!("engine=\"0\",model_name=\"{}\"", super::spec_decode::escape(model));
    let mut gauge = |name: &str, help: &str, v: String| {
        let _ = writeln!(s, "# HELP vllm:{name} {help}");
        let _ = writeln!(s, "# TYPE vllm:{name} gauge");
        let _ = writeln!(s, "vllm:{name}{{{labels}}} {v}");
    };
    gauge("num_requests_running", "Number of requests in model execution batches.", load.running.to_string());
    gauge("num_requests_waiting", "Number of requests waiting to be processed.", load.waiting.to_string());
    if let Some((used, total)) = load.cells {
        let usage = if total > 0 { used as f64 / total as f64 } else { 0.0 };
        gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", format!("{usage}"));
    }
    for (name, help, v) in [
        (
            "prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            books.prompt_tokens,
        ),
        ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", books.cached_tokens),
    ] {
        let _ = writeln!(s, "# HELP vllm:{name} {help}");
        let _ = writeln!(s, "# TYPE vllm:{name} counter");
        let _ = writeln!(s, "vllm:{name}_total{{{labels}}} {v}");
    }
    let name = "treespec_session_turns_total";
    let _ =
        writeln!(s, "# HELP {name} Requests naming a session, by whether this replica had seen it before.");
    let _ = writeln!(s, "# TYPE {name} counter");
    let _ = writeln!(s, "{name}{{seen=\"new\"}} {}", books.new_sessions);
    let _ = writeln!(s, "{name}{{seen=\"known\"}} {}", books.known_sessions);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_known_per_tenant_and_forgotten_oldest_first() {
        let mut s = SeenSessions::default();
        let (a, b) = (Tenant::SHARED, Tenant::of_key("k"));
        assert!(!s.visit(a, "chat-1"));
        assert!(s.visit(a, "chat-1"));
        // The same key of another tenant is another conversation.
        assert!(!s.visit(b, "chat-1"));
        for i in 0..REMEMBERED_SESSIONS {
            s.visit(a, &format!("other-{i}"));
        }
        assert!(!s.visit(a, "chat-1"), "the oldest session should be forgotten");
        assert_eq!(s.order.len(), REMEMBERED_SESSIONS);
    }

    #[test]
    fn the_families_render_under_vllms_names() {
        let mut s = String::new();
        let books = CacheBooks { prompt_tokens: 100, cached_tokens: 60, new_sessions: 1, known_sessions: 3 };
        render(&mut s, "m\"x", Load { running: 2, waiting: 5, cells: Some((512, 2048)) }, &books);
        assert!(s.contains("vllm:num_requests_running{engine=\"0\",model_name=\"m\\\"x\"} 2"), "{s}");
        assert!(s.contains("vllm:num_requests_waiting{engine=\"0\",model_name=\"m\\\"x\"} 5"));
        assert!(s.contains("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\\\"x\"} 0.25"));
        assert!(s.contains("vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\\\"x\"} 60"));
        assert!(s.contains("treespec_session_turns_total{seen=\"known\"} 3"));
        let mut t = String::new();
        render(&mut t, "m", Load { running: 0, waiting: 0, cells: None }, &CacheBooks::default());
        assert!(!t.contains("kv_cache_usage_perc"), "a tenant's view has no cells");
    }
}
