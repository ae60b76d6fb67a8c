//! `sessions.svg`: each server's whole-session speed (time to first token and decode, every
//! request) over the baseline server's, per workload.

use anyhow::Result;
use plotters::prelude::*;

use super::summary::SessionRow;
use crate::report::svg::{bar_axes, chart_err, draw_legend, draw_one_and_groups, LEGEND_W, PALETTE};

/// Grouped bars: workloads (groups) × servers (bars), with a line at 1× (the baseline).
pub fn sessions_svg(rows: &[SessionRow], servers: &[String], baseline: &str) -> Result<String> {
    let mut workloads: Vec<&str> = Vec::new();
    for r in rows {
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    let value =
        |w: &str, s: &str| rows.iter().find(|r| r.workload == w && r.server == s)?.session_vs_baseline;
    let top = rows.iter().filter_map(|r| r.session_vs_baseline).fold(1.0f64, f64::max);
    let y_max = (top * 1.15).max(1.2);
    let width = (LEGEND_W as usize + 80 + 26 * workloads.len() * (servers.len() + 1)).clamp(760, 2600) as u32;
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (width, 440)).into_drawing_area();
        root.fill(&WHITE).map_err(chart_err)?;
        let caption = format!("Whole sessions (time to first token + decode) over {baseline}");
        let mut chart = bar_axes(&root, &caption, workloads.len(), y_max, "speed (×)")?;
        let bw = 0.8 / servers.len().max(1) as f64;
        for (j, s) in servers.iter().enumerate() {
            let color = PALETTE[j % PALETTE.len()];
            let bars = workloads.iter().enumerate().filter_map(|(i, w)| {
                let v = value(w, s)?;
                let x0 = i as f64 + 0.1 + j as f64 * bw;
                Some(Rectangle::new([(x0 + bw * 0.06, 0.0), (x0 + bw * 0.94, v)], color.filled()))
            });
            chart.draw_series(bars).map_err(chart_err)?;
        }
        draw_one_and_groups(&root, &mut chart, &workloads)?;
        let items: Vec<(String, RGBColor, bool)> =
            servers.iter().enumerate().map(|(j, s)| (s.clone(), PALETTE[j % PALETTE.len()], true)).collect();
        draw_legend(
            &root,
            &items,
            width,
            "bars: median session tokens/s ÷ the baseline's, over the same sessions",
        )?;
        root.present().map_err(chart_err)?;
    }
    Ok(buf)
}
