//! llama.cpp's flags that treespec answers before clap: the ones it refuses, with what to do
//! instead, and the ones `serve` accepts with nothing to do. docs/SERVING.md ("llama-server's
//! command line") gives every llama-server flag its answer; `tests/llama_flags.rs` checks it.

/// Why a group of llama.cpp's CPU-placement flags is refused.
const PLACEMENT: &str = "thread placement and priority are the OS's here: run treespec under \
     taskset, numactl, nice or chrt (-t and -tb set the threads)";
const HUB: &str = "treespec reads local GGUF files only (no model hub here): download the file and \
     pass -m FILE (scripts/fetch-models.sh fetches the project's models)";
const ROUTER: &str = "one model per server here (no router mode): run one treespec serve per model \
     behind a gateway (docs/SERVING.md, \"Many machines\")";
const REASONING: &str = "the model's thinking is not parsed out of the answer here: it stays in the \
     content as the model wrote it";
const TENSORS: &str = "tensor placement is by whole layers here: -ngl / -ngld (and -dev) decide what \
     runs on the GPU";
const MULTIMODAL: &str = "multimodal projectors are not supported: treespec decodes text";
const DRAFT_DEVICE: &str = "the draft model runs where the target does (-dev; -ngld sets its layers) \
     and with -t / -tb threads, in turn with the target";
const GRAMMAR: &str = "a server-wide constraint is not taken: send response_format (json_object or \
     json_schema) or tools with each request";

