//! The harness end to end on toy models (no model files): a `bench --quick`-style run, the files it
//! writes, the JSON schema, and that the reported speed-up is the ratio of the reported medians.

// Tests are exempt from the 80-line limit (clippy.toml): a test reads top to bottom as one story.
#![allow(clippy::too_many_lines)]

use std::path::PathBuf;

use serde_json::Value;
use treespec_bench::prompts::parse_prompts;
use treespec_bench::{
    compare_text, run_bench, select, summarize, write_all, BenchConfig, BenchMethod, MachineInfo,
    MethodConfig, ProgressMode, Results, RunConfig, SamplingConfig, Selection, ToyBackend, ALL, SCHEMA,
};
use treespec_core::sampling::SamplingParams;
use treespec_engine::drafters::LookupConfig;
use treespec_engine::Method;

const PROMPTS: &str = r#"{"question_id": 1, "category": "writing", "turns": ["Write a poem about the sea.", "Shorter."]}
{"question_id": 2, "category": "writing", "turns": ["Write a haiku about rain."]}
{"question_id": 3, "category": "math", "turns": ["What is 17 times 23?"]}
{"question_id": 4, "category": "math", "turns": ["Solve x^2 = 49."]}
{"question_id": 5, "category": "qa", "turns": ["Who wrote Hamlet?"]}
{"question_id": 6, "category": "qa", "turns": ["What is the capital of Peru?"]}
{"question_id": 7, "category": "qa", "turns": ["How far is the moon?"]}
"#;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("treespec-bench-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn run_toy(repeat: usize, temperature: f32) -> Results {
    let all = parse_prompts(PROMPTS).unwrap();
    let prompts = select(&all, &Selection { limit: Some(6), ..Default::default() }).unwrap();
    assert_eq!(prompts.len(), 6);
    let methods = vec![
        BenchMethod::new(Method::Plain),
        BenchMethod::new(Method::Chain { k: 3 }),
        BenchMethod::new(Method::Tree { widths: vec![2, 2, 1] }),
        BenchMethod::new(Method::Lookup { config: LookupConfig::default(), table: None }),
    ];
    let cfg = RunConfig {
        methods: methods.clone(),
        max_new_tokens: 48,
        sampling: SamplingParams::with_temperature(temperature),
        seed: 7,
        repeat,
        warmup: true,
        progress: ProgressMode::Quiet,
    };
    let mut backend = ToyBackend::new(24, 2, 0.7, 3, 512);
    let out = run_bench(&mut backend, &prompts, &cfg).unwrap();
    let summary = summarize(&out.runs);
    Results {
        schema: SCHEMA.into(),
        machine: MachineInfo::collect(1, vec![]),
        config: BenchConfig {
            backend: "toy".into(),
            prompts_file: "inline".into(),
            n_prompts: prompts.len(),
            max_new_tokens: cfg.max_new_tokens,
            sampling: SamplingConfig {
                temperature,
                top_p: 1.0,
                repetition_penalty: 1.0,
                ..Default::default()
            },
            seed: cfg.seed,
            repeat,
            warmup: true,
            methods: methods
                .iter()
                .map(|m| MethodConfig { name: m.name.clone(), spec: format!("{:?}", m.method) })
                .collect(),
            options: serde_json::json!({}),
            elapsed_s: out.elapsed.as_secs_f64(),
            warmup_s: out.warmup.as_secs_f64(),
            ..Default::default()
        },
        runs: out.runs,
        summary,
    }
}

