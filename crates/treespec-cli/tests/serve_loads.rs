//! `treespec serve` loads each model file once, even with a default method that needs both the
//! tokenizer fingerprint and the measured cost curves (`auto` with a suffix history file): it used
//! to load the target three times. Read from serve's own log line, then the server is stopped.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

const LIMIT: Duration = Duration::from_secs(180);

/// Read `child`'s stderr until the server listens: the log up to there, and the rest of the
/// stream. A server that never gets there is killed at the time limit, so the read ends instead
/// of hanging the test.
fn until_listening(child: &mut Child) -> (String, impl Iterator<Item = String>) {
    let pid = child.id().to_string();
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let done = done.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            while !done.load(Ordering::SeqCst) && start.elapsed() < LIMIT {
                std::thread::sleep(Duration::from_millis(50));
            }
            if !done.load(Ordering::SeqCst) {
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
            }
        })
    };
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines().map_while(Result::ok);
    let mut log = String::new();
    for line in lines.by_ref() {
        log.push_str(&line);
        log.push('\n');
        if line.contains("listening on") {
            break;
        }
    }
    done.store(true, Ordering::SeqCst);
    watchdog.join().unwrap();
    (log, lines)
}

/// Start `treespec serve` with `draft`, read its log until it listens (or exits), stop it, and
/// return the log.
fn serve_log(model: &Path, draft: &Path, dir: &Path) -> String {
    let (model, draft, history) = (model.to_str().unwrap(), draft.to_str().unwrap(), dir.join("history.bin"));
    let args = ["serve", "-m", model, "--draft", draft, "--method", "auto", "--suffix-history"];
    let mut child = command(&args)
        .args([history.to_str().unwrap(), "--port", "0", "-t", "1", "--ctx", "512"])
        .env("TREESPEC_CACHE_DIR", dir.join("cache"))
        .env_remove("TREESPEC_COSTS")
        .spawn()
        .unwrap();
    let (log, _) = until_listening(&mut child);
    let _ = child.kill();
    let _ = child.wait();
    log
}

#[test]
fn serve_loads_each_model_file_once() {
    let Some(model) = model() else { return };
    let dir = scratch("serve-loads");
    let log = serve_log(&model, &model, &dir);
    assert!(log.contains("listening on"), "{log}");
    assert!(log.contains("treespec serve: 1 model file(s) loaded"), "{log}");
    // A fresh cache: the server listens first and measures the cost curves in the background.
    assert!(log.contains("cost curves in the background"), "{log}");

    // A second file (hard link, else copy): two loads, no more. Named like the target, so a hard
    // link finds the target's cached curve.
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let other = other.join(model.file_name().unwrap());
    if std::fs::hard_link(&model, &other).is_err() {
        std::fs::copy(&model, &other).unwrap();
    }
    let log = serve_log(&model, &other, &dir);
    assert!(log.contains("treespec serve: 2 model file(s) loaded"), "{log}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// The head of a chat request (the rest of the head is [`open_request`]'s).
const CHAT_HEAD: &str = "POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json";

/// One chat request over a plain TCP connection (HTTP/1.1, `Connection: close`), with `extra`
/// fields in the body; the response.
fn chat_with(addr: &str, content: &str, extra: serde_json::Value) -> String {
    let mut body = serde_json::json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 16,
        "temperature": 0
    });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    http(addr, CHAT_HEAD, &body.to_string())
}

/// Start `treespec serve` on SmolLM2 with `flags` (a fresh cost cache in `dir`, measured in the
/// background), send one chat request (`extra` fields added), then SIGTERM it as a service
/// manager does: it must exit cleanly and say it saved the suffix history.
fn serve_ask_and_stop(dir: &Path, flags: &[&str], content: &str, extra: serde_json::Value) {
    let model = model().expect("the model");
    let args = ["serve", "-m", model.to_str().unwrap(), "--port", "0", "-t", "1", "--ctx", "1024"];
    let mut child = command(&args)
        .args(flags)
        .env("TREESPEC_CACHE_DIR", dir.join("cache"))
        .env_remove("TREESPEC_COSTS")
        .spawn()
        .unwrap();
    let (log, lines) = until_listening(&mut child);
    let addr =
        log.split("listening on http://").nth(1).map(str::trim).expect("the server listens").to_owned();
    let answer = chat_with(&addr, content, extra);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let killed =
        std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let rest: Vec<String> = lines.collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}: {rest:?}");
    assert!(rest.iter().any(|l| l.contains("saved the suffix history")), "{rest:?}");
}

