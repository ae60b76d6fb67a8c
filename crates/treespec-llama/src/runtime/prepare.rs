//! One request made ready to generate, the same way for every front end: the CLI's `generate`,
//! the benchmark, the server's FIFO workers and its batch scheduler all call
//! [`ModelRuntime::prepare`]. It turns what a front end was asked for ([`RequestSpec`]) into
//! what the engine runs ([`Prepared`]): the prompt as tokens (through the chat template when it
//! is a chat), the grammar compiled against the target's vocabulary (or, for calls the model may
//! open itself, the call grammar from each opening to its close), the drafter of the method
//! (on the caller's draft model when the method runs one), the stop strings with the target's
//! end tokens, and the most new tokens the context leaves room for.
//!
//! Errors say which part of the request is at fault ([`PrepareError`]), so the server can answer
//! a 400 naming the field and the CLI a sentence.

use treespec_core::sampling::SamplingParams;
use treespec_core::TokenId;
use treespec_engine::{
    CausalLm, Drafter, EngineError, GenerateRequest, Method, NewInner, Opening, StopConditions,
    TaggedConstraint, TokenConstraint,
};
use treespec_grammar::{
    fenced_call_grammar, tagged_call_grammar, DecodingConstraint, GrammarError, GrammarSpec, ToolFunction,
    Vocabulary, CALL_TAGS, FENCED_CALL,
};

use super::{ModelRuntime, Prompt};

/// The prompt of a request: text to format, or tokens a client sent.
#[derive(Debug, Clone, Copy)]
pub enum RequestPrompt<'a> {
    /// Text or messages, tokenized by [`ModelRuntime::prompt_tokens`].
    Formatted(Prompt<'a>),
    /// Tokens as they are (checked against the vocabulary: llama.cpp aborts on any other id).
    Tokens(&'a [TokenId]),
}

/// What a front end asks of one generation.
#[derive(Debug, Clone)]
pub struct RequestSpec<'a> {
    /// The prompt.
    pub prompt: RequestPrompt<'a>,
    /// The method that decodes it.
    pub method: &'a Method,
    /// Most new tokens (None: as many as the context leaves).
    pub max_new_tokens: Option<usize>,
    /// Positions the request's sequence may hold (the target context, or a batch lane's).
    pub context: usize,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// Seed of the draft and verifier streams.
    pub seed: u64,
    /// Stop strings.
    pub stop: &'a [String],
    /// Structured output: the grammar every token must follow.
    pub grammar: Option<&'a GrammarSpec>,
    /// Free output that may call these tools (`tool_choice: "auto"`): a call the model opens
    /// itself follows the call grammar to its close (forced tokens drafted for free; see
    /// [`ModelRuntime::tagged_calls`]); the text around calls stays free. Ignored with
    /// `grammar`.
    pub tool_calls: Option<&'a [ToolFunction]>,
}

/// A request ready for the engine.
pub struct Prepared<'d> {
    /// Prompt tokens, most new tokens, sampling, seed, stop strings and the target's end tokens.
    pub request: GenerateRequest,
    /// The method's drafter.
    pub drafter: Box<dyn Drafter + 'd>,
    /// The grammar state, for structured output (or tool calls between tags).
    pub constraint: Option<Box<dyn TokenConstraint>>,
    /// An answer that opens with a ```` ```json ```` fence is decoded under the call grammar to
    /// its end ([`FENCED_CALL`]): it is then exactly one call of a declared tool, which a server
    /// may stream as `tool_calls` pieces from the fence on instead of holding the answer back.
    pub fenced_calls: bool,
}

/// What is wrong with a request, by the part at fault.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The chat template refused the messages.
    #[error("the chat template refused the messages: {0}")]
    Template(String),
    /// A prompt token is not in the vocabulary.
    #[error("token {token} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfVocabulary {
        /// The token.
        token: TokenId,
        /// The vocabulary size.
        vocab: usize,
    },
    /// Nothing to start from.
    #[error("the prompt is empty after tokenization")]
    EmptyPrompt,
    /// The prompt fills the context.
    #[error("the prompt is {prompt} tokens long but the context holds {context}")]
    PromptTooLong {
        /// Prompt tokens.
        prompt: usize,
        /// Context positions.
        context: usize,
    },
    /// The prompt and the asked-for tokens do not fit.
    #[error(
        "the prompt ({prompt} tokens) plus max_tokens ({max_new}) exceeds the context of {context} tokens"
    )]
    TooManyTokens {
        /// Prompt tokens.
        prompt: usize,
        /// Most new tokens asked for.
        max_new: usize,
        /// Context positions.
        context: usize,
    },
    /// The grammar does not compile (the request's schema, grammar or regex).
    #[error("{0}")]
    Grammar(treespec_grammar::GrammarError),
    /// The method cannot run: it needs a draft model none was loaded for, or its knobs are
    /// invalid.
    #[error("{0}")]
    Method(String),
    /// Not the request's fault.
    #[error("{0}")]
    Internal(String),
}