#[test]
fn quick_style_toy_run_writes_the_schema_and_consistent_speedups() {
    let results = run_toy(3, 0.0);
    let dir = out_dir("quick");
    let files = write_all(&dir, &results).unwrap();
    assert_eq!(files.len(), 4);

    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(json["schema"], SCHEMA);
    for key in ["cpu", "logical_cpus", "threads", "os", "arch", "treespec_version", "models"] {
        assert!(json["machine"].get(key).is_some(), "machine.{key} missing");
    }
    for key in ["backend", "prompts_file", "max_new_tokens", "sampling", "seed", "repeat", "methods"] {
        assert!(json["config"].get(key).is_some(), "config.{key} missing");
    }
    let runs = json["runs"].as_array().unwrap();
    // 6 prompts × 4 methods × 3 repeats, interleaved: plain, chain, tree, lookup, plain, …
    assert_eq!(runs.len(), 72);
    let order: Vec<&str> = runs[..8].iter().map(|r| r["method"].as_str().unwrap()).collect();
    assert_eq!(order, ["plain", "chain", "tree", "lookup", "plain", "chain", "tree", "lookup"]);
    assert_eq!(runs[0]["prompt_id"], runs[4]["prompt_id"]);
    assert_eq!((runs[0]["repeat"].as_u64(), runs[4]["repeat"].as_u64()), (Some(0), Some(1)));
    for r in runs {
        for key in [
            "method",
            "prompt_id",
            "category",
            "new_tokens",
            "wall_s",
            "tokens_per_s",
            "target_forwards",
            "draft_forwards",
            "mean_accepted",
            "identical_to_plain",
            "first_divergence",
            "extra",
        ] {
            assert!(r.get(key).is_some(), "runs[].{key} missing in {r}");
        }
        // Toy models are exact: every method reproduces plain at temperature 0.
        assert_eq!(r["identical_to_plain"], true, "{r}");
        assert_eq!(r["new_tokens"], 48);
    }
    // Speculation on the toy pair pays off in forwards (the draft is close to the target).
    let chain_all = results.row("chain", ALL).unwrap();
    assert!(chain_all.mean_accepted > 1.2, "{chain_all:?}");

    let summary = json["summary"].as_array().unwrap();
    // 4 methods × (all + writing, math, qa).
    assert_eq!(summary.len(), 16);
    let cats: Vec<&str> =
        summary.iter().filter(|r| r["method"] == "plain").map(|r| r["category"].as_str().unwrap()).collect();
    assert_eq!(cats, [ALL, "writing", "math", "qa"]);
    for row in summary {
        for key in [
            "method",
            "category",
            "n_runs",
            "tokens_per_s",
            "tokens_per_s_min",
            "tokens_per_s_max",
            "speedup_vs_plain",
            "speedup_min",
            "speedup_max",
            "mean_accepted",
            "accept_rate_by_depth",
            "draft_ms_per_step",
            "verify_ms_per_step",
        ] {
            assert!(row.get(key).is_some(), "summary[].{key} missing in {row}");
        }
        let plain =
            summary.iter().find(|p| p["method"] == "plain" && p["category"] == row["category"]).unwrap();
        let (tps, plain_tps) =
            (row["tokens_per_s"].as_f64().unwrap(), plain["tokens_per_s"].as_f64().unwrap());
        let speedup = row["speedup_vs_plain"].as_f64().unwrap();
        assert!((speedup - tps / plain_tps).abs() <= 1e-9 * speedup, "{row}");
        assert!(close(row["plain_tokens_per_s"].as_f64().unwrap(), plain_tps));
        // The medians are the medians of the runs the row says it aggregates.
        let group: Vec<f64> = runs
            .iter()
            .filter(|r| {
                r["method"] == row["method"] && (row["category"] == ALL || r["category"] == row["category"])
            })
            .map(|r| r["tokens_per_s"].as_f64().unwrap())
            .collect();
        assert_eq!(group.len() as u64, row["n_runs"].as_u64().unwrap());
        // (JSON numbers read back within an ulp or so: compare with a relative tolerance.)
        assert!(close(tps, treespec_bench::median(&group)), "{row}");
        let lo = group.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = group.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(
            (row["tokens_per_s_min"].as_f64().unwrap(), row["tokens_per_s_max"].as_f64().unwrap()),
            (lo, hi)
        );
        let (smin, smax) = (row["speedup_min"].as_f64().unwrap(), row["speedup_max"].as_f64().unwrap());
        assert!(smin <= smax);
        if row["method"] == "plain" {
            assert_eq!((speedup, smin, smax), (1.0, 1.0, 1.0));
        }
        assert_eq!(row["identical_runs"], row["n_runs"]);
    }

    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(md.contains("| method | all | writing | math | qa |"), "{md}");
    assert!(md.contains("| chain |") && md.contains("18/18"), "{md}");
    for svg in ["speedup.svg", "acceptance.svg"] {
        let text = std::fs::read_to_string(dir.join(svg)).unwrap();
        assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"), "{svg}");
        assert!(text.lines().any(|l| l.trim() == "chain"), "{svg} lacks the legend");
    }
    let speed = std::fs::read_to_string(dir.join("speedup.svg")).unwrap();
    let labels: Vec<&str> = speed.lines().map(str::trim).collect();
    assert!(labels.contains(&"math") && labels.contains(&"all"), "category labels missing");

    // The file reads back, and compares with itself as "no change".
    let back = Results::load(&dir).unwrap();
    assert_eq!(back.summary.len(), results.summary.len());
    for (x, y) in back.summary.iter().zip(&results.summary) {
        assert_eq!((&x.method, &x.category, x.n_runs), (&y.method, &y.category, y.n_runs));
        assert!(close(x.tokens_per_s, y.tokens_per_s));
    }
    let text = compare_text(&back, &results, "A", "B");
    assert!(text.contains("same models, machine, prompts and settings"), "{text}");
    assert!(text.contains("+0.0%"), "{text}");
    if std::env::var_os("TREESPEC_BENCH_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn sampling_runs_are_not_checked_for_identity() {
    let results = run_toy(1, 1.0);
    assert!(results.runs.iter().all(|r| r.identical_to_plain.is_none() && r.first_divergence.is_none()));
    assert!(results.summary.iter().all(|r| r.identical_runs.is_none()));
    let dir = out_dir("sampled");
    write_all(&dir, &results).unwrap();
    let md = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(md.contains("unchecked (temp > 0)"), "{md}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn runner_rejects_bad_configs_with_clear_errors() {
    let prompts = parse_prompts(PROMPTS).unwrap();
    let mut backend = ToyBackend::new(24, 2, 0.7, 3, 64);
    let mut cfg = RunConfig {
        methods: vec![BenchMethod::new(Method::Chain { k: 2 })],
        max_new_tokens: 8,
        sampling: SamplingParams::with_temperature(0.0),
        seed: 0,
        repeat: 1,
        warmup: false,
        progress: ProgressMode::Quiet,
    };
    let e = run_bench(&mut backend, &prompts, &cfg).unwrap_err().to_string();
    assert!(e.contains("first method must be plain"), "{e}");
    cfg.methods.insert(0, BenchMethod::new(Method::Plain));
    cfg.max_new_tokens = 60;
    let e = format!("{:#}", run_bench(&mut backend, &prompts, &cfg).unwrap_err());
    assert!(e.contains("does not fit the context of 64"), "{e}");
    cfg.max_new_tokens = 8;
    cfg.methods.push(BenchMethod::new(Method::Chain { k: 0 }));
    let e = format!("{:#}", run_bench(&mut backend, &prompts, &cfg).unwrap_err());
    assert!(e.contains("chain on prompt 1"), "{e}");
}

#[test]
fn plain_decodings_tokens_are_kept_per_prompt_and_repeat_and_written_as_json_lines() {
    let all = parse_prompts(PROMPTS).unwrap();
    let prompts = select(&all, &Selection { limit: Some(3), ..Default::default() }).unwrap();
    let cfg = RunConfig {
        methods: vec![BenchMethod::new(Method::Plain), BenchMethod::new(Method::Chain { k: 3 })],
        max_new_tokens: 20,
        sampling: SamplingParams::greedy(),
        seed: 1,
        repeat: 2,
        warmup: false,
        progress: ProgressMode::Quiet,
    };
    let mut backend = ToyBackend::new(24, 2, 0.7, 3, 512);
    let out = run_bench(&mut backend, &prompts, &cfg).unwrap();
    assert_eq!(out.plain_texts.len(), prompts.len() * 2, "one per prompt and repeat, plain only");
    let plain_runs: Vec<_> = out.runs.iter().filter(|r| r.method == "plain").collect();
    for (t, r) in out.plain_texts.iter().zip(&plain_runs) {
        assert_eq!((&t.prompt_id, t.repeat), (&r.prompt_id, r.repeat));
        assert_eq!(t.prompt.len(), r.prompt_tokens);
        assert_eq!(t.output.len() as u64, r.new_tokens);
    }
    let dir = out_dir("plain-texts");
    std::fs::create_dir_all(&dir).unwrap();
    let path = treespec_bench::report::write_plain_texts(&dir, &out.plain_texts).unwrap();
    let back: Vec<treespec_bench::runner::PlainText> =
        std::fs::read_to_string(&path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(back, out.plain_texts);
    let _ = std::fs::remove_dir_all(&dir);
}