/// llama.cpp flags treespec refuses, with what to do instead (clap would only say "unexpected
/// argument").
pub const REFUSED: &[(&[&str], &str)] = &[
    (&["-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-hft", "--hf-token", "-mu", "--model-url"], HUB),
    (&["-dr", "--docker-repo", "-cl", "--cache-list", "--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft"], HUB),
    (
        &[
            "--embd-gemma-default", "--fim-qwen-1.5b-default", "--fim-qwen-3b-default", "--fim-qwen-7b-default",
            "--fim-qwen-7b-spec", "--fim-qwen-14b-spec", "--fim-qwen-30b-default", "--gpt-oss-20b-default",
            "--gpt-oss-120b-default", "--vision-gemma-4b-default", "--vision-gemma-12b-default",
        ],
        "llama.cpp's presets download models from a hub: treespec reads local GGUF files (-m FILE, -md FILE; \
         --method auto for speculation)",
    ),
    (
        &["--embedding", "--embeddings", "--rerank", "--reranking", "--pooling", "--embd-normalize"],
        "treespec serves text generation only: run llama-server for embeddings or reranking beside it",
    ),
    (
        &["--lora", "--lora-scaled", "--lora-init-without-apply"],
        "LoRA adapters are not applied at run time: merge the adapter into the GGUF (llama.cpp's \
         llama-export-lora) and pass the merged file",
    ),
    (
        &["--control-vector", "--control-vector-scaled", "--control-vector-layer-range"],
        "control vectors are not applied: treespec runs the model file as it is",
    ),
    (&["-mm", "--mmproj", "-mmu", "--mmproj-url", "--mmproj-auto", "--media-path"], MULTIMODAL),
    (
        &["-nocb", "--no-cont-batching"],
        "requests are always batched (one forward holds every request's rows); --parallel 1 serves one at a time",
    ),
    (
        &["--no-jinja"],
        "chats are always rendered with the chat template's Jinja (give another with --chat-template-file)",
    ),
    (
        &["--context-shift"],
        "treespec never shifts the context: a request that outgrows it ends with finish_reason \
         \"length\" (size -c for the longest conversation)",
    ),
    (&["-C", "--cpu-mask", "-Cr", "--cpu-range", "--cpu-strict", "--prio", "--poll"], PLACEMENT),
    (&["-Cb", "--cpu-mask-batch", "-Crb", "--cpu-range-batch", "--cpu-strict-batch", "--prio-batch"], PLACEMENT),
    (&["--poll-batch", "--numa"], PLACEMENT),
    (
        &[
            "--spec-draft-cpu-mask", "-Cd", "--cpu-mask-draft", "--spec-draft-cpu-range", "-Crd",
            "--cpu-range-draft", "--spec-draft-cpu-strict", "--cpu-strict-draft", "--spec-draft-prio",
            "--prio-draft", "--spec-draft-poll", "--poll-draft", "--spec-draft-cpu-mask-batch", "-Cbd",
            "--cpu-mask-batch-draft", "--spec-draft-cpu-strict-batch", "--cpu-strict-batch-draft",
            "--spec-draft-prio-batch", "--prio-batch-draft", "--spec-draft-poll-batch", "--poll-batch-draft",
        ],
        PLACEMENT,
    ),
    (
        &[
            "--spec-draft-threads", "-td", "--threads-draft", "--spec-draft-threads-batch", "-tbd",
            "--threads-batch-draft", "--spec-draft-device", "-devd", "--device-draft",
        ],
        DRAFT_DEVICE,
    ),
    (&["-ot", "--override-tensor", "-cmoe", "--cpu-moe", "-ncmoe", "--n-cpu-moe", "-ncffn", "--n-cpu-ffn"], TENSORS),
    (
        &[
            "--spec-draft-override-tensor", "-otd", "--override-tensor-draft", "--spec-draft-cpu-moe", "-cmoed",
            "--cpu-moe-draft", "--spec-draft-n-cpu-moe", "--spec-draft-ncmoe", "-ncmoed", "--n-cpu-moe-draft",
        ],
        TENSORS,
    ),
    (
        &["-ts", "--tensor-split", "-mg", "--main-gpu", "--rpc"],
        "treespec runs on one device: name it with -dev (treespec devices lists them); no RPC backend",
    ),
    (
        &["-lcs", "--lookup-cache-static", "-lcd", "--lookup-cache-dynamic"],
        "llama.cpp's lookup caches are not read: build treespec's n-gram table with `treespec ngram build` \
         and pass --ngram (--method lookup or staged), or use --method suffix",
    ),
    (
        &["--kv-unified-per-slot"],
        "a request may use the whole KV cache here (-c cells shared by -np requests): size -c as N × -np",
    ),
    (&["-no-kvu", "--no-kv-unified"], "the requests always share one KV cache of -c cells"),
    (&["-nkvo", "--no-kv-offload"], "the KV cache stays with its layers (on the GPU with -ngl)"),
    (&["-nr", "--no-repack", "--no-host", "--no-op-offload"], "llama.cpp's buffer choices are its defaults here"),
    (
        &["--check-tensors"],
        "the tensors are not checked at load here: check the file with llama.cpp's tools",
    ),
    (
        &["--list-devices"],
        "run `treespec devices` (also `treespec list-devices`) for the names -dev takes",
    ),
    (&["--completion-bash"], "treespec has no bash completion script"),
    (
        &["-sp", "--special"],
        "the special tokens' text stays out of the answers here",
    ),
    (&["--spm-infill"], "there is no /infill route here"),
    (&["-r", "--reverse-prompt"], "stop strings are per request here: send `stop` with the request"),
    (
        &["-e", "--escape", "--no-escape"],
        "a server takes no prompt on its command line: nothing to escape (refused so as not to hide a \
         mistyped line)",
    ),
    (
        &["--samplers", "--sampler-seq", "--sampling-seq"],
        "the samplers' order is per request here (`samplers`, llama-server's names)",
    ),
    (&["--ignore-eos"], "generating past the end-of-generation token is not supported"),
    (&["-l", "--logit-bias"], "logit bias is not supported"),
    (&["--grammar", "--grammar-file", "-j", "--json-schema", "-jf", "--json-schema-file"], GRAMMAR),
    (
        &["--path", "--ui-config", "--webui-config", "--ui-config-file", "--webui-config-file"],
        "no static files or page settings are served: the chat page at GET / is built in (--no-webui \
         turns it off)",
    ),
    (
        &["--ui-mcp-proxy", "--webui-mcp-proxy", "--tools", "--tools-runtime", "--mcp-servers-config"],
        "no built-in tools, MCP proxy or agent here: a client runs its tools and sends the results",
    ),
    (&["--mcp-servers-json", "-ag", "--agent"], "no built-in tools, MCP proxy or agent here"),
    (
        &["--cors-origins", "--cors-methods", "--cors-headers", "--cors-credentials", "--no-cors-credentials"],
        "no CORS headers are sent: serve a browser app from behind a proxy that adds them",
    ),
    (&["--api-prefix"], "the routes are at the root: a proxy can map a prefix onto them"),
    (&["--reuse-port"], "one process per port: run replicas on several ports behind a gateway"),
    (&["--chat-template-kwargs"], "template variables are not passed: give a template with --chat-template-file"),
    (
        &["--no-cache-prompt", "--no-cache-idle-slots"],
        "the prompt cache is always on; --cache-ram 0 keeps no finished request's prefix in host memory",
    ),
    (
        &["--slot-save-path"],
        "slots are not saved to files: finished prefixes stay in host memory (--cache-ram)",
    ),
    (&["--no-slots"], "the /slots route is always served (guard it with --api-key)"),
    (&["--models-dir", "--models-preset", "--models-max", "--models-autoload", "--no-models-autoload"], ROUTER),
    (
        &["-rea", "--reasoning", "--reasoning-effort", "--reasoning-budget-message", "--reasoning-preserve"],
        REASONING,
    ),
    (&["--no-reasoning-preserve", "--skip-chat-parsing"], REASONING),
    (
        &["--prefill-assistant", "--no-prefill-assistant"],
        "not configurable: the messages are rendered with the chat template as they are sent",
    ),
    (
        &["--log-disable", "--log-file", "--log-jsonl", "--log-prompts-dir"],
        "treespec logs to stderr, one line an event: redirect it (2>FILE, 2>/dev/null)",
    ),
    (
        &["--spec-synth-len", "--spec-synth-rates"],
        "synthetic acceptance is llama.cpp's benchmarking aid: `treespec bench` and `treespec bound` measure",
    ),
    (
        &["--draft-n", "--draft-min", "--draft-n-min", "--spec-ngram-size-n", "--spec-ngram-size-m"],
        "llama.cpp removed this flag too: use --spec-draft-n-max (the chain's draft length here)",
    ),
    (&["--spec-ngram-min-hits"], "llama.cpp removed this flag too"),
];

