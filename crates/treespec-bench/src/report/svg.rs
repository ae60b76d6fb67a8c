//! `speedup.svg` and `acceptance.svg` (plotters' SVG backend without a font backend: text is
//! written as SVG `<text>` and drawn by the viewer).

use anyhow::{anyhow, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use treespec_engine::METHOD_NAMES;

use crate::record::{Results, SummaryRow, ALL};

/// A stable color per method (its index among the engine's method names).
fn method_color(name: &str) -> RGBColor {
    let i = METHOD_NAMES.iter().position(|m| *m == name).unwrap_or(0);
    PALETTE[i % PALETTE.len()]
}

/// The charts' colors (matplotlib's), by index.
pub(crate) const PALETTE: [RGBColor; 11] = [
    RGBColor(127, 127, 127),
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(57, 59, 121),
];

pub(crate) fn chart_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing a chart: {e:?}")
}

pub(crate) const FONT: &str = "sans-serif";

/// Grouped bars: speed-up over plain per category (groups) and method (bars), with the paired
/// min–max spread as whiskers and a line at 1×.
pub fn speedup_svg(r: &Results) -> Result<String> {
    let cats = r.categories();
    let mut methods: Vec<String> = r.methods().into_iter().filter(|m| m != "plain").collect();
    if methods.is_empty() {
        methods.push("plain".into());
    }
    let value = |m: &str, c: &str| r.row(m, c).and_then(|row| row.speedup_vs_plain);
    let shown = r.summary.iter().filter(|row| methods.contains(&row.method));
    let top_bar = shown.clone().filter_map(|row| row.speedup_vs_plain).fold(1.0f64, f64::max);
    let top_whisker = shown.filter_map(|row| row.speedup_max).fold(top_bar, f64::max);
    // One wild run must not flatten every bar: whiskers beyond 2.5× the tallest bar are cut at the
    // top and labelled with their value.
    let y_max = (top_whisker.min(2.5 * top_bar) * 1.15).max(1.2);
    let y_cut = y_max / 1.08;
    let width = (LEGEND_W as usize + 80 + 30 * cats.len() * (methods.len() + 1)).clamp(760, 2600) as u32;
    let height = 460u32;
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(chart_err)?;
        let caption = "Speed-up over plain decoding (ratio of median tokens/s)";
        let mut chart = bar_axes(&root, caption, cats.len(), y_max, "speed-up (×)")?;
        let n = methods.len() as f64;
        let bw = 0.8 / n;
        for (j, m) in methods.iter().enumerate() {
            let color = method_color(m);
            let bars: Vec<Rectangle<(f64, f64)>> = cats
                .iter()
                .enumerate()
                .filter_map(|(i, c)| {
                    let v = value(m, c)?;
                    let x0 = i as f64 + 0.1 + j as f64 * bw;
                    Some(Rectangle::new([(x0 + bw * 0.06, 0.0), (x0 + bw * 0.94, v)], color.filled()))
                })
                .collect();
            chart.draw_series(bars).map_err(chart_err)?;
            for (i, c) in cats.iter().enumerate() {
                let Some(row) = r.row(m, c) else { continue };
                let xc = i as f64 + 0.1 + (j as f64 + 0.5) * bw;
                let bar = Bar { xc, width: bw, y_cut, y_max };
                draw_whisker_and_label(&mut chart, row, bar)?;
            }
        }
        draw_one_and_groups(&root, &mut chart, &cats)?;
        let items: Vec<(String, RGBColor, bool)> =
            methods.iter().map(|m| (m.clone(), method_color(m), true)).collect();
        let foot =
            "bars: ratio of medians; whiskers: slowest and fastest run vs plain's run of the same prompt";
        draw_legend(&root, &items, width, foot)?;
        root.present().map_err(chart_err)?;
    }
    Ok(buf)
}

