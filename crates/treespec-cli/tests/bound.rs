//! `treespec bound --lanes N`: the chain bound for N requests decoding together, with the draft
//! model alone per request and batched across them, on the real binary and SmolLM2.

mod common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(300);

#[test]
fn bound_prices_a_batch_of_requests_and_refuses_zero_lanes() {
    let Some(model) = model() else { return };
    let m = model.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["bound", "-m", m, "--draft", m, "-t", "1", "--max-k", "4"];
        args.extend_from_slice(extra);
        let run = treespec(&args, LIMIT);
        assert!(run.exited_cleanly(), "{run:#?}");
        (run.code, run.stdout, run.stderr)
    };
    let (code, _, err) = run(&["--lanes", "0"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--lanes must be at least 1"), "{err}");

    let (code, out, err) = run(&["--lanes", "4", "--acceptance", "0.9"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("4 request(s) decoding plain together"), "{out}");
    for row in
        ["| free draft", "| draft model, each request alone |", "| draft model, batched across the 4 |"]
    {
        assert_eq!(out.matches(row).count(), 2, "measured and perfect rows of {row}: {out}");
    }
    // Every row's best includes k = 0 (the batch decoding plain), and at equal acceptance a free
    // draft does at least as well as any draft model, alone or batched.
    let best = |name: &str, label: &str| -> f64 {
        let line = out.lines().find(|l| l.starts_with(name) && l.contains(label)).unwrap();
        line.split('|').nth(7).unwrap().trim().trim_end_matches('×').parse().unwrap()
    };
    for label in ["| measured |", "| perfect |"] {
        let free = best("| free draft", label);
        for model in ["| draft model, each request alone", "| draft model, batched"] {
            let m = best(model, label);
            assert!(m >= 1.0 && free >= m, "{model} {label}: {m} vs free {free}: {out}");
        }
    }
    // A long context makes every row dearer: plain decoding is slower there, and the bound
    // says by how much per row.
    let plain_rate = |out: &str| -> f64 {
        let line = out.lines().find(|l| l.contains("decoding plain together")).unwrap();
        line.rsplit(", ").next().unwrap().trim_end_matches(" tok/s").parse().unwrap()
    };
    let (code, long, err) = run(&["--lanes", "4", "--context", "1800"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(long.contains("context 1800 tokens: +"), "{long}");
    assert!(plain_rate(&long) <= plain_rate(&out), "{long}\n{out}");
}
