//! Chat templates by name, for model files that carry none (base models, some conversions):
//! llama-server's `--chat-template NAME` spellings, written as Jinja so they render through the
//! same guarded path as a file's own template. Only formats whose markup is unambiguous are here;
//! anything else is a Jinja text or file the operator gives (`--chat-template-file`).

use crate::chat::TemplateError;

/// The names, with their Jinja source.
const BUILTIN: [(&str, &str); 8] = [
    (
        "chatml",
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}\
         {% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    ),
    (
        "gemma",
        "{{ bos_token }}{% if messages and messages[0]['role'] == 'system' %}{% set first = messages[0]['content'] + '\\n\\n' %}{% set rest = messages[1:] %}\
         {% else %}{% set first = '' %}{% set rest = messages %}{% endif %}\
         {% for message in rest %}{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' + (first if loop.first else '') + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}\
         {% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}",
    ),
    (
        "llama2",
        "{% if messages and messages[0]['role'] == 'system' %}{% set sys = '<<SYS>>\\n' + messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}{% set rest = messages[1:] %}\
         {% else %}{% set sys = '' %}{% set rest = messages %}{% endif %}\
         {% for message in rest %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + (sys if loop.first else '') + message['content'] | trim + ' [/INST]' }}\
         {% else %}{{ ' ' + message['content'] | trim + ' ' + eos_token }}{% endif %}{% endfor %}",
    ),
    (
        "llama3",
        "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}\
         {% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
    ),
    (
        "mistral-v7",
        "{% for message in messages %}{% if message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}\
         {% elif message['role'] == 'user' %}{{ '[INST] ' + message['content'] + '[/INST]' }}{% else %}{{ ' ' + message['content'] + eos_token }}{% endif %}{% endfor %}",
    ),
    (
        "phi3",
        "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}{% endfor %}\
         {% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}",
    ),
    (
        "vicuna",
        "{% for message in messages %}{% if message['role'] == 'system' %}{{ message['content'] + '\\n' }}{% elif message['role'] == 'user' %}{{ 'USER: ' + message['content'] + '\\n' }}\
         {% else %}{{ 'ASSISTANT: ' + message['content'] + eos_token + '\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}",
    ),
    (
        "zephyr",
        "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}{% endfor %}\
         {% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}",
    ),
];

/// The built-in names, for help texts and errors.
pub fn builtin_names() -> impl Iterator<Item = &'static str> {
    BUILTIN.iter().map(|(name, _)| *name)
}

/// The Jinja source of built-in template `name`.
pub fn builtin_template(name: &str) -> Option<&'static str> {
    BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, source)| *source)
}

/// What `--chat-template VALUE` means, as llama-server reads it: a built-in name, else a Jinja
/// template text (it has `{{` or `{%`). Anything else is an error naming the built-in names, so
/// a misspelled name is not silently rendered as a template that prints itself.
pub fn template_source(value: &str) -> Result<String, TemplateError> {
    if let Some(source) = builtin_template(value.trim()) {
        return Ok(source.to_string());
    }
    if value.contains("{{") || value.contains("{%") {
        return Ok(value.to_string());
    }
    Err(TemplateError::Parse(format!(
        "--chat-template {value:?} is neither a built-in name ({}) nor a Jinja template (one with {{{{ or {{%); \
         a template in a file is --chat-template-file FILE",
        builtin_names().collect::<Vec<_>>().join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ChatMessage, ChatTemplate};

    fn render(name: &str, messages: &[ChatMessage]) -> String {
        let t = ChatTemplate::new(Some(&template_source(name).unwrap()), "<s>", "</s>").unwrap();
        t.render(messages, true).unwrap()
    }

    fn conversation() -> Vec<ChatMessage> {
        vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
            ChatMessage::new("assistant", "Hello"),
            ChatMessage::new("user", "Bye"),
        ]
    }

    #[test]
    fn each_builtin_renders_its_format() {
        let want = [
            ("chatml", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"),
            ("gemma", "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"),
            ("llama2", "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello </s><s>[INST] Bye [/INST]"),
            ("llama3", "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
            ("mistral-v7", "[SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST] Hi[/INST] Hello</s>[INST] Bye[/INST]"),
            ("phi3", "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello<|end|>\n<|user|>\nBye<|end|>\n<|assistant|>\n"),
            ("vicuna", "Be brief.\nUSER: Hi\nASSISTANT: Hello</s>\nUSER: Bye\nASSISTANT:"),
            ("zephyr", "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello</s>\n<|user|>\nBye</s>\n<|assistant|>\n"),
        ];
        assert_eq!(want.len(), builtin_names().count(), "every built-in is checked");
        for (name, text) in want {
            assert_eq!(render(name, &conversation()), text, "{name}");
        }
        // Without a system message the first user turn stands alone.
        assert_eq!(
            render("gemma", &[ChatMessage::new("user", "Hi")]),
            "<s><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn a_value_is_a_name_or_a_jinja_text_and_nothing_else() {
        assert_eq!(template_source("chatml").unwrap(), builtin_template("chatml").unwrap());
        assert_eq!(template_source("{{ messages[0].content }}").unwrap(), "{{ messages[0].content }}");
        let e = template_source("chatlm").unwrap_err().to_string();
        assert!(e.contains("chatml") && e.contains("--chat-template-file"), "{e}");
    }
}
