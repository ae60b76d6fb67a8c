//! The one request preparation on two small models: the toys (no vocabulary for grammars) and a
//! byte-level model with a real token table, so every part of a prepared request — tokens,
//! room, stops, drafter, grammar, tool-call openings — and every error is checked without a
//! GGUF file.

use treespec_core::TokenId;
use treespec_engine::toy::{ToyLm, ToyModel};
use treespec_engine::{Method, TokenConstraint};
use treespec_grammar::{GrammarSpec, ToolFunction};
use treespec_request::{
    prepare, GenerationAsk, PrepareError, Prompt, PromptModel, RequestPrompt, TokenTable, ToyPromptModel,
    VocabularyCache, JSON_ALPHABET, JSON_VOCAB,
};
use treespec_text::ChatMessage;

/// Tokens 0..=255 are the bytes, 256 is the end token, 257 `<tool_call>`, 258 `</tool_call>`.
struct Bytes {
    table: TokenTable,
    cache: VocabularyCache,
}

impl Bytes {
    fn new() -> Self {
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        tokens.push(b"<|end|>".to_vec());
        tokens.push(b"<tool_call>".to_vec());
        tokens.push(b"</tool_call>".to_vec());
        let table = TokenTable { tokens, eos: vec![256], special: vec![256] };
        Self { table, cache: VocabularyCache::new() }
    }
}

impl PromptModel for Bytes {
    fn prompt_tokens(&self, prompt: Prompt<'_>) -> treespec_engine::Result<Vec<TokenId>> {
        match prompt {
            Prompt::Text(t) => Ok(self.text_tokens(t)),
            Prompt::Messages([]) => Err(treespec_engine::EngineError::InvalidRequest("no messages".into())),
            Prompt::User(t) => Ok(self.text_tokens(t)),
            Prompt::Messages(m) | Prompt::MessagesWithTools(m, _) => Ok(self.text_tokens(&m[0].content)),
        }
    }
    fn tokenize(&self, text: &str, _: bool, _: bool) -> treespec_engine::Result<Vec<TokenId>> {
        Ok(text.bytes().map(TokenId::from).collect())
    }
    fn token_piece(&self, token: TokenId) -> treespec_engine::Result<Vec<u8>> {
        Ok(self.table.tokens[token as usize].clone())
    }
    fn prompt_text(&self, prompt: Prompt<'_>) -> Result<String, PrepareError> {
        match prompt {
            Prompt::Text(t) | Prompt::User(t) => Ok(t.to_string()),
            Prompt::Messages([]) => Err(PrepareError::Template("no messages".into())),
            Prompt::Messages(m) | Prompt::MessagesWithTools(m, _) => Ok(m[0].content.clone()),
        }
    }
    fn model_path(&self) -> String {
        "bytes".into()
    }
    fn vocab_size(&self) -> usize {
        self.table.tokens.len()
    }
    fn eos_tokens(&self) -> &[TokenId] {
        &self.table.eos
    }
    fn has_draft(&self) -> bool {
        false
    }
    fn token_table(&self) -> Result<&TokenTable, PrepareError> {
        Ok(&self.table)
    }
    fn vocabulary_cache(&self) -> &VocabularyCache {
        &self.cache
    }
}

fn spec<'a>(prompt: RequestPrompt<'a>, method: &'a Method, max_new: Option<usize>) -> GenerationAsk<'a> {
    GenerationAsk {
        prompt,
        method,
        max_new_tokens: max_new,
        context: 16,
        sampling: Default::default(),
        seed: 7,
        stop: &[],
        grammar: None,
        tool_calls: None,
    }
}

const NO_DRAFT: Option<ToyLm> = None;

#[test]
fn a_prepared_request_holds_the_prompt_room_and_end_tokens() {
    let model = Bytes::new();
    let plain = Method::Plain;
    let stop = vec!["\n\n".to_string()];
    let mut s = spec(RequestPrompt::Formatted(Prompt::Text("abc")), &plain, None);
    s.stop = &stop;
    let p = prepare(&model, &s, NO_DRAFT).unwrap();
    assert_eq!(p.request.prompt, vec![97, 98, 99]);
    assert_eq!(p.request.max_new_tokens, 13, "the rest of the context");
    assert_eq!(p.request.stop.eos, vec![256]);
    assert_eq!(p.request.stop.stop_strings, stop);
    assert_eq!(p.request.seed, 7);
    assert!(p.constraint.is_none() && !p.fenced_calls);
    let p = prepare(&model, &spec(RequestPrompt::Tokens(&[1, 2]), &plain, Some(5)), NO_DRAFT).unwrap();
    assert_eq!((p.request.prompt, p.request.max_new_tokens), (vec![1, 2], 5));
}

