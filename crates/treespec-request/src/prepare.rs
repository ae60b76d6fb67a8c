//! [`prepare`]: a [`GenerationAsk`] made ready for the engine on any [`PromptModel`], and its
//! parts for the front ends that need one alone (a prompt's tokens, a grammar, the check that a
//! method can run).

use treespec_core::TokenId;
use treespec_engine::{
    CausalLm, Drafter, EngineError, GenerateRequest, Method, NewInner, Opening, Prepared, StopConditions,
    TaggedConstraint, TokenConstraint,
};
use treespec_grammar::{
    fenced_call_grammar, tagged_call_grammar, DecodingConstraint, GrammarError, GrammarSpec, ToolFunction,
    CALL_TAGS, FENCED_CALL,
};

use crate::error::{room, PrepareError};
use crate::model::{PromptModel, VocabularyCache};
use crate::prompt::{GenerationAsk, Prompt, RequestPrompt};

/// Make `spec` ready to generate on `model` (see the crate documentation). The drafter runs on
/// `draft` when the method runs a draft model (the caller need only make one when
/// [`Method::uses_draft`]).
pub fn prepare<'d, M: PromptModel + ?Sized, D: CausalLm + 'd>(
    model: &M,
    spec: &GenerationAsk<'_>,
    draft: Option<D>,
) -> Result<Prepared<'d>, PrepareError> {
    let prompt = request_tokens(model, spec.prompt)?;
    let (constraint, fenced_calls) = match (spec.grammar, spec.tool_calls) {
        (Some(g), _) => (Some(Box::new(compile_grammar(model, g)?) as Box<dyn TokenConstraint>), false),
        (None, Some(tools)) => tagged_calls(model, tools)?,
        (None, None) => (None, false),
    };
    let drafter = drafter(model, spec.method, draft)?;
    let max_new_tokens = room(prompt.len(), spec.max_new_tokens, spec.context)?;
    let stop = StopConditions { eos: model.eos_tokens().to_vec(), stop_strings: spec.stop.to_vec() };
    let request =
        GenerateRequest { prompt, max_new_tokens, sampling: spec.sampling.clone(), seed: spec.seed, stop };
    let constraint = constraint.map(|c| c as Box<dyn TokenConstraint + 'd>);
    Ok(Prepared { request, drafter, constraint, fenced_calls })
}

/// The prompt as tokens.
pub fn request_tokens<M: PromptModel + ?Sized>(
    model: &M,
    prompt: RequestPrompt<'_>,
) -> Result<Vec<TokenId>, PrepareError> {
    match prompt {
        RequestPrompt::Tokens(tokens) => {
            check_tokens(model, tokens)?;
            Ok(tokens.to_vec())
        }
        RequestPrompt::Formatted(p) => model.prompt_tokens(p).map_err(|e| match (e, p) {
            (EngineError::InvalidRequest(e), Prompt::Messages(_) | Prompt::MessagesWithTools(..)) => {
                PrepareError::Template(e)
            }
            (e, _) => PrepareError::Internal(e.to_string()),
        }),
    }
}

/// Tokens a client sent must be in the vocabulary (llama.cpp aborts on any other id).
pub fn check_tokens<M: PromptModel + ?Sized>(model: &M, tokens: &[TokenId]) -> Result<(), PrepareError> {
    let vocab = model.vocab_size();
    match tokens.iter().find(|&&t| t as usize >= vocab) {
        Some(&token) => Err(PrepareError::TokenOutOfVocabulary { token, vocab }),
        None => Ok(()),
    }
}

/// A fresh grammar state for `grammar` (≈1 ms to compile).
pub fn compile_grammar<M: PromptModel + ?Sized>(
    model: &M,
    grammar: &GrammarSpec,
) -> Result<DecodingConstraint, PrepareError> {
    let compiled = grammar.compile(VocabularyCache::get(model)?).map_err(PrepareError::Grammar)?;
    Ok(DecodingConstraint::new(compiled.constraint()))
}

/// Calls of `tools` the model opens itself, each decoded under the call grammar: after the
/// template's `<tool_call>` tag up to its closing tag, where the vocabulary has both as single
/// tokens ([`CALL_TAGS`]), and an answer that starts with a ```` ```json ```` fence (how
/// Qwen2.5-Coder answers with a call) up to the fence's end. The text around calls stays free; a
/// call's envelope, keys and closing come out as forced tokens. None where no opening can be
/// spelled, or the model has no vocabulary for grammars (a call is still read off the free text
/// after). The flag: whether the fence's call grammar is among the openings.
pub fn tagged_calls<M: PromptModel + ?Sized>(
    model: &M,
    tools: &[ToolFunction],
) -> Result<(Option<Box<dyn TokenConstraint>>, bool), PrepareError> {
    let table = match model.token_table() {
        Err(PrepareError::NoGrammar(_)) => return Ok((None, false)),
        t => t?,
    };
    let vocab = VocabularyCache::get(model)?;
    let mut openings: Vec<(Opening, NewInner<DecodingConstraint>)> = Vec::new();
    let mut fenced = false;
    // A call grammar llguidance cannot build leaves the answer free, as without it: the tools
    // were valid for the request, and a call is still read off the text after.
    let mut add = |opening: Opening, grammar: Result<GrammarSpec, GrammarError>| match grammar
        .and_then(|g| g.compile(vocab))
    {
        Ok(g) => {
            openings.push((opening, Box::new(move || Ok(DecodingConstraint::new(g.constraint())))));
            true
        }
        Err(e) => {
            eprintln!("[treespec] tool calls stay unconstrained: {e}");
            false
        }
    };
    if let Some((open, close)) = table.tag_pair(CALL_TAGS) {
        add(
            Opening { tokens: vec![open], at_start: false, close: Some(close) },
            tagged_call_grammar(tools, close),
        );
    }
    let fence = model.text_tokens(FENCED_CALL.0);
    if !fence.is_empty() {
        fenced = add(Opening { tokens: fence, at_start: true, close: None }, fenced_call_grammar(tools));
    }
    if openings.is_empty() {
        return Ok((None, false));
    }
    let calls = TaggedConstraint::new(openings).map_err(|e| PrepareError::Internal(e.to_string()))?;
    Ok((Some(Box::new(calls)), fenced))
}

/// Whether `model` can run `method`: one that needs a draft model needs one loaded.
pub fn check_method<M: PromptModel + ?Sized>(model: &M, method: &Method) -> Result<(), PrepareError> {
    if method.needs_draft() && !model.has_draft() {
        return Err(PrepareError::Method(format!(
            "method '{}' needs a draft model (--md DRAFT.gguf)",
            method.name()
        )));
    }
    Ok(())
}

/// `method`'s drafter, on `draft` when the method runs a draft model.
fn drafter<'d, M: PromptModel + ?Sized, D: CausalLm + 'd>(
    model: &M,
    method: &Method,
    draft: Option<D>,
) -> Result<Box<dyn Drafter + 'd>, PrepareError> {
    check_method(model, method)?;
    method.build(draft.filter(|_| method.uses_draft())).map_err(|e| PrepareError::Method(e.to_string()))
}
