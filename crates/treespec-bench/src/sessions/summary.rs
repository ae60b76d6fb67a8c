//! Session results by (workload, server), and over all workloads.
//!
//! Definitions (a group is one server's requests in one workload, or in all):
//!
//! - `turn1_tokens_per_s` / `later_tokens_per_s`: the median over the group's requests of the
//!   client-side decode speed (tokens after the first ÷ seconds from the first to the last; for a
//!   reply held back and sent in one burst, as tool calls are, the server's own generating time:
//!   `client::Reply`), for first turns and for turns 2 and later. `…_vs_plain`: that median ÷
//!   the same median of the server's family plain (`llama:plain` for `llama:ngram-mod`), over the
//!   same sessions.
//! - `session_tokens_per_s`: the median over session runs of Σ tokens ÷ Σ request time (time to
//!   first token + decode, every request of the session): what a user waits for a whole session.
//!   `session_vs_baseline`: ÷ the baseline server's.
//! - `ttft_ms`: median time to first token; `cached_share`: Σ prompt tokens served from the
//!   server's prefix cache ÷ Σ prompt tokens (null when the server does not say), and
//!   `later_cached_share` the same over turns 2 and later (what keeping a conversation where its
//!   cache is decides; a first turn shares at most the system prompt with anything);
//!   `tokens_per_forward`: Σ tokens ÷ Σ target forwards (null when the server does not say).
//! - `edits_applied`: agent turns whose answer changed the agent's file.
//! - `retried`: requests the client had to send again (a replica died, a gateway answered 5xx:
//!   `client::RETRIES`); they count as answered, their lost time in their TTFT.
//! - `identical_to_plain`: requests whose answer (text and tool calls, ids aside) equals the family plain's
//!   answer to the same request (temperature 0 only); once an answer differs the conversations
//!   differ, so the later turns of that session are not compared.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use super::play::{RequestRecord, Server};
use crate::summary::median;

/// One (workload, server) row; workload `all` pools every workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRow {
    /// Workload name or `all`.
    pub workload: String,
    /// Server name.
    pub server: String,
    /// Requests in the group.
    pub requests: usize,
    /// Median decode tokens/s of first-turn requests.
    pub turn1_tokens_per_s: Option<f64>,
    /// Median decode tokens/s of later-turn requests.
    pub later_tokens_per_s: Option<f64>,
    /// ÷ the family plain's, first turns.
    pub turn1_vs_plain: Option<f64>,
    /// ÷ the family plain's, later turns.
    pub later_vs_plain: Option<f64>,
    /// Median over session runs of tokens ÷ (time to first token + decode).
    pub session_tokens_per_s: Option<f64>,
    /// ÷ the baseline server's.
    pub session_vs_baseline: Option<f64>,
    /// Median time to first token.
    pub ttft_ms: Option<f64>,
    /// Σ cached prompt tokens ÷ Σ prompt tokens.
    pub cached_share: Option<f64>,
    /// The same over turns 2 and later.
    #[serde(default)]
    pub later_cached_share: Option<f64>,
    /// Σ tokens ÷ Σ target forwards.
    pub tokens_per_forward: Option<f64>,
    /// Agent turns that changed the file, of agent turns.
    pub edits_applied: Option<(usize, usize)>,
    /// Requests answered as the family plain answered, of requests compared.
    pub identical_to_plain: Option<(usize, usize)>,
    /// Requests sent again after a failure.
    #[serde(default)]
    pub retried: usize,
}

/// Σ cached ÷ Σ prompt tokens over `group` (None when a request did not say).
fn cached_share<'a>(group: impl Iterator<Item = &'a &'a RequestRecord> + Clone) -> Option<f64> {
    let prompt: usize = group.clone().map(|r| r.reply.prompt_tokens).sum();
    let cached: Option<Vec<usize>> = group.map(|r| r.reply.cached_tokens).collect();
    cached.filter(|_| prompt > 0).map(|c| c.iter().sum::<usize>() as f64 / prompt as f64)
}