impl ModelRuntime {
    /// Make `spec` ready to generate (see the module documentation). The drafter runs on `draft`
    /// when the method runs a draft model (the caller need only make one when
    /// [`Method::uses_draft`]).
    pub fn prepare<'d, D: CausalLm + 'd>(
        &self,
        spec: &RequestSpec<'_>,
        draft: Option<D>,
    ) -> Result<Prepared<'d>, PrepareError> {
        let prompt = self.request_tokens(spec.prompt)?;
        let (constraint, fenced_calls) = match (spec.grammar, spec.tool_calls) {
            (Some(g), _) => (Some(Box::new(self.compile_grammar(g)?) as Box<dyn TokenConstraint>), false),
            (None, Some(tools)) => self.tagged_calls(tools)?,
            (None, None) => (None, false),
        };
        let drafter = self.drafter(spec.method, draft)?;
        let max_new_tokens = room(prompt.len(), spec.max_new_tokens, spec.context)?;
        let stop = StopConditions { eos: self.eos_tokens().to_vec(), stop_strings: spec.stop.to_vec() };
        let request = GenerateRequest {
            prompt,
            max_new_tokens,
            sampling: spec.sampling.clone(),
            seed: spec.seed,
            stop,
        };
        Ok(Prepared { request, drafter, constraint, fenced_calls })
    }

    /// The prompt as tokens.
    pub fn request_tokens(&self, prompt: RequestPrompt<'_>) -> Result<Vec<TokenId>, PrepareError> {
        match prompt {
            RequestPrompt::Tokens(tokens) => {
                self.check_tokens(tokens)?;
                Ok(tokens.to_vec())
            }
            RequestPrompt::Formatted(p) => self.prompt_tokens(p).map_err(|e| match (e, p) {
                (EngineError::InvalidRequest(e), Prompt::Messages(_) | Prompt::MessagesWithTools(..)) => {
                    PrepareError::Template(e)
                }
                (e, _) => PrepareError::Internal(e.to_string()),
            }),
        }
    }

    /// Tokens a client sent must be in the vocabulary (llama.cpp aborts on any other id).
    pub fn check_tokens(&self, tokens: &[TokenId]) -> Result<(), PrepareError> {
        let vocab = self.target().vocab_size();
        match tokens.iter().find(|&&t| t as usize >= vocab) {
            Some(&token) => Err(PrepareError::TokenOutOfVocabulary { token, vocab }),
            None => Ok(()),
        }
    }

    /// The target's vocabulary for grammars, built from the token table on first use and kept
    /// (greedy forcing: the grammar's forced tokens are drafted for free).
    pub fn grammar_vocabulary(&self) -> Result<&Vocabulary, PrepareError> {
        if let Some(v) = self.grammar_vocabulary.get() {
            return Ok(v);
        }
        let table = self.token_table().map_err(|e| PrepareError::Internal(format!("token table: {e}")))?;
        let vocab = Vocabulary::new(&table.tokens, &table.eos, &table.special)
            .map_err(|e| PrepareError::Internal(format!("grammar vocabulary: {e}")))?;
        Ok(self.grammar_vocabulary.get_or_init(|| vocab))
    }

    /// A fresh grammar state for `grammar` (≈1 ms to compile).
    pub fn compile_grammar(&self, grammar: &GrammarSpec) -> Result<DecodingConstraint, PrepareError> {
        let compiled = grammar.compile(self.grammar_vocabulary()?).map_err(PrepareError::Grammar)?;
        Ok(DecodingConstraint::new(compiled.constraint()))
    }

    /// Calls of `tools` the model opens itself, each decoded under the call grammar: after the
    /// template's `<tool_call>` tag up to its closing tag, where the vocabulary has both as
    /// single tokens ([`CALL_TAGS`]), and an answer that starts with a ```` ```json ```` fence
    /// (how Qwen2.5-Coder answers with a call) up to the fence's end. The text around calls stays
    /// free; a call's envelope, keys and closing come out as forced tokens. None where no
    /// opening can be spelled (a call is still read off the free text after). The flag: whether
    /// the fence's call grammar is among the openings.
    pub fn tagged_calls(
        &self,
        tools: &[ToolFunction],
    ) -> Result<(Option<Box<dyn TokenConstraint>>, bool), PrepareError> {
        let table = self.token_table().map_err(|e| PrepareError::Internal(format!("token table: {e}")))?;
        let vocab = self.grammar_vocabulary()?;
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
        let fence = self.target().tokenize(FENCED_CALL.0, false, false).unwrap_or_default();
        if !fence.is_empty() {
            fenced = add(Opening { tokens: fence, at_start: true, close: None }, fenced_call_grammar(tools));
        }
        if openings.is_empty() {
            return Ok((None, false));
        }
        let calls = TaggedConstraint::new(openings).map_err(|e| PrepareError::Internal(e.to_string()))?;
        Ok((Some(Box::new(calls)), fenced))
    }

    /// Whether this runtime can run `method`: one that needs a draft model needs one loaded.
    pub fn check_method(&self, method: &Method) -> Result<(), PrepareError> {
        if method.needs_draft() && !self.has_draft() {
            return Err(PrepareError::Method(format!(
                "method '{}' needs a draft model (--md DRAFT.gguf)",
                method.name()
            )));
        }
        Ok(())
    }

    /// `method`'s drafter, on `draft` when the method runs a draft model.
    fn drafter<'d, D: CausalLm + 'd>(
        &self,
        method: &Method,
        draft: Option<D>,
    ) -> Result<Box<dyn Drafter + 'd>, PrepareError> {
        self.check_method(method)?;
        method.build(draft.filter(|_| method.uses_draft())).map_err(|e| PrepareError::Method(e.to_string()))
    }
}

/// Most new tokens for a prompt of `prompt` tokens in `context` positions: `max_new` when it
/// fits, else the whole rest of the context.
pub fn room(prompt: usize, max_new: Option<usize>, context: usize) -> Result<usize, PrepareError> {
    if prompt == 0 {
        return Err(PrepareError::EmptyPrompt);
    }
    if prompt >= context {
        return Err(PrepareError::PromptTooLong { prompt, context });
    }
    let room = context - prompt;
    match max_new {
        None => Ok(room),
        Some(n) if n > room => Err(PrepareError::TooManyTokens { prompt, max_new: n, context }),
        Some(n) => Ok(n),
    }
}
