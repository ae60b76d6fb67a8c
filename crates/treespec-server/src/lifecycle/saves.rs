//! Saving the tenants' suffix histories: every period while serving, and at the stop.

use std::sync::Arc;
use std::time::Duration;

use crate::histories::{Saved, TenantHistories};

/// Print what a save wrote; the error (with every history tried) is the caller's.
pub fn report_saves(saved: anyhow::Result<Vec<Saved>>) -> anyhow::Result<()> {
    for s in saved? {
        let Some(path) = &s.history else { continue };
        let merged = match s.merged {
            0 => String::new(),
            n => format!(", {n} document(s) another server saved merged in"),
        };
        eprintln!(
            "treespec serve: saved the suffix history ({} tokens{merged}) to {}",
            s.tokens,
            path.display()
        );
        if let Some(why) = &s.replaced {
            eprintln!(
                "treespec serve: warning: {} could not be merged ({why}); it was replaced",
                path.display()
            );
        }
        if s.prices_kept {
            eprintln!(
                "treespec serve: the learned prices beside {} hold more trials than ours: kept",
                path.display()
            );
        }
    }
    Ok(())
}

/// A thread that saves the changed histories every period, until dropped.
pub struct PeriodicSave {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PeriodicSave {
    /// Save `histories` every `every` from now on.
    pub fn start(histories: Arc<TenantHistories>, every: Duration) -> Self {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                if let Err(e) = report_saves(histories.save_changed()) {
                    eprintln!("treespec serve: warning: {e:#} (will try again)");
                }
            }
        });
        Self { stop: Some(stop), thread: Some(thread) }
    }
}

impl Drop for PeriodicSave {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
