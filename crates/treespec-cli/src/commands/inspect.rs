//! `treespec inspect MODEL.gguf`: what a model file is, before running it.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use treespec_llama::{LlamaModel, LoadOptions};

/// Options of `treespec inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The GGUF file.
    pub model: PathBuf,
    /// Also list every metadata key (long arrays abbreviated).
    #[arg(long)]
    pub all: bool,
}

/// Run `inspect`.
pub fn run(args: InspectArgs) -> Result<()> {
    let opts = LoadOptions { ctx_size: 256, n_seq_max: 1, ..LoadOptions::default() };
    let model =
        LlamaModel::load(&args.model, opts).with_context(|| format!("loading {}", args.model.display()))?;
    let i = model.info();
    let tok = |t: Option<u32>| {
        t.map(|t| format!("{t} {:?}", model.token_text(t).unwrap_or_default()))
            .unwrap_or_else(|| "none".into())
    };
    println!("file          {} ({:.1} MiB)", args.model.display(), i.file_bytes as f64 / 1048576.0);
    println!("name          {}", i.name.as_deref().unwrap_or("-"));
    println!("architecture  {}", i.architecture.as_deref().unwrap_or("-"));
    println!("description   {}", i.description);
    println!("quantization  {}", i.file_type);
    println!(
        "parameters    {:.1} M ({:.1} MiB of tensors)",
        i.n_params as f64 / 1e6,
        i.tensor_bytes as f64 / 1048576.0
    );
    println!(
        "layers        {} (width {}, {} heads, {} KV heads)",
        i.n_layer, i.n_embd, i.n_head, i.n_head_kv
    );
    println!("train context {}", i.n_ctx_train);
    let devices = treespec_llama::devices::devices()?;
    let names: Vec<String> = devices.iter().map(|d| format!("{} ({})", d.name, d.description)).collect();
    println!("devices       {} (`-ngl N` offloads N layers to a GPU)", names.join(", "));
    println!("tokenizer     {} with {} tokens; add BOS: {}", i.vocab_type, i.vocab_size, i.add_bos);
    println!("special       BOS {} | EOS {} | EOT {}", tok(i.bos), tok(i.eos), tok(i.eot));
    match model.chat_template() {
        Some(t) => println!("chat template {} characters:\n{}", t.len(), indent(&t)),
        None => println!("chat template none (use prompts without --chat)"),
    }
    if args.all {
        println!("metadata:");
        for (k, v) in model.metadata() {
            let v = if v.len() > 120 {
                format!("{}… ({} chars)", &v[..v.floor_char_boundary(117)], v.len())
            } else {
                v
            };
            println!("  {k} = {v}");
        }
    }
    Ok(())
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("    {l}")).collect::<Vec<_>>().join("\n")
}
