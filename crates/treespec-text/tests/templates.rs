//! Snapshot tests: the real chat templates shipped in the models' GGUF files (extracted verbatim
//! into tests/fixtures) render to exactly the text transformers produces for them.

use treespec_text::{ChatMessage, ChatTemplate};

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn smollm2_default_system_prompt_and_generation_prompt() {
    let t = ChatTemplate::new(Some(&fixture("smollm2.jinja")), "<|im_start|>", "<|im_end|>").unwrap();
    let text = t.render(&[ChatMessage::new("user", "Hi there")], true).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    );
    let with_system =
        t.render(&[ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi")], false).unwrap();
    assert_eq!(with_system, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}
