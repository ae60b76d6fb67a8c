//! `treespec bench --sessions`: multi-turn sessions played live against two real servers (SmolLM2,
//! plain and suffix), every answer fed back. Checks what the report is built from: every turn
//! reaches every server in order, later turns are served from the prefix cache, the agent's file
//! travels with each request, and a session the server refuses is reported, not lost.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// A server and its URL; killed when dropped.
struct Served {
    child: Child,
    url: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(method: &str) -> Served {
    let model = model().unwrap();
    let model = model.to_str().unwrap();
    let mut child =
        command(&["serve", "-m", model, "--method", method, "--port", "0", "-t", "1", "--ctx", "2048"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
    let mut url = String::new();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines().map_while(Result::ok);
    for line in lines.by_ref() {
        if let Some(at) = line.find("listening on ") {
            url = line[at + "listening on ".len()..].split_whitespace().next().unwrap().to_string();
            break;
        }
    }
    // Keep reading its log, so that a full pipe never blocks the server.
    std::thread::spawn(move || lines.for_each(drop));
    assert!(url.starts_with("http://"), "the server did not start");
    Served { child, url }
}

fn sessions_file(dir: &std::path::Path) -> std::path::PathBuf {
    let function = "def add(a, b):\n    return a + b\n";
    let sessions = [
        json!({"id": "chat/two", "workload": "chat",
               "turns": [{"user": "Name three colours."}, {"user": "Now name three more."}], "max_tokens": 12}),
        json!({"id": "agent-whole/add", "workload": "agent-whole",
               "system": "Reply with the whole updated file in one fenced python block.",
               "file": {"path": "add.py", "text": function},
               "turns": [{"user": "Add a docstring to add."}, {"user": "Rename add to plus."}], "max_tokens": 16}),
        // Longer than the 2,048-token context: refused at its first turn.
        json!({"id": "doc-qa/too-long", "workload": "doc-qa",
               "turns": [{"user": "word ".repeat(3000)}], "max_tokens": 8}),
    ];
    let path = dir.join("sessions.jsonl");
    std::fs::write(&path, sessions.iter().map(|s| s.to_string() + "\n").collect::<String>()).unwrap();
    path
}

#[test]
fn sessions_play_live_on_every_server_and_report_what_they_measured() {
    if model().is_none() {
        return;
    }
    let dir = scratch("sessions-bench");
    let file = sessions_file(&dir);
    let (plain, suffix) = (serve("plain"), serve("suffix"));
    let out = dir.join("out");
    let run = treespec(
        &[
            "bench",
            "--sessions",
            file.to_str().unwrap(),
            "--server",
            &format!("t:plain={}", plain.url),
            "--server",
            &format!("t:suffix={}", suffix.url),
            "--log",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(600),
    );
    // The refused session makes the run fail, after the report is written.
    assert!(run.code == Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("1 session(s) failed") || run.stderr.contains("2 session(s) failed"),
        "{}",
        run.stderr
    );
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("sessions.json")).unwrap()).unwrap();
    let records = results["records"].as_array().unwrap();
    for server in ["t:plain", "t:suffix"] {
        let mine: Vec<&Value> = records.iter().filter(|r| r["server"] == server).collect();
        let turns: Vec<(String, u64)> = mine
            .iter()
            .map(|r| (r["session"].as_str().unwrap().to_string(), r["turn"].as_u64().unwrap()))
            .collect();
        assert_eq!(
            turns,
            // Round-robin over the workloads, in the order of their names.
            [
                ("agent-whole/add".into(), 0),
                ("agent-whole/add".into(), 1),
                ("chat/two".into(), 0),
                ("chat/two".into(), 1),
            ],
            "{server}"
        );
        for r in &mine {
            let reply = &r["reply"];
            assert!(reply["completion_tokens"].as_u64().unwrap() >= 1, "{r}");
            assert!(reply["target_forwards"].as_u64().unwrap() >= 1, "{r}");
            assert!(reply["ttft_s"].as_f64().unwrap() > 0.0, "{r}");
        }
        // The second turn repeats the first turn's conversation: its KV comes from the cache.
        let second_chat = mine[3]["reply"]["cached_tokens"].as_u64().unwrap();
        assert!(second_chat > 10, "{}", mine[3]);
        // The agent's first prompt holds the file.
        let agent_prompt = mine[0]["reply"]["prompt_tokens"].as_u64().unwrap();
        assert!(agent_prompt > mine[2]["reply"]["prompt_tokens"].as_u64().unwrap(), "{}", mine[0]);
        assert!(mine[0]["edit_applied"].is_boolean() && mine[2]["edit_applied"].is_null(), "{}", mine[0]);
    }
    let errors: Vec<&str> =
        results["errors"].as_array().unwrap().iter().map(|e| e.as_str().unwrap()).collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors
            .iter()
            .all(|e| e.starts_with("doc-qa/too-long on t:") && e.contains("context_length_exceeded")),
        "{errors:?}"
    );
    // The journal holds every record, written as the run went.
    let journal = std::fs::read_to_string(out.join("requests.jsonl")).unwrap();
    assert_eq!(journal.lines().count(), records.len());
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("| chat | t:suffix |"), "{summary}");
    assert!(summary.contains("## Failed sessions (2)"), "{summary}");
    assert!(std::fs::read_to_string(out.join("sessions.svg")).unwrap().starts_with("<svg"));
}

#[test]
fn bad_session_flags_are_refused_before_anything_is_sent() {
    let dir = scratch("sessions-flags");
    let file = sessions_file(&dir);
    let f = file.to_str().unwrap();
    let limit = Duration::from_secs(30);
    let run = treespec(&["bench", "--sessions", f, "--server", "nourl"], limit);
    assert!(run.code == Some(1) && run.stderr.contains("expected NAME=URL"), "{}", run.stderr);
    let run =
        treespec(&["bench", "--sessions", f, "--server", "a=http://127.0.0.1:9", "--baseline", "b"], limit);
    assert!(run.code == Some(1) && run.stderr.contains("--baseline b is not one of"), "{}", run.stderr);
    let run = treespec(
        &["bench", "--sessions", f, "--server", "a=http://127.0.0.1:9", "--categories", "poetry"],
        limit,
    );
    assert!(run.code == Some(1) && run.stderr.contains("unknown workload"), "{}", run.stderr);
    // Nothing listens on port 9: the run names the server instead of hanging, and leaves no
    // report behind.
    let out = dir.join("never");
    let run = treespec(
        &["bench", "--sessions", f, "--server", "a=http://127.0.0.1:9", "--out", out.to_str().unwrap()],
        limit,
    );
    assert!(run.code == Some(1) && run.stderr.contains("server a"), "{}", run.stderr);
    assert!(!out.exists());
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"id\": \"x\", \"workload\": \"chat\", \"turns\": []}\n").unwrap();
    let run =
        treespec(&["bench", "--sessions", bad.to_str().unwrap(), "--server", "a=http://127.0.0.1:9"], limit);
    assert!(
        run.code == Some(1) && run.stderr.contains("bad.jsonl:1") && run.stderr.contains("no turns"),
        "{}",
        run.stderr
    );
}
