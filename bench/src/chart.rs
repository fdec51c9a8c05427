//! The chart next to the table: ops/s of every case, one group of bars per case, a bar per
//! store/server and concurrency (log scale: the rates span four orders of magnitude).

use plotters::prelude::*;

use crate::harness::Row;

/// Bars for the cases people compare: ours, and every naive baseline (rows whose case starts
/// with `naive`).
const CASES: [&str; 5] = ["first execution", "replay", "replay, cached", "conflict", "transactional first"];

/// The rows of a table the benchmark printed (case, store, commit, tasks, ops/s, ...).
/// Where the rate axis starts: every rate is far above it.
const FLOOR: f64 = 1000.0;

pub fn rows_of_table(text: &str) -> Vec<Row> {
    text.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let (case, store, concurrency, ops) = (cells.get(1)?, cells.get(2)?, cells.get(4)?, cells.get(5)?);
            Some(Row {
                case: case.to_string(),
                store: Box::leak(store.to_string().into_boxed_str()),
                concurrency: concurrency.parse().ok()?,
                ops_per_sec: ops.parse().ok()?,
                ..Row::default()
            })
        })
        .collect()
}

pub fn write(path: &str, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(dir) = std::path::Path::new(path).parent() {
        std::fs::create_dir_all(dir)?;
    }
    // The cases and the (store, tasks) series shown, in the table's order.
    let (mut cases, mut series): (Vec<&str>, Vec<(&'static str, usize)>) = (Vec::new(), Vec::new());
    for r in rows.iter().filter(|r| CASES.contains(&r.case.as_str()) || r.case.starts_with("naive")) {
        if !cases.contains(&r.case.as_str()) {
            cases.push(r.case.as_str());
        }
        if !series.contains(&(r.store, r.concurrency)) {
            series.push((r.store, r.concurrency));
        }
    }
    let top = rows.iter().map(|r| r.ops_per_sec).fold(1.0, f64::max) * 2.0;
    let slot = series.len().max(1) as f64 + 1.0;
    let height = 80 + cases.len() as u32 * (series.len() as u32 * 7 + 14);
    let root = SVGBackend::new(path, (1200, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (plot, legend) = root.split_horizontally(1000);
    // Cases top to bottom, as in the table; bars grow to the right.
    let at = |i: usize| (cases.len() - 1 - i) as f64;
    let mut chart = ChartBuilder::on(&plot)
        .caption("ops/s by case, store/server and tasks (log scale; longer is better)", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(190)
        .build_cartesian_2d((FLOOR..top).log_scale(), 0.0..cases.len() as f64)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(cases.len() * 2 + 1)
        .y_label_formatter(&|y| {
            let i = (y - 0.5).round();
            if (y - 0.5 - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < cases.len() {
                cases[cases.len() - 1 - i as usize].to_string()
            } else {
                String::new()
            }
        })
        .y_label_style(("sans-serif", 13))
        .x_desc("ops/s")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    let color = |i: usize| Palette99::pick(i).to_rgba();
    for (s, (store, concurrency)) in series.iter().enumerate() {
        let bars = cases.iter().enumerate().filter_map(|(ci, case)| {
            let row = rows.iter().find(|r| r.case == *case && r.store == *store && r.concurrency == *concurrency)?;
            // The first series on top within its case.
            let y1 = at(ci) + 1.0 - (s as f64 + 0.5) / slot;
            let y0 = y1 - 1.0 / slot;
            Some(Rectangle::new([(FLOOR, y0), (row.ops_per_sec.max(FLOOR), y1)], color(s).filled()))
        });
        chart.draw_series(bars)?;
    }
    for (s, (store, concurrency)) in series.iter().enumerate() {
        let y = 40 + s as i32 * 22;
        legend.draw(&Rectangle::new([(10, y), (26, y + 14)], color(s).filled()))?;
        let tasks = if *concurrency == 1 { "task" } else { "tasks" };
        legend.draw(&Text::new(format!("{store}, {concurrency} {tasks}"), (32, y), ("sans-serif", 13)))?;
    }
    root.present()?;
    Ok(())
}
