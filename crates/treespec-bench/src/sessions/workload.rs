//! Session files: JSON lines, one multi-turn session a line (`bench/inputs/sessions/*.jsonl`, built by
//! `scripts/sessions/build.py` from pinned public data).
//!
//! A session holds only what the *user* says; the assistant's turns are generated live by the
//! server under test and fed back, as a client would. Agent sessions also hold the file the agent
//! edits: each turn's request is sent with the agent's current copy of it (see [`super::edits`]).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// What kind of work a session is: it decides how the runner builds requests and applies answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// A coding agent that asks for the whole updated file each turn (aider's `whole` format).
    AgentWhole,
    /// A coding agent that asks for SEARCH/REPLACE blocks (aider's `diff` format).
    AgentSearchReplace,
    /// Multi-turn chat (MT-Bench's two-turn questions).
    Chat,
    /// Function calling over several turns, tool results fed back.
    Tools,
    /// A long document in the first turn and questions about it.
    DocQa,
}

impl Workload {
    /// The name used in session files and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AgentWhole => "agent-whole",
            Self::AgentSearchReplace => "agent-search-replace",
            Self::Chat => "chat",
            Self::Tools => "tools",
            Self::DocQa => "doc-qa",
        }
    }

    /// Agent workloads edit a file.
    pub fn is_agent(self) -> bool {
        matches!(self, Self::AgentWhole | Self::AgentSearchReplace)
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The file an agent session edits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceFile {
    /// Its path, as the agent names it to the model.
    pub path: String,
    /// Its text before the first turn.
    pub text: String,
}

/// One user turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// What the user says (for agent sessions: the change request; the file is added).
    pub user: String,
    /// Tools sessions: the result fed back when the model calls a function, by function name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tool_results: BTreeMap<String, String>,
}

/// One session of a session file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionSpec {
    /// Unique: `<workload>/<name>`.
    pub id: String,
    /// How requests are built and answers applied.
    pub workload: Workload,
    /// Where the data came from.
    #[serde(default)]
    pub source: String,
    /// The pin of the artifact it came from.
    #[serde(default)]
    pub sha256: String,
    /// The system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Agent sessions: the file being edited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<SourceFile>,
    /// Tools sessions: OpenAI tool declarations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<serde_json::Value>,
    /// The user's turns, in order.
    pub turns: Vec<Turn>,
    /// Most tokens per answer.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
}

fn default_max_tokens() -> usize {
    192
}

impl SessionSpec {
    /// What the runner needs of a session, checked before anything is sent.
    fn check(&self) -> Result<()> {
        if self.turns.is_empty() {
            bail!("session {} has no turns", self.id);
        }
        if self.max_tokens == 0 {
            bail!("session {}: max_tokens must be at least 1", self.id);
        }
        if self.workload.is_agent() && self.file.is_none() {
            bail!("session {} is an agent session ({}) without a `file`", self.id, self.workload);
        }
        if self.workload == Workload::Tools && self.tools.is_empty() {
            bail!("session {} is a tools session without `tools`", self.id);
        }
        Ok(())
    }
}

/// Read every session of `paths`, in file order; ids must be unique across them.
pub fn load_sessions(paths: &[impl AsRef<Path>]) -> Result<Vec<SessionSpec>> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for path in paths {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading session file {}", path.display()))?;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let where_ = || format!("{}:{}", path.display(), i + 1);
            let spec: SessionSpec =
                serde_json::from_str(line).with_context(|| format!("{}: not a session", where_()))?;
            spec.check().with_context(where_)?;
            if !seen.insert(spec.id.clone()) {
                bail!("{}: session id {} appears twice", where_(), spec.id);
            }
            out.push(spec);
        }
    }
    if out.is_empty() {
        bail!(
            "no sessions in {}",
            paths.iter().map(|p| p.as_ref().display().to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(out)
}

/// Which sessions to play: only these workloads, at most `per_workload` of each (in file order),
/// at most `limit` in all (taken round-robin over the workloads).
pub fn select_sessions(
    all: &[SessionSpec],
    workloads: Option<&[Workload]>,
    per_workload: Option<usize>,
    limit: Option<usize>,
) -> Result<Vec<SessionSpec>> {
    let mut groups: BTreeMap<Workload, Vec<&SessionSpec>> = BTreeMap::new();
    for s in all {
        if workloads.is_none_or(|w| w.contains(&s.workload)) {
            let g = groups.entry(s.workload).or_default();
            if per_workload.is_none_or(|n| g.len() < n) {
                g.push(s);
            }
        }
    }
    let mut out = Vec::new();
    let longest = groups.values().map(Vec::len).max().unwrap_or(0);
    'fill: for i in 0..longest {
        for g in groups.values() {
            if limit.is_some_and(|n| out.len() >= n) {
                break 'fill;
            }
            if let Some(s) = g.get(i) {
                out.push((*s).clone());
            }
        }
    }
    if out.is_empty() {
        bail!("the selection matches no session");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(id: &str, workload: &str, extra: &str) -> String {
        format!(r#"{{"id":"{id}","workload":"{workload}","turns":[{{"user":"hi"}}]{extra}}}"#)
    }

    fn load(lines: &[String]) -> Result<Vec<SessionSpec>> {
        let dir =
            std::env::temp_dir().join(format!("treespec-sessions-{}-{}", std::process::id(), lines.len()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("s{}.jsonl", lines.iter().map(String::len).sum::<usize>()));
        std::fs::write(&path, lines.join("\n")).unwrap();
        load_sessions(&[path])
    }

    #[test]
    fn loads_and_checks_sessions() {
        let ok = load(&[line("chat/a", "chat", ""), line("chat/b", "chat", r#","max_tokens":7"#)]).unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(ok[0].max_tokens, 192);
        assert_eq!(ok[1].max_tokens, 7);
        let dup = load(&[line("chat/a", "chat", ""), line("chat/a", "chat", "")]).unwrap_err();
        assert!(format!("{dup:#}").contains("appears twice"), "{dup:#}");
        let agent = load(&[line("agent-whole/x", "agent-whole", "")]).unwrap_err();
        assert!(format!("{agent:#}").contains("without a `file`"), "{agent:#}");
        let unknown = load(&[line("x/y", "poetry", "")]).unwrap_err();
        assert!(format!("{unknown:#}").contains(":1: not a session"), "{unknown:#}");
    }

    #[test]
    fn selection_round_robins_over_workloads() {
        let spec = |id: &str, w| SessionSpec {
            id: id.into(),
            workload: w,
            source: String::new(),
            sha256: String::new(),
            system: None,
            file: None,
            tools: Vec::new(),
            turns: vec![Turn { user: "q".into(), tool_results: BTreeMap::new() }],
            max_tokens: 8,
        };
        let all = vec![
            spec("c1", Workload::Chat),
            spec("c2", Workload::Chat),
            spec("c3", Workload::Chat),
            spec("d1", Workload::DocQa),
        ];
        let ids = |v: Vec<SessionSpec>| v.into_iter().map(|s| s.id).collect::<Vec<_>>();
        assert_eq!(ids(select_sessions(&all, None, None, Some(3)).unwrap()), ["c1", "d1", "c2"]);
        assert_eq!(ids(select_sessions(&all, None, Some(1), None).unwrap()), ["c1", "d1"]);
        assert_eq!(ids(select_sessions(&all, Some(&[Workload::DocQa]), None, None).unwrap()), ["d1"]);
        assert!(select_sessions(&all, Some(&[Workload::Tools]), None, None).is_err());
    }
}
