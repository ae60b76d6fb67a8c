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

#[test]
fn qwen_coder_chatml_with_default_system_and_multi_turn() {
    let t = ChatTemplate::new(Some(&fixture("qwen2.5-coder.jinja")), "<|endoftext|>", "<|im_end|>").unwrap();
    let text = t.render(&[ChatMessage::new("user", "Sort a list in Python.")], true).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nSort a list in Python.<|im_end|>\n<|im_start|>assistant\n"
    );
    let turns = [
        ChatMessage::new("system", "Answer tersely."),
        ChatMessage::new("user", "2+2?"),
        ChatMessage::new("assistant", "4"),
        ChatMessage::new("user", "3+3?"),
    ];
    assert_eq!(
        t.render(&turns, true).unwrap(),
        "<|im_start|>system\nAnswer tersely.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n\
         <|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n"
    );
}
