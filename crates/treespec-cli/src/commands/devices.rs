//! `treespec devices` (llama.cpp's `--list-devices`): the compute devices this build's backends
//! find on this machine, by the names `--device` takes.

use anyhow::Result;

/// Run `devices`.
pub fn run() -> Result<()> {
    let all = treespec_llama::devices::devices()?;
    println!("Available devices:");
    for d in &all {
        let role = if d.takes_layers() { "offload with -ngl" } else { "runs what is not offloaded" };
        println!("  {d}  [{role}]");
    }
    if !all.iter().any(|d| d.takes_layers()) {
        println!("No GPU: this build runs on the CPU only; docs/GPU.md says how to build with one.");
    }
    Ok(())
}