/// What a flag accepted with nothing to do takes after it.
#[derive(Debug, Clone, Copy)]
pub enum Takes {
    /// A switch.
    Nothing,
    /// A value, any.
    Any,
    /// One of these values (numbers compared as numbers: `0.0` is `0`); another is an error
    /// naming the flag, since treespec could not honour it.
    Only(&'static [&'static str]),
}

/// A llama-server flag `serve` accepts and ignores: its spellings, what it takes, and why there
/// is nothing to do (said in `treespec serve --help`).
pub struct NoOp {
    pub flags: &'static [&'static str],
    pub takes: Takes,
    pub why: &'static str,
}

const fn no_op(flags: &'static [&'static str], takes: Takes, why: &'static str) -> NoOp {
    NoOp { flags, takes, why }
}

use Takes::{Any, Nothing, Only};

/// llama-server's flags `treespec serve` accepts with nothing to do.
pub const NO_OP: &[NoOp] = &[
    no_op(&["--threads-http"], Any, "HTTP runs on tokio's threads"),
    no_op(&["--keep"], Only(&["0"]), "the context never shifts, so no tokens are kept through a shift"),
    no_op(&["--no-context-shift"], Nothing, "the context never shifts"),
    no_op(&["--swa-full"], Nothing, "sliding-window caches are always full-size"),
    no_op(&["-kvu", "--kv-unified"], Nothing, "the requests always share one KV cache"),
    no_op(&["-kvo", "--kv-offload", "--repack", "--op-offload"], Nothing, "llama.cpp's defaults"),
    no_op(&["--perf", "--no-perf"], Nothing, "treespec's timings are in /metrics and each answer"),
    no_op(&["--warmup", "--no-warmup"], Nothing, "no warm-up decode at start"),
    no_op(&["-bs", "--backend-sampling"], Nothing, "treespec samples in its own code"),
    no_op(&["-dt", "--defrag-thold"], Any, "deprecated in llama.cpp too"),
    no_op(
        &["-ctxcp", "--ctx-checkpoints", "--swa-checkpoints", "-cms", "--checkpoint-min-step"],
        Any,
        "full-size sliding-window caches go back without checkpoints",
    ),
    no_op(&["--cache-prompt", "--cache-idle-slots"], Nothing, "always on (--cache-ram sizes it)"),
    no_op(&["--cache-reuse"], Only(&["0"]), "no KV shifting"),
    no_op(
        &["-sps", "--slot-prompt-similarity"],
        Any,
        "a request finds its cached prefix by content, not by slot",
    ),
    no_op(&["--webui", "--ui"], Nothing, "the chat page is on unless --no-webui"),
    no_op(
        &["--no-ui-mcp-proxy", "--no-webui-mcp-proxy", "-no-ag", "--no-agent"],
        Nothing,
        "no tools or agent here",
    ),
    no_op(
        &["--no-mmproj", "--no-mmproj-auto", "--mmproj-offload", "--no-mmproj-offload"],
        Nothing,
        "no multimodal projector",
    ),
    no_op(
        &[
            "-mmdev",
            "--mmproj-device",
            "--image-min-tokens",
            "--image-max-tokens",
            "--mtmd-batch-max-tokens",
            "--video-fps",
            "--video-timestamp-interval",
            "--video-ffmpeg-dir",
        ],
        Any,
        "no multimodal projector",
    ),
    no_op(
        &["-lm", "--load-mode"],
        Only(&["auto", "mmap"]),
        "the model is mapped (--no-mmap, --mlock for the others)",
    ),
    no_op(&["-lzm", "--lazy-mode"], Only(&["auto"]), "llama.cpp's default"),
    no_op(&["-sm", "--split-mode"], Only(&["none"]), "one GPU"),
    no_op(
        &["-fit", "--fit"],
        Only(&["off"]),
        "settings are never shrunk to fit: a context that does not fit is an error",
    ),
    no_op(&["-fitt", "--fit-target", "-fitc", "--fit-ctx"], Any, "nothing is fitted"),
    no_op(&["--tags"], Any, "informational in llama-server too"),
    no_op(&["--offline"], Nothing, "treespec never goes online"),
    no_op(&["--sse-ping-interval"], Only(&["-1"]), "no SSE pings are sent"),
    no_op(&["--sleep-idle-seconds"], Only(&["-1"]), "the model stays loaded"),
    no_op(&["--no-skip-chat-parsing"], Nothing, "tool calls are parsed from the answer"),
    no_op(&["--reasoning-format"], Only(&["none"]), "thoughts are left in the content"),
    no_op(&["--reasoning-budget"], Only(&["-1"]), "thinking is not cut"),
    no_op(&["--log-colors"], Any, "treespec's log lines have no colours"),
    no_op(
        &["--log-prefix", "--no-log-prefix", "--log-timestamps", "--no-log-timestamps", "--no-log-jsonl"],
        Nothing,
        "treespec's log lines are its own",
    ),
    no_op(&["-v", "--verbose", "--log-verbose"], Nothing, "treespec's log lines are its own"),
    no_op(&["-lv", "--verbosity", "--log-verbosity"], Any, "treespec's log lines are its own"),
    no_op(&["--spec-draft-n-min"], Only(&["0"]), "a draft is never padded"),
    no_op(
        &["--spec-draft-p-split", "--draft-p-split"],
        Only(&["0.1"]),
        "llama.cpp's default; the methods shape the trees",
    ),
    no_op(
        &["--spec-draft-p-min", "--draft-p-min"],
        Only(&["0"]),
        "llama.cpp's default; the methods decide where a draft stops",
    ),
    no_op(
        &["--spec-draft-backend-sampling", "--no-spec-draft-backend-sampling"],
        Nothing,
        "treespec samples in its own code",
    ),
    no_op(
        &["--spec-draft-sampling"],
        Only(&["probabilistic"]),
        "drafts are sampled and verified by rejection sampling",
    ),
    no_op(
        &["--spec-ngram-mod-n-min", "--spec-ngram-mod-n-max", "--spec-ngram-mod-n-match"],
        Any,
        "the suffix drafter (--spec-type ngram-*) sizes its drafts itself",
    ),
    no_op(
        &["--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m", "--spec-ngram-simple-min-hits"],
        Any,
        "the suffix drafter (--spec-type ngram-*) sizes its drafts itself",
    ),
    no_op(
        &["--spec-ngram-map-k-size-n", "--spec-ngram-map-k-size-m", "--spec-ngram-map-k-min-hits"],
        Any,
        "the suffix drafter (--spec-type ngram-*) sizes its drafts itself",
    ),
    no_op(
        &["--spec-ngram-map-k4v-size-n", "--spec-ngram-map-k4v-size-m", "--spec-ngram-map-k4v-min-hits"],
        Any,
        "the suffix drafter (--spec-type ngram-*) sizes its drafts itself",
    ),
    no_op(&["--top-nsigma", "--top-n-sigma"], Only(&["-1"]), "the sampler is off, as it always is here"),
    no_op(
        &["--xtc-probability", "--dry-multiplier", "--dynatemp-range", "--mirostat"],
        Only(&["0"]),
        "the sampler is off, as it always is here",
    ),
    no_op(&["--presence-penalty", "--frequency-penalty"], Only(&["0"]), "off, as they always are here"),
    no_op(&["--typical", "--typical-p"], Only(&["1"]), "the sampler is off, as it always is here"),
    no_op(&["--adaptive-target"], Only(&["-1"]), "the sampler is off, as it always is here"),
    no_op(
        &[
            "--xtc-threshold",
            "--dry-base",
            "--dry-allowed-length",
            "--dry-penalty-last-n",
            "--dry-sequence-breaker",
            "--adaptive-decay",
            "--dynatemp-exp",
            "--mirostat-lr",
            "--mirostat-ent",
        ],
        Any,
        "the knob of a sampler that is off",
    ),
];