#[test]
fn serve_saves_the_suffix_history_at_shutdown_and_generate_drafts_from_it() {
    let Some(model) = model() else { return };
    let dir = scratch("serve-history");
    let history = dir.join("history.bin");
    let (m, h) = (model.to_str().unwrap(), history.to_str().unwrap());
    let request = "Repeat after me: the quick brown fox jumps over the lazy dog.";
    serve_ask_and_stop(&dir, &["--method", "suffix", "--suffix-history", h], request, serde_json::json!({}));
    assert!(std::fs::metadata(&history).unwrap().len() > 0);

    // The CLI loads the server's history (a malformed or foreign file would be an error).
    let run = treespec(
        &[
            "generate",
            "-m",
            m,
            "--method",
            "suffix",
            "--suffix-history",
            h,
            "-p",
            "the quick brown",
            "-n",
            "4",
        ],
        LIMIT,
    );
    assert!(run.exited_cleanly() && run.code == Some(0), "{run:#?}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Issue #29 row 4: a `--method plain` server with `--suffix-history` still saves the history a
/// request asking for `suffix` added, at SIGTERM.
#[test]
fn a_plain_server_saves_what_suffix_requests_added() {
    if model().is_none() {
        return;
    }
    let dir = scratch("serve-plain-history");
    let history = dir.join("history.bin");
    let h = history.to_str().unwrap();
    let method = serde_json::json!({"treespec": {"method": "suffix", "budget": 8}});
    serve_ask_and_stop(
        &dir,
        &["--method", "plain", "--suffix-history", h],
        "Repeat after me: the quick brown fox.",
        method,
    );
    assert!(std::fs::metadata(&history).unwrap().len() > 0);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A request sent on a fresh connection (`head` is its request line and any headers of its own;
/// `Host`, `Content-Length` and `Connection: close` are added), the connection to read it from.
fn open_request(addr: &str, head: &str, body: &str) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(LIMIT)).unwrap();
    let head =
        format!("{head}\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    s
}

/// One HTTP/1.1 request on a fresh connection; the whole response.
fn http(addr: &str, head: &str, body: &str) -> String {
    use std::io::Read;
    let mut out = String::new();
    open_request(addr, head, body).read_to_string(&mut out).unwrap();
    out
}

/// SIGTERM with a request in flight (issue #42): the server drains — `/health` answers 503, a new
/// request gets a retryable 503 a gateway sends elsewhere — while the streamed answer in flight
/// runs to its end; then it exits cleanly.
#[test]
fn sigterm_drains_the_request_in_flight_then_stops() {
    use std::io::Read;
    let Some(model) = model() else { return };
    let dir = scratch("serve-drain");
    let args = ["serve", "-m", model.to_str().unwrap(), "--port", "0", "-t", "1", "--ctx", "1024"];
    let mut child = command(&args)
        .args(["--method", "plain", "--drain", "60"])
        .env("TREESPEC_CACHE_DIR", dir.join("cache"))
        .spawn()
        .unwrap();
    let (log, lines) = until_listening(&mut child);
    let addr =
        log.split("listening on http://").nth(1).map(str::trim).expect("the server listens").to_owned();
    // A long streamed answer: read its first bytes, then stop the server under it.
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": "Count from 1 to 300, one number per line."}],
        "max_tokens": 300, "temperature": 0, "stream": true
    })
    .to_string();
    let mut s = open_request(&addr, CHAT_HEAD, &body);
    let mut first = [0u8; 512];
    let n = s.read(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    // Draining: unready, and a new request is refused retryably.
    let deadline = Instant::now() + Duration::from_secs(10);
    let health = loop {
        let h = http(&addr, "GET /health HTTP/1.1", "");
        if h.starts_with("HTTP/1.1 503") || Instant::now() > deadline {
            break h;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(health.starts_with("HTTP/1.1 503") && health.contains("draining"), "{health}");
    let refused =
        http(&addr, CHAT_HEAD, r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}"#);
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.contains("\"draining\"") && refused.to_ascii_lowercase().contains("retry-after"),
        "{refused}"
    );
    // The answer in flight runs to its end.
    let mut rest = String::new();
    s.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("data: [DONE]"), "the streamed answer was cut: {rest}");
    let tail: Vec<String> = lines.collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}: {tail:?}");
    assert!(tail.iter().any(|l| l.contains("treespec serve: drained")), "{tail:?}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A published llama-server command line starts treespec with the same meaning (issue #65):
/// `-c 8192 -fa on -ctk q8_0 -ctv q8_0 -np 4 --jinja -a mymodel` (and `-ngl 99` where the build
/// has a GPU backend; on a CPU build it is refused, as llama.cpp's tools' GPU flags are here).
/// The alias is the model's name on /v1/models and in answers; `-n` caps a request; the flags
/// treespec does not take are refused with what to do instead.
#[test]
fn a_llama_server_command_line_starts_and_serves_with_the_same_meaning() {
    let Some(model) = model() else { return };
    let dir = scratch("serve-llama-flags");
    let m = model.to_str().unwrap();
    let flags =
        ["-c", "8192", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "-np", "4", "--jinja", "-a", "mymodel"];
    let mut child = command(&["serve", "-m", m])
        .args(flags)
        .args(["-n", "5", "-cb", "--metrics", "--slots", "--port", "0", "-t", "1", "--method", "plain"])
        .env("TREESPEC_CACHE_DIR", dir.join("cache"))
        .spawn()
        .unwrap();
    let (log, _lines) = until_listening(&mut child);
    let addr = log
        .split("listening on http://")
        .nth(1)
        .map(str::trim)
        .expect("the server listens: {log}")
        .to_owned();
    let models = http(&addr, "GET /v1/models HTTP/1.1", "");
    assert!(models.contains("\"id\":\"mymodel\""), "{models}");
    let answer = http(
        &addr,
        CHAT_HEAD,
        r#"{"model": "mymodel", "messages": [{"role": "user", "content": "Count to 50."}], "temperature": 0}"#,
    );
    let body: serde_json::Value =
        serde_json::from_str(&answer[answer.find("\r\n\r\n").unwrap() + 4..]).unwrap();
    assert_eq!(body["model"], "mymodel", "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 5, "-n 5 caps a request that sets no max_tokens: {body}");
    let slots = http(&addr, "GET /slots HTTP/1.1", "");
    assert!(slots.starts_with("HTTP/1.1 200"), "{slots}");
    assert_eq!(slots.matches("\"id\"").count(), 4, "-np 4 slots: {slots}");
    let _ = child.kill();
    let _ = child.wait();
    for (flag, needle) in
        [("-hf", "-m FILE"), ("--embedding", "text generation only"), ("--mmproj", "multimodal")]
    {
        let run = treespec(&["serve", "-m", m, flag, "x", "--port", "0"], LIMIT);
        assert_eq!(run.code, Some(2), "{run:#?}");
        assert!(run.stderr.contains(needle), "{flag}: {run:#?}");
    }
    let run = treespec(&["serve", "-m", m, "-fa", "off", "-ctv", "q8_0", "--port", "0", "-t", "1"], LIMIT);
    assert!(run.stderr.contains("needs flash attention"), "{run:#?}");
    // The server's sampling defaults are checked at start as a request's fields are.
    let run = treespec(&["serve", "-m", m, "--top-p", "1.5", "--port", "0", "-t", "1"], LIMIT);
    assert!(run.stderr.contains("--top-p") && run.code == Some(1), "{run:#?}");
    std::fs::remove_dir_all(dir).unwrap();
}
