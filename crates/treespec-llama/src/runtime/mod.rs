//! One model runtime for the CLI, the benchmark and the server.
//!
//! Every entry point needs the same things from a target/draft pair: the loaded weights, the end
//! tokens, the chat template, prompts as tokens, token text, the tokenizer fingerprint (n-gram
//! tables and suffix histories are stamped with it) and the measured cost curves (`--budget auto`,
//! `--method auto`). [`ModelRuntime`] loads each file once and derives the rest from the loaded
//! models, the expensive parts (fingerprint, curves) lazily and at most once, so a command that
//! needs several of them does not load a model per need: `treespec serve` used to load its target
//! up to three times before answering a request.
//!
//! A runtime is `Send + Sync`: the server keeps one `Arc<ModelRuntime>` for all its worker threads,
//! each making its own contexts ([`LlamaModel::new_lm`]) on the shared weights. That is sound
//! because a loaded llama.cpp model is immutable (llama-cpp-2 declares its model `Send + Sync`,
//! and `load.rs` makes the same claim for its copy of the pointer); the lazy parts sit behind a
//! `OnceLock` or a `Mutex`.
//!
//! Errors are `anyhow` here, unlike the rest of the crate: this is the application layer, and its
//! errors carry context (which file, which step) for the CLI and the server to print; the prompt
//! path keeps [`treespec_engine::EngineError`] so the server can tell a refused chat from a bug.

mod costs;
mod fingerprint;
mod models;
mod prompt_model;

use std::path::PathBuf;
use std::sync::OnceLock;
use treespec_core::cost::shapes::{PadShapes, ShapeBuckets};

use anyhow::Result;
use treespec_core::ngram::TokenizerId;
use treespec_core::TokenId;
use treespec_engine::auto_budget::CostModel;
use treespec_engine::EngineError;
use treespec_request::{Prompt, TokenTable, VocabularyCache};
use treespec_text::{ChatMessage, ChatTemplate};

pub use crate::kernels::tiled_matmul_state;
pub use costs::default_cache_dir;
pub use fingerprint::tokenizer_id;
pub use models::{ModelBytes, ModelPaths};
pub use prompt_model::read_token_table;

use crate::load::{LlamaModel, LoadOptions};
use costs::CostCache;
use models::{eos_tokens, ModelPair};

/// A loaded target (and draft) with everything derived from them; see the module documentation.
#[derive(Debug)]
pub struct ModelRuntime {
    paths: ModelPaths,
    pair: ModelPair,
    eos: Vec<TokenId>,
    /// Compiled on first use: a raw-text command must not fail on a template it never renders.
    /// The error is kept as text (an `EngineError` is not `Clone`).
    template: OnceLock<std::result::Result<ChatTemplate, String>>,
    /// The operator's template (`--chat-template`, `--chat-template-file`), used instead of the
    /// file's: for models that carry none, or carry a wrong one.
    template_source: Option<String>,
    tokenizer: OnceLock<TokenizerId>,
    token_table: OnceLock<TokenTable>,
    /// The vocabulary grammars compile against, built from the token table on first use.
    grammar_vocabulary: VocabularyCache,
    costs: CostCache,
}

// The server shares one runtime across its worker threads.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<ModelRuntime>();
};

impl ModelRuntime {
    /// Load the target and the draft (the target's weights when the draft is the same file,
    /// symlinks included), checking that the draft can draft for the target. Cost curves are
    /// cached under [`default_cache_dir`]; see [`Self::with_cost_cache_dir`].
    pub fn load(paths: ModelPaths, options: LoadOptions) -> Result<Self> {
        let pair = ModelPair::load(&paths, &options)?;
        let eos = eos_tokens(&pair.target);
        let costs = CostCache::new(default_cache_dir());
        costs.apply_recorded_kernels(&paths.model, &pair.target);
        Ok(Self {
            paths,
            pair,
            eos,
            template: OnceLock::new(),
            template_source: None,
            tokenizer: OnceLock::new(),
            token_table: OnceLock::new(),
            grammar_vocabulary: VocabularyCache::default(),
            costs,
        })
    }

