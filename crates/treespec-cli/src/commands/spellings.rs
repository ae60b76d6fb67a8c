//! llama.cpp's spellings that clap cannot express. clap's short flags are one character, so
//! llama.cpp's `-md FILE` would read as `-m d`; it is rewritten to `--model-draft` before parsing,
//! and so are `-ngl`, `-ngld`, `-dev`, `-np` and `-to`.
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
];

/// Flags whose next argument is free text, never a flag to rewrite.
const TEXT_FLAGS: &[&str] = &["-p", "--prompt", "--stop", "--api-key"];

/// The command line with llama.cpp's multi-letter short flags spelled as long ones.
pub fn llama_spellings(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out: Vec<OsString> = Vec::new();
    let mut literal = false;
    for a in args {
        let after_text_flag = out.last().and_then(|p| p.to_str()).is_some_and(|p| TEXT_FLAGS.contains(&p));
        let rewritten = match a.to_str() {
            _ if literal || after_text_flag => None,
            Some("--") => {
                literal = true;
                None
            }
            Some(s) => LONG.iter().find_map(|(short, long)| {
                if s == *short {
                    return Some(OsString::from(*long));
                }
                let value = s.strip_prefix(short)?.strip_prefix('=')?;
                Some(OsString::from(format!("{long}={value}")))
            }),
            None => None,
        };
        out.push(rewritten.unwrap_or(a));
    }
    out
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
