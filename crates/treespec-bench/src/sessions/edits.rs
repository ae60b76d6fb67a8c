//! What a coding agent does between turns: send its current copy of the file with the request,
//! and apply the model's answer to that copy — the whole file in a fenced block (aider's `whole`
//! format) or SEARCH/REPLACE blocks (aider's `diff` format). The next turn sends the updated file,
//! so the model sees (and re-emits) what it wrote before: the repetition speculation feeds on.

/// The user message of an agent turn: the file, fenced, then the request.
pub fn agent_message(path: &str, text: &str, request: &str) -> String {
    let newline = if text.ends_with('\n') { "" } else { "\n" };
    format!("{path}\n```python\n{text}{newline}```\n\n{request}")
}

/// The whole-file answer's new file: the last complete fenced block, or None when the answer has
/// none (the agent then keeps its copy, as aider reports a malformed reply).
pub fn whole_file(answer: &str) -> Option<String> {
    let mut block: Option<Vec<&str>> = None;
    let mut last = None;
    for line in answer.lines() {
        let fence = line.trim_start().starts_with("```");
        match (&mut block, fence) {
            (None, true) => block = Some(Vec::new()),
            (Some(lines), true) => {
                last = Some(lines.iter().map(|l| format!("{l}\n")).collect::<String>());
                block = None;
            }
            (Some(lines), false) => lines.push(line),
            (None, false) => {}
        }
    }
    last
}

/// The outcome of applying SEARCH/REPLACE blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The file after every block that matched.
    pub text: String,
    /// Blocks applied.
    pub applied: usize,
    /// Blocks whose SEARCH part is not in the file (or that never closed).
    pub failed: usize,
}

/// Apply every `<<<<<<< SEARCH` / `=======` / `>>>>>>> REPLACE` block of `answer` to `text`, in
/// order, each to the first exact occurrence of its SEARCH lines; an empty SEARCH appends.
pub fn apply_search_replace(text: &str, answer: &str) -> Applied {
    enum Part {
        Outside,
        Search(Vec<String>),
        Replace(Vec<String>, Vec<String>),
    }
    let mut out = Applied { text: text.to_string(), applied: 0, failed: 0 };
    let mut part = Part::Outside;
    for line in answer.lines() {
        let marker = line.trim_end();
        part = match part {
            Part::Outside if marker.starts_with("<<<<<<<") && marker.ends_with("SEARCH") => {
                Part::Search(Vec::new())
            }
            Part::Outside => Part::Outside,
            Part::Search(search) if marker.starts_with("=======") => Part::Replace(search, Vec::new()),
            Part::Search(mut search) => {
                search.push(format!("{line}\n"));
                Part::Search(search)
            }
            Part::Replace(search, replace)
                if marker.starts_with(">>>>>>>") && marker.ends_with("REPLACE") =>
            {
                let (find, with) = (search.concat(), replace.concat());
                if find.is_empty() {
                    if !out.text.is_empty() && !out.text.ends_with('\n') {
                        out.text.push('\n');
                    }
                    out.text.push_str(&with);
                    out.applied += 1;
                } else if let Some(at) = out.text.find(&find) {
                    out.text.replace_range(at..at + find.len(), &with);
                    out.applied += 1;
                } else {
                    out.failed += 1;
                }
                Part::Outside
            }
            Part::Replace(search, mut replace) => {
                replace.push(format!("{line}\n"));
                Part::Replace(search, replace)
            }
        };
    }
    if !matches!(part, Part::Outside) {
        out.failed += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_fenced_block_is_the_new_file() {
        let answer = "Here it is:\n```python\nx = 1\n```\nand the final version:\n```python\ndef f():\n    return 2\n```\n";
        assert_eq!(whole_file(answer).as_deref(), Some("def f():\n    return 2\n"));
        assert_eq!(whole_file("no code at all"), None);
        // A block cut off by the token limit is not a file.
        assert_eq!(whole_file("```python\ndef f():\n"), None);
    }

    #[test]
    fn search_replace_blocks_apply_in_order() {
        let file = "def f(a):\n    return a\n\ndef g():\n    pass\n";
        let answer = "f.py\n<<<<<<< SEARCH\ndef f(a):\n=======\ndef f(a: int) -> int:\n>>>>>>> REPLACE\n\
                      f.py\n<<<<<<< SEARCH\n    pass\n=======\n    return None\n>>>>>>> REPLACE\n\
                      <<<<<<< SEARCH\nnot in the file\n=======\nx\n>>>>>>> REPLACE\n";
        let got = apply_search_replace(file, answer);
        assert_eq!(got.text, "def f(a: int) -> int:\n    return a\n\ndef g():\n    return None\n");
        assert_eq!((got.applied, got.failed), (2, 1));
    }

    #[test]
    fn an_empty_search_appends_and_an_unclosed_block_fails() {
        let got = apply_search_replace("a = 1", "<<<<<<< SEARCH\n=======\nb = 2\n>>>>>>> REPLACE\n");
        assert_eq!(got.text, "a = 1\nb = 2\n");
        assert_eq!((got.applied, got.failed), (1, 0));
        let cut = apply_search_replace("a = 1\n", "<<<<<<< SEARCH\na = 1\n=======\na = 2\n");
        assert_eq!(cut.text, "a = 1\n");
        assert_eq!((cut.applied, cut.failed), (0, 1));
    }

    #[test]
    fn the_agent_message_fences_the_file() {
        assert_eq!(agent_message("m.py", "x = 1", "Rename x."), "m.py\n```python\nx = 1\n```\n\nRename x.");
    }
}