#[test]
fn each_fault_names_its_part() {
    let model = Bytes::new();
    let plain = Method::Plain;
    let err = |s: GenerationAsk<'_>| prepare(&model, &s, NO_DRAFT).err().expect("refused");
    assert!(matches!(
        err(spec(RequestPrompt::Tokens(&[1, 259]), &plain, None)),
        PrepareError::TokenOutOfVocabulary { token: 259, vocab: 259 }
    ));
    assert!(matches!(err(spec(RequestPrompt::Tokens(&[]), &plain, None)), PrepareError::EmptyPrompt));
    let long = [1; 16];
    assert!(matches!(
        err(spec(RequestPrompt::Tokens(&long), &plain, None)),
        PrepareError::PromptTooLong { prompt: 16, context: 16 }
    ));
    assert!(matches!(
        err(spec(RequestPrompt::Tokens(&[1, 2]), &plain, Some(15))),
        PrepareError::TooManyTokens { prompt: 2, max_new: 15, context: 16 }
    ));
    assert!(matches!(
        err(spec(RequestPrompt::Formatted(Prompt::Messages(&[])), &plain, None)),
        PrepareError::Template(_)
    ));
    let chain = Method::Chain { k: 3 };
    match err(spec(RequestPrompt::Tokens(&[1]), &chain, None)) {
        PrepareError::Method(m) => assert!(m.contains("needs a draft model"), "{m}"),
        e => panic!("{e}"),
    }
    let bad = GrammarSpec::Regex("(".into());
    let mut s = spec(RequestPrompt::Tokens(&[1]), &plain, None);
    s.grammar = Some(&bad);
    assert!(matches!(err(s), PrepareError::Grammar(_)));
}

#[test]
fn a_grammar_compiles_against_the_models_vocabulary_and_masks_its_tokens() {
    let model = Bytes::new();
    let plain = Method::Plain;
    let digits = GrammarSpec::Regex("[0-9]+".into());
    let mut s = spec(RequestPrompt::Tokens(&[1]), &plain, None);
    s.grammar = Some(&digits);
    let mut p = prepare(&model, &s, NO_DRAFT).unwrap();
    let c = p.constraint.as_mut().expect("a grammar state");
    let mut logits = vec![0.0f32; model.vocab_size()];
    c.mask_logits(&[], &mut logits).unwrap();
    let allowed: Vec<usize> = (0..logits.len()).filter(|&t| logits[t].is_finite()).collect();
    assert_eq!(allowed, (b'0' as usize..=b'9' as usize).collect::<Vec<_>>(), "only digits may start it");
}

#[test]
fn tool_calls_open_at_the_tags_and_the_fence_where_the_vocabulary_spells_them() {
    let model = Bytes::new();
    let plain = Method::Plain;
    let tools = [ToolFunction { name: "f".into(), parameters: serde_json::json!({"type": "object"}) }];
    let mut s = spec(RequestPrompt::Tokens(&[1]), &plain, None);
    s.tool_calls = Some(&tools);
    let p = prepare(&model, &s, NO_DRAFT).unwrap();
    assert!(p.constraint.is_some(), "calls between tags and after the fence");
    assert!(p.fenced_calls, "the fence is spelled byte by byte");
}

#[test]
fn the_toys_refuse_grammars_leave_tool_calls_free_and_build_draft_methods() {
    let toys = ToyPromptModel { vocab: 8, has_draft: true, json: false };
    let chain = Method::Chain { k: 3 };
    let json = GrammarSpec::JsonObject;
    let messages = [ChatMessage::new("user", "hi")];
    let mut s = spec(RequestPrompt::Formatted(Prompt::Messages(&messages)), &chain, Some(2));
    s.context = 64;
    let draft = ToyLm::new(ToyModel::new(8, 1, 3), 64);
    let p = prepare(&toys, &s, Some(draft.clone())).unwrap();
    assert_eq!(p.request.prompt, toys.tokens("user: hi\nassistant:"));
    assert!(p.request.stop.eos.is_empty());
    let tools = [ToolFunction { name: "f".into(), parameters: serde_json::json!({}) }];
    s.tool_calls = Some(&tools);
    assert!(prepare(&toys, &s, Some(draft.clone())).unwrap().constraint.is_none());
    s.grammar = Some(&json);
    assert!(matches!(prepare(&toys, &s, Some(draft)).err(), Some(PrepareError::NoGrammar(_))));
}

#[test]
fn the_json_toy_compiles_grammars_and_ends_with_its_end_token() {
    let toy = ToyPromptModel { vocab: JSON_VOCAB, has_draft: true, json: true };
    let plain = Method::Plain;
    let json = GrammarSpec::JsonObject;
    let mut s = spec(RequestPrompt::Tokens(&[1]), &plain, Some(8));
    s.grammar = Some(&json);
    let mut p = prepare(&toy, &s, NO_DRAFT).unwrap();
    assert_eq!(p.request.stop.eos, vec![JSON_ALPHABET.len() as TokenId], "the last token ends it");
    let c = p.constraint.as_mut().expect("a grammar state");
    let mut logits = vec![0.0f32; toy.vocab_size()];
    c.mask_logits(&[], &mut logits).unwrap();
    let allowed: Vec<u8> =
        (0..JSON_ALPHABET.len()).filter(|&t| logits[t].is_finite()).map(|t| JSON_ALPHABET[t]).collect();
    assert!(allowed.contains(&b'{') && !allowed.iter().any(u8::is_ascii_alphabetic), "{allowed:?}");
    assert!(!logits[JSON_ALPHABET.len()].is_finite(), "no end before the object");
    // Token pieces spell the alphabet; a toy of another size has no grammar vocabulary.
    assert_eq!(toy.token_piece(0).unwrap(), b"{");
    let odd = ToyPromptModel { vocab: 8, ..toy };
    assert!(matches!(prepare(&odd, &s, NO_DRAFT).err(), Some(PrepareError::NoGrammar(_))));
}