fn med(v: Vec<f64>) -> Option<f64> {
    (!v.is_empty()).then(|| median(&v))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// Rates of one group before the ratios are taken.
fn rates(group: &[&RequestRecord]) -> (Option<f64>, Option<f64>, Option<f64>) {
    let decode = |later: bool| {
        med(group
            .iter()
            .filter(|r| (r.turn > 0) == later)
            .filter_map(|r| r.reply.decode_tokens_per_s())
            .collect())
    };
    let mut sessions: BTreeMap<(&str, usize), (f64, f64)> = BTreeMap::new();
    for r in group {
        let s = sessions.entry((r.session.as_str(), r.repeat)).or_default();
        s.0 += r.reply.completion_tokens as f64;
        s.1 += r.reply.total_s;
    }
    let session = med(sessions.values().filter(|(_, t)| *t > 0.0).map(|(n, t)| n / t).collect());
    (decode(false), decode(true), session)
}

/// Answers equal to the family plain's, stopping at each session's first difference.
fn identical(group: &[&RequestRecord], plain: &[&RequestRecord]) -> (usize, usize) {
    let key = |r: &RequestRecord| (r.session.clone(), r.repeat, r.turn, r.step);
    let reference: BTreeMap<_, _> = plain.iter().map(|r| (key(r), *r)).collect();
    let (mut same, mut compared) = (0, 0);
    let mut diverged: HashSet<(String, usize)> = HashSet::new();
    for r in group {
        if diverged.contains(&(r.session.clone(), r.repeat)) {
            continue;
        }
        let Some(p) = reference.get(&key(r)) else { continue };
        compared += 1;
        // Calls compare by function and arguments: each server draws its own call ids.
        let calls = |r: &RequestRecord| {
            r.reply.tool_calls.iter().map(|c| (c.name.clone(), c.arguments.clone())).collect::<Vec<_>>()
        };
        if p.reply.text == r.reply.text && calls(p) == calls(r) {
            same += 1;
        } else {
            diverged.insert((r.session.clone(), r.repeat));
        }
    }
    (same, compared)
}

/// The summary rows: per workload then `all`, servers in the order given.
pub fn summarize_sessions(
    records: &[RequestRecord],
    servers: &[Server],
    baseline: &str,
    greedy: bool,
) -> Vec<SessionRow> {
    let mut workloads: Vec<String> = records.iter().map(|r| r.workload.to_string()).collect();
    workloads.sort();
    workloads.dedup();
    workloads.push("all".into());
    let mut rows = Vec::new();
    for w in &workloads {
        let of = |server: &str| -> Vec<&RequestRecord> {
            records
                .iter()
                .filter(|r| r.server == server && (w == "all" || r.workload.as_str() == w))
                .collect()
        };
        let base = rates(&of(baseline));
        for s in servers {
            let group = of(&s.name);
            if group.is_empty() {
                continue;
            }
            let plain_name = s.family_plain();
            let plain = of(&plain_name);
            let (t1, later, session) = rates(&group);
            let (p1, plater, _) = if plain.is_empty() { (None, None, None) } else { rates(&plain) };
            let forwards: Vec<(usize, u64)> = group
                .iter()
                .filter_map(|r| r.reply.target_forwards.map(|f| (r.reply.completion_tokens, f)))
                .collect();
            let edits: Vec<bool> = group.iter().filter_map(|r| r.edit_applied).collect();
            let fwd: u64 = forwards.iter().map(|f| f.1).sum();
            rows.push(SessionRow {
                workload: w.clone(),
                server: s.name.clone(),
                requests: group.len(),
                turn1_tokens_per_s: t1,
                later_tokens_per_s: later,
                turn1_vs_plain: ratio(t1, p1),
                later_vs_plain: ratio(later, plater),
                session_tokens_per_s: session,
                session_vs_baseline: ratio(session, base.2),
                ttft_ms: med(group.iter().map(|r| r.reply.ttft_s * 1e3).collect()),
                cached_share: cached_share(group.iter()),
                later_cached_share: cached_share(group.iter().filter(|r| r.turn > 0)),
                tokens_per_forward: (fwd > 0)
                    .then(|| forwards.iter().map(|f| f.0).sum::<usize>() as f64 / fwd as f64),
                edits_applied: (!edits.is_empty())
                    .then(|| (edits.iter().filter(|&&e| e).count(), edits.len())),
                identical_to_plain: (greedy && !plain.is_empty() && plain_name != s.name)
                    .then(|| identical(&group, &plain)),
                retried: group.iter().filter(|r| r.reply.retries > 0).count(),
            });
        }
    }
    rows
}

fn opt(v: Option<f64>, digits: usize, suffix: &str) -> String {
    v.map_or("–".into(), |x| format!("{x:.digits$}{suffix}"))
}

fn frac(v: Option<(usize, usize)>) -> String {
    v.map_or("–".into(), |(a, b)| format!("{a}/{b}"))
}

/// The summary as a Markdown table (one row per workload and server).
pub fn sessions_markdown(rows: &[SessionRow], baseline: &str) -> String {
    let mut s = String::from(
        "| workload | server | decode tok/s, turn 1 / later | ÷ its plain, turn 1 / later | session tok/s (with TTFT) \
         | ÷ baseline | TTFT ms | prompt cached, all / later turns | tokens/forward | edits applied | same as its plain |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        s += &format!(
            "| {} | {} | {} / {} | {} / {} | {} | {} | {} | {} / {} | {} | {} | {} |\n",
            r.workload,
            r.server,
            opt(r.turn1_tokens_per_s, 1, ""),
            opt(r.later_tokens_per_s, 1, ""),
            opt(r.turn1_vs_plain, 2, "×"),
            opt(r.later_vs_plain, 2, "×"),
            opt(r.session_tokens_per_s, 1, ""),
            opt(r.session_vs_baseline, 2, "×"),
            opt(r.ttft_ms, 0, ""),
            opt(r.cached_share.map(|c| c * 100.0), 0, "%"),
            opt(r.later_cached_share.map(|c| c * 100.0), 0, "%"),
            opt(r.tokens_per_forward, 2, ""),
            frac(r.edits_applied),
            frac(r.identical_to_plain),
        );
    }
    let retried: Vec<String> = rows
        .iter()
        .filter(|r| r.workload == "all" && r.retried > 0)
        .map(|r| format!("{} {}", r.server, r.retried))
        .collect();
    if !retried.is_empty() {
        s += &format!("\nRequests the client sent again after a failure: {}.\n", retried.join(", "));
    }
    s += &format!("\nBaseline: `{baseline}`. Definitions: `treespec_bench::sessions::summary`.\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sessions::client::Reply;
    use crate::sessions::workload::Workload;

    fn rec(
        server: &str,
        session: &str,
        turn: usize,
        tokens: usize,
        decode_s: f64,
        text: &str,
    ) -> RequestRecord {
        RequestRecord {
            server: server.into(),
            session: session.into(),
            workload: Workload::Chat,
            repeat: 0,
            turn,
            step: 0,
            edit_applied: None,
            reply: Reply {
                text: text.into(),
                completion_tokens: tokens,
                prompt_tokens: 100,
                cached_tokens: Some(if turn > 0 { 50 } else { 0 }),
                target_forwards: Some(tokens as u64 / 2),
                ttft_s: 0.5,
                decode_s,
                total_s: 0.5 + decode_s,
                finish_reason: "stop".into(),
                ..Default::default()
            },
            messages: None,
        }
    }

    #[test]
    fn the_same_calls_under_other_ids_are_the_same_answer() {
        let call = |id: &str, args: &str| crate::sessions::client::ToolCall {
            id: id.into(),
            name: "ls".into(),
            arguments: args.into(),
        };
        let with = |server: &str, calls: Vec<crate::sessions::client::ToolCall>| {
            let mut r = rec(server, "a", 0, 11, 1.0, "");
            r.reply.tool_calls = calls;
            r
        };
        let plain = [with("t:plain", vec![call("call_1", "{}")])];
        let same = [with("t:auto", vec![call("call_2", "{}")])];
        let other = [with("t:auto", vec![call("call_1", "{\"a\":1}")])];
        let more = [with("t:auto", vec![call("call_2", "{}"), call("call_3", "{}")])];
        assert_eq!(identical(&[&same[0]], &[&plain[0]]), (1, 1));
        assert_eq!(identical(&[&other[0]], &[&plain[0]]), (0, 1));
        assert_eq!(identical(&[&more[0]], &[&plain[0]]), (0, 1));
    }

    #[test]
    fn ratios_follow_the_family_plain_and_the_baseline() {
        let servers: Vec<Server> = ["t:plain", "t:auto"]
            .iter()
            .map(|n| Server { name: n.to_string(), url: String::new() })
            .collect();
        let mut records = vec![
            rec("t:plain", "a", 0, 11, 1.0, "x"),
            rec("t:plain", "a", 1, 11, 1.0, "y"),
            rec("t:auto", "a", 0, 11, 0.5, "x"),
            rec("t:auto", "a", 1, 11, 0.25, "z"),
        ];
        records[3].reply.retries = 1;
        let rows = summarize_sessions(&records, &servers, "t:plain", true);
        let auto = rows.iter().find(|r| r.workload == "chat" && r.server == "t:auto").unwrap();
        assert_eq!((auto.turn1_tokens_per_s, auto.later_tokens_per_s), (Some(20.0), Some(40.0)));
        assert_eq!((auto.turn1_vs_plain, auto.later_vs_plain), (Some(2.0), Some(4.0)));
        // 22 tokens over 1.75 s against 22 over 3 s.
        assert!((auto.session_vs_baseline.unwrap() - 3.0 / 1.75).abs() < 1e-9);
        assert_eq!(auto.cached_share, Some(0.25));
        assert_eq!(auto.later_cached_share, Some(0.5), "the second turn alone");
        assert_eq!((auto.retried, rows.iter().find(|r| r.server == "t:plain").unwrap().retried), (1, 0));
        assert_eq!(auto.tokens_per_forward, Some(2.2));
        assert_eq!(auto.identical_to_plain, Some((1, 2)));
        let plain = rows.iter().find(|r| r.server == "t:plain").unwrap();
        assert_eq!(plain.identical_to_plain, None);
        assert!(rows.iter().any(|r| r.workload == "all"));
        let md = sessions_markdown(&rows, "t:plain");
        assert!(md.contains("| chat | t:auto | 20.0 / 40.0 | 2.00× / 4.00× |"), "{md}");
        assert!(md.contains("| 25% / 50% |"), "{md}");
        assert!(md.contains("sent again after a failure: t:auto 1."), "{md}");
    }
}
