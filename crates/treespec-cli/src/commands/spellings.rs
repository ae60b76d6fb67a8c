//! llama.cpp's spellings that clap cannot express. clap's short flags are one character, so
//! llama.cpp's `-md FILE` would read as `-m d`; it is rewritten to `--model-draft` before parsing,
//! and so are llama.cpp's other multi-letter flags in [`LONG`] (`-ngl`, `-fa`, `-ctk`, `-np`, …).
//! (`-c`, `-n`, `-t`, `-s`, `--temp`, `--ctx-size`, `--spec-draft-n-max` are plain clap spellings.)

use std::ffi::OsString;

use super::llama_flags::{spec_type_method, NoOp, Takes, NO_OP, REFUSED};

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
    ("--usage", "--help"),
];

/// Flags whose next argument is free text, never a flag to rewrite.
const TEXT_FLAGS: &[&str] = &["-p", "--prompt", "--stop", "--api-key"];

/// The first llama.cpp flag of `args` that treespec refuses, with the message saying why and what
/// to do instead.
pub fn refused_flag(args: &[OsString]) -> Option<String> {
    let generate = args.get(1).is_some_and(|a| a == "generate");
    let flags = args.iter().zip(at_flag_positions(args)).filter(|(_, at)| *at);
    flags.filter_map(|(a, _)| a.to_str()).find_map(|a| {
        let flag = a.split_once('=').map_or(a, |(f, _)| f);
        if generate {
            // `generate` constrains its own output: its --json-schema and --grammar take files.
            if GENERATE_OWN.contains(&flag) {
                return None;
            }
            if let Some(why) = GENERATE_GRAMMAR.iter().find(|f| **f == flag).map(|_| GENERATE_GRAMMAR_WHY) {
                return Some(format!("{flag}: {why}"));
            }
        }
        let (_, why) = REFUSED.iter().find(|(flags, _)| flags.contains(&flag))?;
        Some(format!("{flag}: {why}"))
    })
}

/// llama.cpp's grammar flags that are `generate`'s own (each takes a file here).
const GENERATE_OWN: &[&str] = &["--json-schema", "--grammar"];

/// llama-cli's grammar flags `generate` spells otherwise.
const GENERATE_GRAMMAR: &[&str] = &["-j", "-jf", "--json-schema-file", "--grammar-file"];

const GENERATE_GRAMMAR_WHY: &str =
    "give the schema or grammar as a file: --json-schema FILE (JSON Schema) or \
     --grammar FILE (llguidance's Lark; not GBNF), or --regex / --json-object";

/// The command line as clap reads it: llama.cpp's multi-letter short flags spelled as long ones,
/// `--spec-type` as the `--method` it stands for, and (for `serve`) llama-server's flags with
/// nothing to do here left out. A flag given a value treespec cannot honour is an error naming it.
pub fn llama_spellings(args: impl IntoIterator<Item = OsString>) -> Result<Vec<OsString>, String> {
    let args: Vec<OsString> = args.into_iter().collect();
    let at = at_flag_positions(&args);
    let serve = args.get(1).is_some_and(|a| a == "serve");
    let mut out = Vec::with_capacity(args.len());
    let mut rest = args.iter().zip(at);
    while let Some((arg, at)) = rest.next() {
        let Some(s) = arg.to_str().filter(|_| at) else {
            out.push(arg.clone());
            continue;
        };
        let (flag, inline) = s.split_once('=').map_or((s, None), |(f, v)| (f, Some(v)));
        let mut value = || -> Result<String, String> {
            let next = || rest.next().and_then(|(a, _)| a.to_str()).map(str::to_owned);
            inline.map(str::to_owned).or_else(next).ok_or_else(|| format!("{flag}: needs a value"))
        };
        if let Some(no_op) = serve.then(|| NO_OP.iter().find(|n| n.flags.contains(&flag))).flatten() {
            let given = match no_op.takes {
                Takes::Nothing => inline.map(str::to_owned),
                _ => Some(value()?),
            };
            check_no_op(flag, no_op, given.as_deref())?;
        } else if flag == "--spec-type" {
            out.extend(["--method".into(), spec_type_method(&value()?)?.into()]);
        } else {
            out.push(long_spelling(arg).unwrap_or_else(|| arg.clone()));
        }
    }
    refuse_draft_count(&out)?;
    Ok(out)
}