    /// Keep the cost-curve files under `dir` instead (None: never read or write them).
    pub fn with_cost_cache_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.costs = CostCache::new(dir);
        self
    }

    /// The files this runtime loaded.
    pub fn paths(&self) -> &ModelPaths {
        &self.paths
    }

    /// The options both models were loaded with (contexts use them too).
    pub fn options(&self) -> &LoadOptions {
        self.pair.target.options()
    }

    /// The target model.
    pub fn target(&self) -> &LlamaModel {
        &self.pair.target
    }

    /// The draft model, if one was given: the target itself when it is the same file.
    pub fn draft(&self) -> Option<&LlamaModel> {
        self.pair.draft()
    }

    /// Whether a draft was given.
    pub fn has_draft(&self) -> bool {
        self.pair.draft().is_some()
    }

    /// End-of-generation tokens of the target.
    pub fn eos_tokens(&self) -> &[TokenId] {
        &self.eos
    }

    /// Render chats with the Jinja `source` instead of the template in the model file (see
    /// `treespec_text::template_source` for llama-server's `--chat-template` names).
    pub fn with_chat_template(mut self, source: String) -> Self {
        self.template_source = Some(source);
        self.template = OnceLock::new();
        self
    }

    /// The Jinja source chats are rendered with: the operator's, else the model file's (None:
    /// neither, so only plain prompts can be served).
    pub fn chat_template_source(&self) -> Option<String> {
        self.template_source.clone().or_else(|| self.pair.target.chat_template())
    }

    /// The target's chat template ([`Self::chat_template_source`]), compiled with its BOS/EOS
    /// texts on first use.
    pub fn chat_template(&self) -> treespec_engine::Result<&ChatTemplate> {
        let compiled = self.template.get_or_init(|| {
            let target = &self.pair.target;
            match &self.template_source {
                Some(source) => target.compile_chat_template(Some(source)),
                None => target.compiled_chat_template(),
            }
            .map_err(|e| match e {
                EngineError::InvalidRequest(m) => m,
                e => e.to_string(),
            })
        });
        compiled.as_ref().map_err(|e| EngineError::InvalidRequest(e.clone()))
    }

    /// Tokenize a prompt for the target. Chat prompts go through [`LlamaModel::chat_prompt`]: only
    /// the template's markup yields special tokens, so the CLI's `--chat` and the server's messages
    /// mean the same tokens. A template refusing the messages is an
    /// [`EngineError::InvalidRequest`].
    pub fn prompt_tokens(&self, prompt: Prompt<'_>) -> treespec_engine::Result<Vec<TokenId>> {
        let target = &self.pair.target;
        match prompt {
            Prompt::Text(text) => target.text_prompt(text),
            Prompt::User(text) => {
                target.chat_prompt(self.chat_template()?, &[ChatMessage::new("user", text)], None)
            }
            Prompt::Messages(messages) => target.chat_prompt(self.chat_template()?, messages, None),
            Prompt::MessagesWithTools(messages, tools) => {
                target.chat_prompt(self.chat_template()?, messages, Some(tools))
            }
        }
    }

    /// Token → bytes through the target's vocabulary.
    pub fn token_bytes(&self) -> ModelBytes<'_> {
        ModelBytes(&self.pair.target)
    }

    /// The target's tokenizer fingerprint ([`tokenizer_id`]), computed on first use.
    pub fn tokenizer_id(&self) -> Result<TokenizerId> {
        if let Some(id) = self.tokenizer.get() {
            return Ok(*id);
        }
        let id = tokenizer_id(&self.pair.target)?;
        Ok(*self.tokenizer.get_or_init(|| id))
    }

    /// Every token's bytes, read on first use (structured output builds its grammar vocabulary
    /// from it) and kept.
    pub fn token_table(&self) -> treespec_engine::Result<&TokenTable> {
        if let Some(t) = self.token_table.get() {
            return Ok(t);
        }
        let table = read_token_table(&self.pair.target)?;
        Ok(self.token_table.get_or_init(|| table))
    }

    /// The measured cost model: the target's curve, and the draft's when `with_draft` and a draft
    /// was given. Read from the disk cache or profiled (seconds) on first need, then held;
    /// `reprofile` ignores the disk cache (a curve already profiled by this runtime is reused).
    /// The target's curve prices forwards padded to fixed shapes when [`ModelRuntime::shape_padding`]
    /// pads them.
    pub fn cost_model(&self, with_draft: bool, reprofile: bool) -> Result<CostModel> {
        let mut model = self.costs.cost_model(&self.pair, &self.paths, with_draft, reprofile)?;
        let padded = self.options().pad_shapes.decide(Some(&model.target));
        let priced = model.target.shapes().is_some_and(|s| Some(&s.buckets) == padded.as_ref());
        model.target.set_padding(priced);
        Ok(model)
    }

    /// The buckets the target's verify forwards are padded to (`--pad-shapes`), None when they are
    /// not: `on` always, `off` never, `auto` where the target's curve, when one is cached or held,
    /// was timed on padded shapes and says padding pays (a device that replays a repeated shape;
    /// never a CPU, where a filler row costs what a real one does). Every context that verifies
    /// trees for a request ([`LlamaModel::new_lm`], [`LlamaModel::new_batch_lm`]) is padded with
    /// [`treespec_engine::CausalLm::pad_shapes`] by its caller.
    pub fn shape_padding(&self) -> Option<ShapeBuckets> {
        match &self.options().pad_shapes {
            PadShapes::Auto if !self.has_cost_curves(false) => None,
            PadShapes::Auto => {
                let model = self.costs.cost_model(&self.pair, &self.paths, false, false).ok()?;
                PadShapes::Auto.decide(Some(&model.target))
            }
            other => other.decide(None),
        }
    }

    /// Re-time a few sizes of the target's cached cost curve on this machine now and compare
    /// (`treespec profile --check`): the cache file and the comparison, or None when no curve
    /// is cached for this model, thread count and kernel mode.
    pub fn check_cost_curve(
        &self,
    ) -> Result<Option<(PathBuf, treespec_engine::measure::profile::CurveCheck)>> {
        self.costs.check(&self.paths.model, &self.pair.target)
    }

    /// Whether a cost curve in use is provisional: measured while other work kept the cores busy
    /// through the whole bounded wait, so it is refined as requests run but never cached.
    pub fn cost_curves_provisional(&self) -> bool {
        self.costs.provisional()
    }

    /// Whether [`ModelRuntime::cost_model`] would answer at once (from memory or the disk cache)
    /// rather than measure this machine first (minutes on a small CPU).
    pub fn has_cost_curves(&self, with_draft: bool) -> bool {
        self.costs.has_curves(&self.pair, &self.paths, with_draft)
    }
}

/// The loaded pair is what resolving a method asks about: the fingerprint and the cost curves
/// (the draft's too when a draft is loaded), each computed on the first method that needs it.
impl treespec_engine::registry::MethodContext for ModelRuntime {
    fn tokenizer(&self) -> treespec_engine::Result<TokenizerId> {
        self.tokenizer_id().map_err(|e| EngineError::Backend(format!("{e:#}")))
    }

    fn costs(&self) -> treespec_engine::Result<CostModel> {
        self.cost_model(self.has_draft(), false).map_err(|e| EngineError::Backend(format!("{e:#}")))
    }
}
