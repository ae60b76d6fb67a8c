//! The model runtime shared by the CLI, the benchmark and the server (`treespec_llama::runtime`):
//! one load per file, prompts identical to the model's own helpers, the tokenizer fingerprint and
//! the cost curves derived once (the curves cached on disk, `reprofile` honoured).

mod common;

use std::path::PathBuf;

use common::{model_path, skip_model_tests, test_options};
use treespec_core::cost::CostCurve;
use treespec_llama::{tokenizer_id, ModelPaths, ModelRuntime};
use treespec_request::{tagged_calls, Prompt};
use treespec_text::ChatMessage;

fn runtime(with_draft: bool) -> ModelRuntime {
    let p = model_path();
    let draft = with_draft.then(|| p.clone());
    ModelRuntime::load(ModelPaths::new(p, draft), test_options()).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("treespec-runtime-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn runtime_shares_the_target_weights_with_a_same_file_draft() {
    if skip_model_tests("runtime_shares_the_target_weights_with_a_same_file_draft") {
        return;
    }
    let rt = runtime(true);
    assert!(rt.has_draft());
    assert!(std::ptr::eq(rt.draft().unwrap(), rt.target()), "the same file must not load twice");
    assert_eq!(rt.options(), rt.target().options());
    let t = rt.target();
    let mut eos: Vec<u32> = [t.eos(), t.eot()].into_iter().flatten().collect();
    eos.dedup();
    assert_eq!(rt.eos_tokens(), &eos[..]);
    assert!(!eos.is_empty());

    let alone = runtime(false);
    assert!(!alone.has_draft() && alone.draft().is_none());
}

#[test]
fn runtime_prompts_are_the_model_prompt_helpers() {
    if skip_model_tests("runtime_prompts_are_the_model_prompt_helpers") {
        return;
    }
    let rt = runtime(false);
    let m = rt.target();
    let text = "What is 2 + 2?<|im_end|>";
    assert_eq!(rt.prompt_tokens(Prompt::Text(text)).unwrap(), m.text_prompt(text).unwrap());
    assert_eq!(rt.prompt_tokens(Prompt::text_or_user(text, false)).unwrap(), m.text_prompt(text).unwrap());
    let template = m.compiled_chat_template().unwrap();
    let user = [ChatMessage::new("user", text)];
    let chat = m.chat_prompt(&template, &user, None).unwrap();
    assert_eq!(rt.prompt_tokens(Prompt::User(text)).unwrap(), chat);
    assert_eq!(rt.prompt_tokens(Prompt::text_or_user(text, true)).unwrap(), chat);
    assert_eq!(rt.prompt_tokens(Prompt::Messages(&user)).unwrap(), chat);
    // Token text goes through the target's vocabulary, special tokens rendered as nothing.
    use treespec_engine::TokenBytes;
    let bytes: Vec<u8> =
        m.text_prompt("hello world").unwrap().iter().flat_map(|&t| rt.token_bytes().token_bytes(t)).collect();
    assert_eq!(String::from_utf8(bytes).unwrap(), "hello world");
}

#[test]
fn runtime_fingerprint_matches_the_free_function() {
    if skip_model_tests("runtime_fingerprint_matches_the_free_function") {
        return;
    }
    let rt = runtime(false);
    let id = tokenizer_id(rt.target()).unwrap();
    assert_eq!(rt.tokenizer_id().unwrap(), id);
    assert_eq!(rt.tokenizer_id().unwrap(), id, "cached");
    assert_eq!(id.vocab as usize, rt.target().vocab_size());
}

/// The one file the cost cache holds under `dir`.
fn cache_file(dir: &std::path::Path) -> PathBuf {
    let files: Vec<PathBuf> =
        std::fs::read_dir(dir.join("costs")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

#[test]
fn runtime_cost_curves_are_cached_and_reprofile_ignores_the_disk_cache() {
    if skip_model_tests("runtime_cost_curves_are_cached_and_reprofile_ignores_the_disk_cache") {
        return;
    }
    let dir = scratch("costs");
    let rt = runtime(true).with_cost_cache_dir(Some(dir.clone()));
    let first = rt.cost_model(true, false).unwrap();
    // A draft on the target's weights shares the target's curve (profiled once).
    assert_eq!(first.draft.as_ref(), Some(&first.target));
    let file = cache_file(&dir);

    // Replace the cached curve with a made-up one: this runtime holds its curve in memory…
    let fake = CostCurve::linear(100.0, 1.0, 64).unwrap();
    let mut cached: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    cached["curve"] = serde_json::to_value(&fake).unwrap();
    std::fs::write(&file, cached.to_string()).unwrap();
    assert_eq!(rt.cost_model(true, false).unwrap().target, first.target);

    // …a new one reads the disk cache, without the draft when not asked…
    let rt = runtime(false).with_cost_cache_dir(Some(dir.clone()));
    let read = rt.cost_model(false, false).unwrap();
    assert_eq!((read.target, read.draft), (fake.clone(), None));

    // …and `reprofile` measures anew (once per runtime), replacing the file.
    let fresh = rt.cost_model(false, true).unwrap().target;
    assert_ne!(fresh, fake);
    assert_eq!(rt.cost_model(false, true).unwrap().target, fresh, "profiled once per runtime");
    assert_eq!(rt.cost_model(false, false).unwrap().target, fresh);
    let rewritten: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let rewritten: CostCurve = serde_json::from_value(rewritten["curve"].clone()).unwrap();
    assert!((rewritten.ms(1) - fresh.ms(1)).abs() < 1e-9, "the file holds the fresh profile");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Under `tool_choice: "auto"` an answer that opens a ```json fence is one declared call: on a
/// real vocabulary the opening is found, the envelope comes out as forced tokens, a name no tool
/// has is refused, and text that does not open a call stays free.
#[test]
fn an_answer_that_opens_a_json_fence_is_decoded_as_a_declared_call() {
    if skip_model_tests("an_answer_that_opens_a_json_fence_is_decoded_as_a_declared_call") {
        return;
    }
    let rt = runtime(false);
    let m = rt.target();
    let tools = treespec_grammar::ToolFunction::from_openai_tools(&serde_json::json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    ]))
    .unwrap();
    let (c, fenced) = tagged_calls(&rt, &tools).unwrap();
    assert!(fenced, "the fence's call grammar is among the openings (a server may stream such a call)");
    let mut c = c.expect("a fence every vocabulary spells");
    let vocab = m.vocab_size();
    let allowed = |c: &mut Box<dyn treespec_engine::TokenConstraint>, path: &[u32]| {
        let mut l = vec![0.0f32; vocab];
        c.mask_logits(path, &mut l).unwrap();
        l.iter().filter(|x| x.is_finite()).count()
    };
    let prose = m.tokenize("Sure, ```json\n", false, false).unwrap();
    assert_eq!(allowed(&mut c, &prose), vocab, "a fence later in the text is free");
    let fence = m.tokenize("```json\n", false, false).unwrap();
    assert!(allowed(&mut c, &fence) < vocab, "the call grammar holds after the opening fence");
    c.commit(&fence).unwrap();
    let forced = c.forced(64).unwrap();
    let text = String::from_utf8(forced.iter().flat_map(|&t| m.token_to_bytes(t, false).unwrap()).collect())
        .unwrap();
    // (Forcing stops where the next bytes have several tokenizations: here at the value.)
    assert!(text.starts_with("{\"name\": \"get_weather\", \"arguments\": {\"city\":"), "{text:?}");
    let wrong = m.tokenize("{\"name\": \"set", false, false).unwrap();
    let mut l = vec![0.0f32; vocab];
    c.mask_logits(&wrong[..wrong.len() - 1], &mut l).unwrap();
    assert!(l[*wrong.last().unwrap() as usize].is_infinite(), "an undeclared name is refused");
}