/// The axes of a grouped bar chart: `groups` groups along x (labelled by the caller), 0..`y_max`
/// along y, room for the legend on the right.
pub(crate) fn bar_axes<'a, DB: DrawingBackend + 'a>(
    root: &'a DrawingArea<DB, plotters::coord::Shift>,
    caption: &str,
    groups: usize,
    y_max: f64,
    y_desc: &str,
) -> Result<ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>> {
    let mut chart = ChartBuilder::on(root)
        .caption(caption, (FONT, 20))
        .margin(12)
        .margin_right(LEGEND_W)
        .margin_bottom(22)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..groups as f64, 0f64..y_max)
        .map_err(chart_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .max_light_lines(1)
        .x_labels(0)
        .y_desc(y_desc)
        .y_label_formatter(&|v| format!("{v:.1}"))
        .label_style((FONT, 13))
        .draw()
        .map_err(chart_err)?;
    Ok(chart)
}

/// A line at 1× across the chart, and each group's name under it (placed in pixels below the
/// axis).
pub(crate) fn draw_one_and_groups<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    groups: &[impl AsRef<str>],
) -> Result<()> {
    let one =
        PathElement::new(vec![(0.0, 1.0), (groups.len() as f64, 1.0)], RGBColor(90, 90, 90).stroke_width(1));
    chart.draw_series(std::iter::once(one)).map_err(chart_err)?;
    for (i, g) in groups.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
        let style = (FONT, 13).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Top));
        root.draw(&Text::new(g.as_ref().to_string(), (px, py + 8), style)).map_err(chart_err)?;
    }
    Ok(())
}

/// Where one bar of the speed-up chart stands: its centre and width, the height where whiskers
/// are cut and the top of the axis.
#[derive(Clone, Copy)]
struct Bar {
    xc: f64,
    width: f64,
    y_cut: f64,
    y_max: f64,
}

/// A bar's min–max whisker (cut at `y_cut` with the true maximum written above) and its value.
fn draw_whisker_and_label<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    row: &SummaryRow,
    Bar { xc, width: bw, y_cut, y_max }: Bar,
) -> Result<()> {
    let mut label_y = row.speedup_vs_plain.unwrap_or(0.0);
    if let (Some(lo), Some(hi)) = (row.speedup_min, row.speedup_max) {
        if hi > lo {
            let cap = bw * 0.2;
            let (lo, cut) = (lo.min(y_cut), hi > y_cut);
            let hi = hi.min(y_cut);
            label_y = label_y.max(hi);
            if cut {
                let style = (FONT, 10).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Bottom));
                let t =
                    Text::new(format!("↑{:.1}", row.speedup_max.unwrap_or(hi)), (xc, y_max * 0.995), style);
                chart.draw_series(std::iter::once(t)).map_err(chart_err)?;
            }
            for seg in [
                vec![(xc, lo), (xc, hi)],
                vec![(xc - cap, lo), (xc + cap, lo)],
                vec![(xc - cap, hi), (xc + cap, hi)],
            ] {
                chart.draw_series(std::iter::once(PathElement::new(seg, BLACK))).map_err(chart_err)?;
            }
        }
    }
    if let Some(v) = row.speedup_vs_plain {
        let y = label_y + y_max * 0.01;
        let style = (FONT, 11).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Bottom));
        chart
            .draw_series(std::iter::once(Text::new(format!("{v:.2}"), (xc, y), style)))
            .map_err(chart_err)?;
    }
    Ok(())
}

/// Room on the right of a chart for the legend, in pixels.
pub(crate) const LEGEND_W: u32 = 150;

