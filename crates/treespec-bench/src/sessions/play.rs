//! Playing one session against one server, as its client would: every assistant turn is generated
//! live and appended to the conversation; an agent applies each answer to its copy of the file and
//! sends the updated file with the next request; a tool loop feeds results back until the model
//! answers in text (at most [`MAX_TOOL_STEPS`] requests a turn).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::client::{chat, Reply, ToolCall};
use super::edits::{agent_message, apply_search_replace, whole_file};
use super::workload::{SessionSpec, SourceFile, Turn, Workload};

/// Requests per tools turn at most (a model that keeps calling tools is cut off).
pub const MAX_TOOL_STEPS: usize = 4;

/// A server under test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Server {
    /// Its name in the report: `family:config`, e.g. `treespec:auto`, `llama:ngram-mod`; a
    /// family's `:plain` server is what its other configurations are divided by.
    pub name: String,
    /// Base URL (`http://127.0.0.1:8080`).
    pub url: String,
}

impl Server {
    /// `family:plain` for `family:anything`.
    pub fn family_plain(&self) -> String {
        format!("{}:plain", self.name.split(':').next().unwrap_or(&self.name))
    }
}

/// How requests are sampled (the same for every server).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// 0: greedy.
    pub temperature: f32,
    /// Seed sent with each request.
    pub seed: u64,
}

/// One request of a session, measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// The server's name.
    pub server: String,
    /// The session.
    pub session: String,
    /// Its workload.
    pub workload: Workload,
    /// The repeat (0-based).
    pub repeat: usize,
    /// The user turn (0-based).
    pub turn: usize,
    /// The request within the turn (tool loops: one per round of tool calls).
    pub step: usize,
    /// Agent turns: whether the answer changed the agent's file (None for other workloads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edit_applied: Option<bool>,
    /// The answer and its measurements.
    pub reply: Reply,
    /// The messages sent (kept for the baseline server only: `scripts/session-copy-bound.py`
    /// rebuilds each prompt from them to bound what copying could have gained).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<Value>>,
}

/// What playing a session left: the records of the requests answered, in order, and the error
/// that ended it early, if one did (a failed request ends its session: the conversation cannot
/// go on without the answer).
pub struct Played {
    /// Every request answered.
    pub records: Vec<RequestRecord>,
    /// Why the session stopped before its last turn.
    pub error: Option<anyhow::Error>,
}

/// Plays sessions on one server.
pub struct Player<'a> {
    /// The HTTP client.
    pub client: &'a reqwest::Client,
    /// The server.
    pub server: &'a Server,
    /// The model id sent with each request.
    pub model: &'a str,
    /// The sampling sent with each request.
    pub sampling: Sampling,
    /// Keep each request's messages in its record.
    pub keep_messages: bool,
}

impl Player<'_> {
    /// Play `spec` (its `repeat`-th play).
    pub async fn play(&self, spec: &SessionSpec, repeat: usize) -> Played {
        let mut records = Vec::new();
        let error = self.play_into(&mut records, spec, repeat).await.err();
        Played { records, error }
    }

    async fn play_into(
        &self,
        records: &mut Vec<RequestRecord>,
        spec: &SessionSpec,
        repeat: usize,
    ) -> anyhow::Result<()> {
        let (client, server, model, sampling) = (self.client, self.server, self.model, self.sampling);
        let mut messages: Vec<Value> =
            spec.system.iter().map(|s| json!({ "role": "system", "content": s })).collect();
        let mut file = spec.file.clone();
        // Each run of a session is its own conversation.
        let session = format!("{}#{repeat}", spec.id);
        for (turn, t) in spec.turns.iter().enumerate() {
            let user = match &file {
                Some(f) if spec.workload.is_agent() => agent_message(&f.path, &f.text, &t.user),
                _ => t.user.clone(),
            };
            // An agent's history keeps its requests and the model's answers; the file itself is sent
            // once, current, with the newest request (as aider orders its chat files after the history).
            let history_user = if spec.workload.is_agent() { t.user.clone() } else { user.clone() };
            let mut request = messages.clone();
            request.push(json!({ "role": "user", "content": user }));
            messages.push(json!({ "role": "user", "content": history_user }));
            for step in 0..MAX_TOOL_STEPS {
                let body = request_body(model, sampling, spec, &request);
                let reply = chat(client, &server.url, body, &session)
                    .await
                    .map_err(|e| e.context(format!("turn {}", turn + 1)))?;
                let edit_applied = file
                    .as_mut()
                    .filter(|_| spec.workload.is_agent())
                    .map(|f| apply_edit(spec.workload, f, &reply));
                let sent = self.keep_messages.then(|| request.clone());
                let calls = reply.tool_calls.clone();
                request.push(reply.message());
                messages.push(reply.message());
                records.push(RequestRecord {
                    server: server.name.clone(),
                    session: spec.id.clone(),
                    workload: spec.workload,
                    repeat,
                    turn,
                    step,
                    edit_applied,
                    reply,
                    messages: sent,
                });
                if calls.is_empty() {
                    break;
                }
                for message in tool_results(t, calls) {
                    request.push(message.clone());
                    messages.push(message);
                }
            }
            // A turn cut off after MAX_TOOL_STEPS still ends with its tool results, so the next user
            // turn follows a well-formed conversation.
        }
        Ok(())
    }
}

/// One chat request's body: the conversation so far, the session's length and tools, the run's
/// sampling.
fn request_body(model: &str, sampling: Sampling, spec: &SessionSpec, request: &[Value]) -> Value {
    let mut body = json!({
        "model": model,
        "messages": request,
        "max_tokens": spec.max_tokens,
        "temperature": sampling.temperature,
        "seed": sampling.seed,
    });
    if !spec.tools.is_empty() {
        body["tools"] = json!(spec.tools);
    }
    body
}

/// An agent's answer applied to its copy of the file (a whole file only from an answer that
/// finished, search/replace blocks from any); whether the file changed.
fn apply_edit(workload: Workload, file: &mut SourceFile, reply: &Reply) -> bool {
    let new_text = match workload {
        Workload::AgentWhole => whole_file(&reply.text).filter(|_| reply.finish_reason == "stop"),
        _ => Some(apply_search_replace(&file.text, &reply.text).text),
    };
    let changed = new_text.as_ref().is_some_and(|n| *n != file.text);
    if let Some(n) = new_text {
        file.text = n;
    }
    changed
}

/// The tool messages answering `calls`: each call's recorded result, or an error naming a tool
/// the session recorded no result for.
fn tool_results(turn: &Turn, calls: Vec<ToolCall>) -> Vec<Value> {
    calls
        .into_iter()
        .map(|call| {
            let result = turn.tool_results.get(&call.name).cloned().unwrap_or_else(|| {
                json!({ "error": format!("no result recorded for {}", call.name) }).to_string()
            });
            json!({ "role": "tool", "tool_call_id": call.id, "content": result })
        })
        .collect()
}
