//! Every llama-server flag has its answer in docs/SERVING.md ("llama-server's command line"), and
//! `treespec serve` gives it (issue #65): the table names every flag of the vendored llama.cpp's
//! common/arg.cpp that llama-server takes (scripts/llama-server-flags.py lists them), and each
//! flag marked *same meaning* or *accepted, nothing to do* is accepted by `treespec serve` (the
//! latter also named in its `--help`), each marked *refused* is refused with a message saying why.
//! docs/RUN.md's table does the same for `treespec generate` and llama.cpp's llama-completion /
//! llama-cli. No model is loaded: each line names a model file that is not there, so an accepted
//! flag gets as far as loading it (an error, not a usage error).

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use common::command;

/// The answers a table may give.
const SAME: &str = "same meaning";
const ACCEPTED: &str = "accepted, nothing to do";
const REFUSED: &str = "refused";

/// A model file that is not there: an accepted command line fails at loading it.
const NO_MODEL: &str = "/nonexistent/treespec-flags-test.gguf";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One row of a flag table: its spellings with the example value each is run with, its answer.
#[derive(Debug)]
struct Row {
    flags: Vec<(String, Option<String>)>,
    answer: String,
}

/// The flag table under `heading` in a doc: each cell of backticked flags, each with the example
/// value it is run with (`-c 2048`, `--ctx-size 2048`, `--jinja`), then the answer.
fn table(doc: &str, heading: &str) -> Vec<Row> {
    let text = std::fs::read_to_string(root().join(doc)).unwrap();
    let section = text.split_once(heading).unwrap_or_else(|| panic!("{doc} has no {heading:?}")).1;
    // The first table after the heading.
    let lines = section.lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|'));
    let rows: Vec<Row> = lines
        .filter(|l| l.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line.split(" | ").collect();
            let items: Vec<&str> = cells[0].split('`').skip(1).step_by(2).collect();
            let flags: Vec<(String, Option<String>)> = items
                .iter()
                .map(|i| match i.split_once(' ') {
                    Some((f, v)) => (f.to_owned(), Some(v.to_owned())),
                    None => (i.to_string(), None),
                })
                .collect();
            let answer = cells[1].trim().to_owned();
            assert!(
                [SAME, ACCEPTED, REFUSED].contains(&answer.as_str()),
                "{doc}: answer {answer:?} in {line}"
            );
            Row { flags, answer }
        })
        .collect();
    assert!(rows.len() > 10, "{doc}: {heading:?} has {} rows", rows.len());
    rows
}

/// The spellings of a llama.cpp tool's flags, from the vendored arg.cpp.
fn llama_flags(example: &str) -> BTreeSet<String> {
    let script = root().join("scripts/llama-server-flags.py");
    let out = Command::new("python3").arg(script).args(["--example", example]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let flags: BTreeSet<String> = text
        .lines()
        .flat_map(|l| l.split('\t').next().unwrap().split(' ').map(str::to_owned).collect::<Vec<_>>())
        .collect();
    assert!(flags.len() > 100, "{example}: only {} flags", flags.len());
    flags
}

/// Whether `help` names `flag` as a flag (not as the start of a longer one).
fn mentions(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(i, _)| {
        let before = help[..i].chars().last().is_none_or(|c| !c.is_alphanumeric() && c != '-');
        let after = help[i + flag.len()..].chars().next().is_none_or(|c| !c.is_alphanumeric() && c != '-');
        before && after
    })
}

/// `treespec SUBCOMMAND` with `flag` (and its value) added to the base line, minus the base's
/// own flag when the row's is one of its spellings.
fn run(subcommand: &str, base: &[(&[&str], &str)], flag: &str, value: Option<&str>) -> (Option<i32>, String) {
    let mut args = vec![subcommand.to_owned()];
    for (spellings, v) in base.iter().filter(|(s, _)| !s.contains(&flag)) {
        args.extend([spellings[0].to_owned(), v.to_string()]);
    }
    args.push(flag.to_owned());
    args.extend(value.map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = command(&args).output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Each row's answer, given by the binary: the failures, one line each.
fn check_answers(subcommand: &str, rows: &[Row], base: &[(&[&str], &str)], help: &str) -> Vec<String> {
    let mut failures = Vec::new();
    for row in rows {
        for (flag, value) in &row.flags {
            let (code, stderr) = run(subcommand, base, flag, value.as_deref());
            let usage_error = code == Some(2);
            let ok = match row.answer.as_str() {
                REFUSED => {
                    let why = stderr.split_once(&format!("error: {flag}")).map(|(_, w)| w.trim());
                    usage_error && why.is_some_and(|w| w.len() > 20)
                }
                answer => !usage_error && (answer == SAME || mentions(help, flag)),
            };
            if !ok {
                let last = stderr.lines().find(|l| l.starts_with("error")).unwrap_or_default();
                failures.push(format!("{flag} {value:?} ({}): exit {code:?}: {last}", row.answer));
            }
        }
    }
    failures
}

fn help(subcommand: &str) -> String {
    let out = command(&[subcommand, "--help"]).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn every_llama_server_flag_has_its_answer_and_serve_gives_it() {
    let rows = table("docs/SERVING.md", "### llama-server's command line");
    let in_table: BTreeSet<String> =
        rows.iter().flat_map(|r| r.flags.iter().map(|(f, _)| f.clone())).collect();
    let server = llama_flags("server");
    let missing: Vec<_> = server.difference(&in_table).collect();
    assert!(missing.is_empty(), "llama-server flags without an answer in docs/SERVING.md: {missing:?}");
    let unknown: Vec<_> = in_table.difference(&server).collect();
    assert!(unknown.is_empty(), "docs/SERVING.md answers flags llama-server does not have: {unknown:?}");
    let base: &[(&[&str], &str)] = &[(&["-m", "--model"], NO_MODEL)];
    let failures = check_answers("serve", &rows, base, &help("serve"));
    assert!(failures.is_empty(), "treespec serve does not give the table's answer:\n{}", failures.join("\n"));
}

#[test]
fn generate_gives_its_table_answers_for_llama_clis_common_flags() {
    let rows = table("docs/RUN.md", "### llama-completion's and llama-cli's command line");
    let in_table: BTreeSet<String> =
        rows.iter().flat_map(|r| r.flags.iter().map(|(f, _)| f.clone())).collect();
    let llama: BTreeSet<String> = llama_flags("completion").union(&llama_flags("cli")).cloned().collect();
    let unknown: Vec<_> = in_table.difference(&llama).collect();
    assert!(unknown.is_empty(), "docs/RUN.md answers flags llama.cpp's tools do not have: {unknown:?}");
    let common =
        "-m -p -f -n -c -t -s --temp --top-k --top-p --min-p -ngl -fa -ctk -ctv -md --jinja --chat-template";
    let missing: Vec<_> = common.split(' ').filter(|f| !in_table.contains(*f)).collect();
    assert!(missing.is_empty(), "docs/RUN.md has no answer for {missing:?}");
    let base: &[(&[&str], &str)] =
        &[(&["-m", "--model"], NO_MODEL), (&["-p", "--prompt", "-f", "--file"], "hello")];
    let failures = check_answers("generate", &rows, base, &help("generate"));
    assert!(
        failures.is_empty(),
        "treespec generate does not give the table's answer:\n{}",
        failures.join("\n")
    );
}
