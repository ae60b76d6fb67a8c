//! `-t/--threads`: one parser for every subcommand, applying the backend's one rule (0 refused,
//! more than the cores capped to them, see `treespec_llama::effective_threads`) at parse time, so
//! that everything downstream — cost-curve cache keys and reports included — sees the count that
//! actually runs.

/// clap value parser for `-t N`.
pub fn threads_arg(s: &str) -> Result<usize, String> {
    let requested: usize =
        s.trim().parse().map_err(|_| format!("'{s}' is not a thread count (a whole number ≥ 1)"))?;
    let n = treespec_llama::effective_threads(requested).map_err(|e| e.to_string())?;
    if n < requested {
        eprintln!(
            "warning: -t {requested} is more than the {n} CPU cores available; using {n} (llama.cpp's \
             threads spin while waiting, so extra threads only slow decoding down)"
        );
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::threads_arg;

    #[test]
    fn one_rule_for_thread_counts() {
        assert!(threads_arg("0").unwrap_err().contains("at least 1"));
        assert!(threads_arg("-1").is_err());
        assert!(threads_arg("two").is_err());
        assert_eq!(threads_arg("1").unwrap(), 1);
        assert_eq!(threads_arg("100000").unwrap(), treespec_llama::available_cores());
    }
}