/// A no-op flag's value, checked: one treespec could not honour is an error naming the flag.
fn check_no_op(flag: &str, no_op: &NoOp, given: Option<&str>) -> Result<(), String> {
    match (no_op.takes, given) {
        (Takes::Nothing, Some(v)) => Err(format!("{flag}={v}: {flag} takes no value")),
        (Takes::Only(values), Some(v)) if !values.iter().any(|w| same_value(v, w)) => Err(format!(
            "{flag} {v}: not honoured here ({}); accepted only as {flag} {}",
            no_op.why,
            values.join("|")
        )),
        _ => Ok(()),
    }
}

/// Two spellings of one value: numbers compared as numbers (`0.0` is `0`).
fn same_value(a: &str, b: &str) -> bool {
    match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// `--draft N` with N a count (llama.cpp's removed spelling of the draft length) is an error:
/// here `--draft` names the draft model's file.
fn refuse_draft_count(args: &[OsString]) -> Result<(), String> {
    let count = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let flags = args.iter().zip(at_flag_positions(args)).enumerate().filter(|(_, (_, at))| *at);
    for (i, (a, _)) in flags {
        let Some(s) = a.to_str() else { continue };
        let n = match s.split_once('=') {
            Some(("--draft", v)) => v,
            _ if s == "--draft" => args.get(i + 1).and_then(|v| v.to_str()).unwrap_or_default(),
            _ => continue,
        };
        if count(n) {
            return Err(format!(
                "--draft {n}: llama.cpp's removed spelling of --spec-draft-n-max; here --draft FILE names \
                 the draft model (-md): use --spec-draft-n-max {n}"
            ));
        }
    }
    Ok(())
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
            .unwrap()
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

    #[test]
    fn serve_drops_the_flags_with_nothing_to_do_and_checks_their_values() {
        let line = |a: &str| llama_spellings(a.split(' ').map(OsString::from));
        assert_eq!(
            line("t serve -m M --threads-http 4 -kvu --keep 0 --mirostat=0.0 --presence-penalty 0 -np 2")
                .unwrap(),
            ["t", "serve", "-m", "M", "--parallel", "2"]
        );
        let err = line("t serve -m M --keep 5").unwrap_err();
        assert!(err.starts_with("--keep 5: ") && err.contains("--keep 0"), "{err}");
        assert!(line("t serve --sse-ping-interval 30").unwrap_err().contains("no SSE pings"));
        assert!(line("t serve --swa-full=1").unwrap_err().contains("takes no value"));
        assert!(line("t serve --keep").unwrap_err().contains("needs a value"));
        // Only serve's: generate has no HTTP threads to ignore.
        assert_eq!(line("t generate --threads-http 4").unwrap(), ["t", "generate", "--threads-http", "4"]);
    }

    #[test]
    fn spec_type_picks_the_method_and_draft_n_is_not_a_file() {
        let line = |a: &str| llama_spellings(a.split(' ').map(OsString::from));
        assert_eq!(line("t serve --spec-type ngram-mod").unwrap(), ["t", "serve", "--method", "suffix"]);
        assert_eq!(line("t serve --spec-type=draft-simple").unwrap(), ["t", "serve", "--method", "chain"]);
        assert_eq!(line("t serve --spec-type draft-simple,ngram-map-k").unwrap()[3], "auto");
        assert_eq!(line("t serve --spec-type none").unwrap()[3], "plain");
        assert!(line("t serve --spec-type draft-eagle3").unwrap_err().contains("EAGLE-3"));
        assert!(line("t serve --spec-type none,ngram-mod").is_err());
        let err = line("t serve -m M --draft 16").unwrap_err();
        assert!(err.contains("--spec-draft-n-max 16"), "{err}");
        assert!(line("t serve -m M --draft=8").is_err());
        assert!(line("t serve -m M --draft d.gguf").is_ok());
        assert!(line("t generate -p --draft 16").is_ok(), "a prompt is text");
    }

    #[test]
    fn no_flag_is_both_refused_and_accepted() {
        for n in NO_OP {
            for f in n.flags {
                assert!(REFUSED.iter().all(|(r, _)| !r.contains(f)), "{f} is refused and accepted");
                assert!(LONG.iter().all(|(short, _)| short != f), "{f} is a spelling and a no-op");
            }
        }
    }
}
