//! llama.cpp's spellings that clap cannot express. clap's short flags are one character, so
//! llama.cpp's `-md FILE` would read as `-m d`; it is rewritten to `--model-draft` before parsing,
//! and so are llama.cpp's other multi-letter flags in [`LONG`] (`-ngl`, `-fa`, `-ctk`, `-np`, …).
//! (`-c`, `-n`, `-t`, `-s`, `--temp`, `--ctx-size`, `--spec-draft-n-max` are plain clap spellings.)

use std::ffi::OsString;

/// llama.cpp's multi-letter short flags and the long flags they stand for.
const LONG: &[(&str, &str)] = &[
    ("-md", "--model-draft"),
    ("-ngl", "--n-gpu-layers"),
    ("-ngld", "--n-gpu-layers-draft"),
    ("-dev", "--device"),
    ("-np", "--parallel"),
    ("-to", "--timeout"),
    ("-fa", "--flash-attn"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-ctkd", "--cache-type-k-draft"),
    ("-ctvd", "--cache-type-v-draft"),
    ("-tb", "--threads-batch"),
    ("-ub", "--ubatch-size"),
    ("-cb", "--cont-batching"),
    ("-cram", "--cache-ram"),
];

/// Flags whose next argument is free text, never a flag to rewrite.
const TEXT_FLAGS: &[&str] = &["-p", "--prompt", "--stop", "--api-key"];

/// llama.cpp flags treespec refuses, with what to do instead (clap would only say "unexpected
/// argument").
const REFUSED: &[(&[&str], &str)] = &[
    (
        &["-hf", "--hf-repo", "-hfr", "-hff", "--hf-file", "-hft", "--hf-token", "-hfd", "--hf-repo-draft"],
        "treespec reads local GGUF files only (no model hub here): download the file and pass -m FILE \
         (scripts/fetch-models.sh fetches the project's models)",
    ),
    (
        &["--embedding", "--embeddings", "--rerank", "--reranking", "--pooling"],
        "treespec serves text generation only: run llama-server for embeddings or reranking beside it",
    ),
    (
        &["--lora", "--lora-scaled", "--lora-init-without-apply"],
        "LoRA adapters are not applied at run time: merge the adapter into the GGUF (llama.cpp's \
         llama-export-lora) and pass the merged file",
    ),
    (
        &["-mm", "--mmproj", "-mmu", "--mmproj-url", "--mmproj-auto", "--no-mmproj"],
        "multimodal projectors are not supported: treespec decodes text",
    ),
    (
        &["-nocb", "--no-cont-batching"],
        "requests are always batched (one forward holds every request's rows); --parallel 1 serves one at a time",
    ),
    (
        &["--no-jinja"],
        "chats are always rendered with the chat template's Jinja (give another with --chat-template-file)",
    ),
];

/// The first llama.cpp flag of `args` that treespec refuses, with the message saying why and what
/// to do instead.
pub fn refused_flag(args: &[OsString]) -> Option<String> {
    let flags = args.iter().zip(at_flag_positions(args)).filter(|(_, at)| *at);
    flags.filter_map(|(a, _)| a.to_str()).find_map(|a| {
        let flag = a.split_once('=').map_or(a, |(f, _)| f);
        let (_, why) = REFUSED.iter().find(|(flags, _)| flags.contains(&flag))?;
        Some(format!("{flag}: {why}"))
    })
}

/// The command line with llama.cpp's multi-letter short flags spelled as long ones.
pub fn llama_spellings(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let args: Vec<OsString> = args.into_iter().collect();
    let at = at_flag_positions(&args);
    args.into_iter().zip(at).map(|(a, at)| if at { long_spelling(&a).unwrap_or(a) } else { a }).collect()
}

/// `arg` (`-md`, `-md=FILE`) as the long flag it stands for, when it is one of [`LONG`].
fn long_spelling(arg: &OsString) -> Option<OsString> {
    let s = arg.to_str()?;
    LONG.iter().find_map(|(short, long)| {
        if s == *short {
            return Some(OsString::from(*long));
        }
        let value = s.strip_prefix(short)?.strip_prefix('=')?;
        Some(OsString::from(format!("{long}={value}")))
    })
}

/// For each of `args`, whether it stands where a flag may: not after a `--` that ends the flags,
/// and not the value of a flag whose value is free text (`-p -md` is a prompt).
fn at_flag_positions(args: &[OsString]) -> Vec<bool> {
    let (mut literal, mut text_value) = (false, false);
    args.iter()
        .map(|a| {
            let s = a.to_str();
            let at = !literal && !text_value;
            literal |= at && s == Some("--");
            text_value = s.is_some_and(|s| TEXT_FLAGS.contains(&s));
            at
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Vec<String> {
        llama_spellings(args.iter().map(OsString::from))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    #[test]
    fn refused_flags_say_what_to_do_unless_they_are_text() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        let why = refused_flag(&args(&["t", "serve", "-hf", "org/model"])).unwrap();
        assert!(why.starts_with("-hf: ") && why.contains("-m FILE"), "{why}");
        assert!(refused_flag(&args(&["t", "serve", "-m", "x", "--lora=a.gguf"]))
            .unwrap()
            .contains("llama-export-lora"));
        assert!(refused_flag(&args(&["t", "generate", "-p", "--embedding"])).is_none(), "a prompt is text");
        assert!(refused_flag(&args(&["t", "serve", "-m", "x", "-np", "4", "--jinja"])).is_none());
    }

    #[test]
    fn md_becomes_model_draft_except_as_text() {
        assert_eq!(
            run(&["t", "generate", "-m", "T", "-md", "D"]),
            ["t", "generate", "-m", "T", "--model-draft", "D"]
        );
        assert_eq!(run(&["t", "-md=D"]), ["t", "--model-draft=D"]);
        assert_eq!(run(&["t", "-p", "-md"]), ["t", "-p", "-md"]);
        assert_eq!(run(&["t", "--", "-md"]), ["t", "--", "-md"]);
        assert_eq!(run(&["t", "-mdx"]), ["t", "-mdx"]);
    }

    #[test]
    fn gpu_flags_read_as_llama_cpp_writes_them() {
        assert_eq!(
            run(&["t", "serve", "-ngl", "99", "-ngld=all", "-dev", "CUDA0"]),
            ["t", "serve", "--n-gpu-layers", "99", "--n-gpu-layers-draft=all", "--device", "CUDA0"]
        );
        assert_eq!(run(&["t", "-p", "-ngl"]), ["t", "-p", "-ngl"]);
    }
}
