//! `treespec serve` loads each model file once, even with a default method that needs both the
//! tokenizer fingerprint and the measured cost curves (`auto` with a suffix history file): it used
//! to load the target three times. Read from serve's own log line, then the server is stopped.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

const LIMIT: Duration = Duration::from_secs(180);

/// Start `treespec serve` with `draft`, read its stderr until it listens (or exits), stop it, and
/// return the log.
fn serve_log(model: &Path, draft: &Path, dir: &Path) -> String {
    let (model, draft, history) = (model.to_str().unwrap(), draft.to_str().unwrap(), dir.join("history.bin"));
    let args = ["serve", "-m", model, "--draft", draft, "--method", "auto", "--suffix-history"];
    let mut child = command(&args)
        .args([history.to_str().unwrap(), "--port", "0", "-t", "1", "--ctx", "512"])
        .env("TREESPEC_CACHE_DIR", dir.join("cache"))
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let child = Arc::new(Mutex::new(child));
    let done = Arc::new(AtomicBool::new(false));
    // A server that never gets to listening is killed at the time limit.
    let watchdog = {
        let (child, done) = (child.clone(), done.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            while !done.load(Ordering::SeqCst) && start.elapsed() < LIMIT {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.lock().unwrap().kill();
        })
    };
    let mut log = String::new();
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        log.push_str(&line);
        log.push('\n');
        if line.contains("listening on") {
            break;
        }
    }
    done.store(true, Ordering::SeqCst);
    watchdog.join().unwrap();
    let _ = child.lock().unwrap().wait();
    log
}

#[test]
fn serve_loads_each_model_file_once() {
    let Some(model) = model() else { return };
    let dir = scratch("serve-loads");
    let log = serve_log(&model, &model, &dir);
    assert!(log.contains("listening on"), "{log}");
    assert!(log.contains("treespec serve: 1 model file(s) loaded"), "{log}");

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