/// A legend in the right margin (filled boxes or lines) and a footnote along the bottom.
pub(crate) fn draw_legend<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    items: &[(String, RGBColor, bool)],
    width: u32,
    footnote: &str,
) -> Result<()> {
    let x = width as i32 - LEGEND_W as i32 + 16;
    for (i, (name, color, filled)) in items.iter().enumerate() {
        let y = 60 + 22 * i as i32;
        if *filled {
            root.draw(&Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled())).map_err(chart_err)?;
        } else {
            root.draw(&PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2)))
                .map_err(chart_err)?;
            root.draw(&Circle::new((x + 7, y), 3, color.filled())).map_err(chart_err)?;
        }
        let style = (FONT, 14).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
        root.draw(&Text::new(name.clone(), (x + 22, y), style)).map_err(chart_err)?;
    }
    let (_, h) = root.dim_in_pixel();
    let style = (FONT, 12).into_font().color(&RGBColor(80, 80, 80)).pos(Pos::new(HPos::Left, VPos::Bottom));
    root.draw(&Text::new(footnote.to_string(), (12, h as i32 - 4), style)).map_err(chart_err)?;
    Ok(())
}

/// Depths reached by fewer walks than this get hollow markers.
const FEW_WALKS: u64 = 10;

/// Lines: pooled acceptance rate at each tree depth, one line per method (over all prompts).
pub fn acceptance_svg(r: &Results) -> Result<String> {
    let rows: Vec<&SummaryRow> = r
        .summary
        .iter()
        .filter(|row| row.category == ALL && row.depth_reached.iter().any(|&n| n > 0))
        .collect();
    let depth = rows
        .iter()
        .map(|row| row.depth_reached.iter().rposition(|&n| n > 0).map_or(0, |d| d + 1))
        .max()
        .unwrap_or(0)
        .max(1);
    let mut buf = String::new();
    {
        let width = 820;
        let root = SVGBackend::with_string(&mut buf, (width, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(chart_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Acceptance rate by tree depth (all prompts)", (FONT, 20))
            .margin(12)
            .margin_right(LEGEND_W)
            .margin_bottom(24)
            .x_label_area_size(44)
            .y_label_area_size(56)
            .build_cartesian_2d(0.5f64..depth as f64 + 0.5, 0f64..1.05)
            .map_err(chart_err)?;
        chart
            .configure_mesh()
            .max_light_lines(1)
            .x_labels(depth.min(20) + 1)
            .x_label_formatter(&|v| {
                if (v - v.round()).abs() < 1e-6 && *v >= 1.0 {
                    format!("{}", v.round() as i64)
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|v| format!("{v:.1}"))
            .x_desc("depth")
            .y_desc("accepted ÷ reached")
            .label_style((FONT, 13))
            .draw()
            .map_err(chart_err)?;
        if rows.is_empty() {
            let style = (FONT, 16).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Center));
            chart
                .draw_series(std::iter::once(Text::new(
                    "no drafted tokens (plain or model-free methods only)",
                    ((depth as f64 + 1.0) / 2.0, 0.5),
                    style,
                )))
                .map_err(chart_err)?;
        }
        let mut items = Vec::new();
        for row in rows {
            let color = method_color(&row.method);
            let pts: Vec<(f64, f64, u64)> = row
                .accept_rate_by_depth
                .iter()
                .zip(&row.depth_reached)
                .enumerate()
                .filter(|(_, (_, &n))| n > 0)
                .map(|(d, (&rate, &n))| ((d + 1) as f64, rate, n))
                .collect();
            let line = pts.iter().map(|&(x, y, _)| (x, y));
            chart.draw_series(LineSeries::new(line, color.stroke_width(2))).map_err(chart_err)?;
            // Hollow markers where few walks reached the depth: the rate there is a small sample.
            let marks = pts.iter().map(|&(x, y, n)| {
                let style = if n >= FEW_WALKS { color.filled() } else { color.stroke_width(1) };
                Circle::new((x, y), 4, style)
            });
            chart.draw_series(marks).map_err(chart_err)?;
            items.push((row.method.clone(), color, false));
        }
        let foot = format!(
            "rate = walks accepted at depth d ÷ walks that reached d; hollow: fewer than {FEW_WALKS} walks reached d"
        );
        draw_legend(&root, &items, width, &foot)?;
        root.present().map_err(chart_err)?;
    }
    Ok(buf)
}
