//! The prompt's token count in `generate --json` and `bench --dump-prompts` (issue #68): what a
//! side-by-side run checks llama.cpp's tools read as well, on the real binary and model.

mod common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(120);

/// `generate --json`'s `stats.prompt_tokens` for `PROMPT` (with `--chat` when asked).
fn prompt_tokens(m: &str, prompt: &str, chat: bool) -> u64 {
    let mut args = vec!["generate", "-m", m, "-p", prompt, "-n", "1", "-t", "1", "--temp", "0", "--json"];
    if chat {
        args.push("--chat");
    }
    let out = treespec_json(&args, LIMIT);
    out["stats"]["prompt_tokens"].as_u64().unwrap_or_else(|| panic!("no stats.prompt_tokens: {out}"))
}

#[test]
fn generate_and_dump_prompts_count_the_tokens_the_target_reads() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let question = "Name three prime numbers.";
    // A trailing newline is one token more: the token llama.cpp's `-f` drops.
    let bare = prompt_tokens(m, "Hello", false);
    assert!(bare >= 1);
    assert_eq!(prompt_tokens(m, "Hello\n", false), bare + 1);
    // The chat-formatted prompt, as `generate --chat` reads it, is the one `bench --dump-prompts`
    // writes out and counts (the text the side-by-side runs feed llama.cpp's tools).
    let chat = prompt_tokens(m, question, true);
    assert!(chat > prompt_tokens(m, question, false));
    let dir = scratch("prompt-tokens");
    let prompts = dir.join("prompts.jsonl");
    let dumped = dir.join("formatted.jsonl");
    let line = serde_json::json!({ "question_id": 7, "category": "qa", "turns": [question] });
    std::fs::write(&prompts, format!("{line}\n")).unwrap();
    let run = treespec(
        &[
            "bench",
            "-m",
            m,
            "--prompts",
            prompts.to_str().unwrap(),
            "--dump-prompts",
            dumped.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert!(run.exited_cleanly() && run.code == Some(0), "{run:#?}");
    let text = std::fs::read_to_string(&dumped).unwrap();
    let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(line["prompt_tokens"].as_u64(), Some(chat), "{line}");
    // It ends in the newline after the assistant's header: the one a prompt file must keep.
    assert!(line["text"].as_str().unwrap().ends_with('\n'), "{line}");
    std::fs::remove_dir_all(&dir).ok();
}