/// The llama.cpp method names of `--spec-type` as treespec's `--method`: a draft model's chain
/// for `draft-simple`, the suffix drafter for the n-gram drafters, `auto` (the best of both, per
/// step) for both at once, `plain` for `none`.
pub fn spec_type_method(value: &str) -> Result<&'static str, String> {
    let (mut draft, mut ngram, mut none) = (false, false, false);
    for name in value.split(',').map(str::trim) {
        match name {
            "none" => none = true,
            "draft-simple" => draft = true,
            "ngram-simple" | "ngram-map-k" | "ngram-map-k4v" | "ngram-mod" | "ngram-cache" => ngram = true,
            "draft-eagle3" | "draft-mtp" | "draft-dflash" | "draft-dspark" => {
                return Err(format!(
                    "--spec-type {name}: EAGLE-3, MTP and DFlash heads are not supported: treespec drafts \
                     with a draft model (-md, --spec-type draft-simple) or the suffix drafter (ngram-*)"
                ))
            }
            other => return Err(format!("--spec-type: unknown type {other:?}")),
        }
    }
    match (none, draft, ngram) {
        (true, false, false) => Ok("plain"),
        (false, true, false) => Ok("chain"),
        (false, false, true) => Ok("suffix"),
        (false, true, true) => Ok("auto"),
        _ => Err(format!("--spec-type {value}: none with another type")),
    }
}

/// The `serve --help` paragraph listing [`NO_OP`].
pub fn no_op_help() -> String {
    let mut help = String::from("llama-server flags accepted with nothing to do here:\n");
    for n in NO_OP {
        let value = match n.takes {
            Nothing => String::new(),
            Any => " V".into(),
            Only(values) => format!(" {}", values.join("|")),
        };
        help.push_str(&format!("  {}{value}: {}\n", n.flags.join(", "), n.why));
    }
    help
}
