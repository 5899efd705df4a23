//! The report's charts, drawn as inline SVG: memory against capacity,
//! where a step's time goes, and the simulated pipeline timeline.

use super::page::{esc, legend, open_section};
use super::Facts;
use crate::simulate;
use crate::units::{binary, seconds};
use autopar_cost_models::memory::MemoryBreakdown;
use autopar_planner::Plan;
use autopar_sim::{Activity, TimelineRow};
use std::fmt::Write;

/// Left column (labels) and bar area widths, in pixels.
const LABEL: f64 = 110.0;
const BARS: f64 = 820.0;

const MEMORY_COLOURS: [&str; 5] = ["#4e79a7", "#59a14f", "#f28e2b", "#e15759", "#b07aa1"];
const TIME_COLOURS: [&str; 8] = [
    "#4e79a7", "#e15759", "#ff9da7", "#9c755f", "#edc948", "#bab0ac", "#76b7b2", "#b07aa1",
];

fn activity_colour(a: Activity) -> &'static str {
    match a {
        Activity::Forward => "#4e79a7",
        Activity::Backward => "#59a14f",
        Activity::Recompute => "#f28e2b",
        Activity::Optimizer => "#b07aa1",
        Activity::Other => "#9d9d9d",
        Activity::TensorComm => "#e15759",
        Activity::ContextComm => "#ff9da7",
        Activity::ExpertComm => "#9c755f",
        Activity::DataComm => "#edc948",
        Activity::Pipeline => "#dfe3ea",
    }
}

/// Pixels per unit of a chart, and how its values read.
struct Scale<'a> {
    px: f64,
    unit: &'a dyn Fn(f64) -> String,
}

/// One stacked bar at `y` of height `h`: `parts` (name, value) from x = LABEL.
fn stacked_bar(
    out: &mut String,
    (y, h): (f64, f64),
    label: &str,
    parts: &[(&str, f64)],
    colours: &[&str],
    scale: &Scale,
) {
    let _ = write!(
        out,
        "<text x=\"0\" y=\"{:.1}\">{}</text>",
        y + h - 2.0,
        esc(label)
    );
    let mut x = LABEL;
    for (i, &(name, v)) in parts.iter().enumerate() {
        let w = v * scale.px;
        if w <= 0.0 {
            continue;
        }
        let _ = write!(
            out,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" fill=\"{}\"><title>{}: {}</title></rect>",
            colours[i % colours.len()],
            esc(name),
            (scale.unit)(v)
        );
        x += w;
    }
    let total: f64 = parts.iter().map(|p| p.1).sum();
    let _ = write!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
        x + 4.0,
        y + h - 2.0,
        (scale.unit)(total)
    );
}

/// A vertical marker line across the chart with a label at the top.
fn marker(out: &mut String, x: f64, height: f64, label: &str, colour: &str) {
    let _ = write!(
        out,
        "<line x1=\"{x:.1}\" y1=\"-4\" x2=\"{x:.1}\" y2=\"{height:.1}\" stroke=\"{colour}\" stroke-dasharray=\"4 3\"/><text x=\"{:.1}\" y=\"-7\" fill=\"{colour}\">{}</text>",
        x - 40.0,
        esc(label)
    );
}

/// Memory per GPU by term against capacity: the peak stage as the plan's
/// estimate gives it, then every stage.
pub(super) fn memory(out: &mut String, plan: &Plan, facts: &Facts) {
    let e = &plan.predicted;
    let capacity = plan.inputs.cluster.memory_bytes;
    let limit = capacity * plan.inputs.max_memory_fraction;
    open_section(
        out,
        "memory",
        "Memory per GPU",
        &format!(
            "Stage {} peaks at {} of {} ({:.0} %); the search allowed {} ({:.0} % of capacity).",
            e.memory_peak_stage,
            binary(e.memory_per_gpu_bytes),
            binary(capacity),
            100.0 * e.memory_per_gpu_bytes / capacity,
            binary(limit),
            100.0 * plan.inputs.max_memory_fraction
        ),
    );
    let parts_of = |m: &MemoryBreakdown| m.parts().to_vec();
    let names = e.memory.parts().map(|(n, _)| n);
    legend(
        out,
        &names
            .iter()
            .zip(MEMORY_COLOURS)
            .map(|(n, c)| (c.to_string(), n.to_string()))
            .collect::<Vec<_>>(),
    );
    let mut rows: Vec<(String, Vec<(&str, f64)>)> = vec![(
        format!("peak (stage {})", e.memory_peak_stage),
        parts_of(&e.memory),
    )];
    if facts.stage_memory.len() > 1 {
        rows.extend(
            facts
                .stage_memory
                .iter()
                .enumerate()
                .map(|(k, m)| (format!("stage {k}"), parts_of(m))),
        );
    }
    let most = rows
        .iter()
        .map(|(_, p)| p.iter().map(|x| x.1).sum::<f64>())
        .fold(capacity, f64::max);
    let scale = Scale {
        px: BARS / most,
        unit: &binary,
    };
    let (h, pitch) = (12.0, 16.0);
    let height = rows.len() as f64 * pitch;
    let _ = write!(
        out,
        "<svg id=\"memory-bars\" width=\"{:.0}\" height=\"{:.0}\" viewBox=\"0 -20 {:.0} {:.0}\">",
        LABEL + BARS + 80.0,
        height + 20.0,
        LABEL + BARS + 80.0,
        height + 20.0
    );
    for (i, (label, parts)) in rows.iter().enumerate() {
        stacked_bar(out, (i as f64 * pitch, h), label, parts, &MEMORY_COLOURS, &scale);
    }
    marker(
        out,
        LABEL + capacity * scale.px,
        height,
        &format!("capacity {}", binary(capacity)),
        "#c0392b",
    );
    if plan.inputs.max_memory_fraction < 1.0 {
        marker(out, LABEL + limit * scale.px, height, "limit", "#8a5a00");
    }
    out.push_str("</svg></section>\n");
}

/// Where a step's time goes: the estimate's terms as a bar and a table,
/// and the simulated step's terms beside them.
pub(super) fn time(out: &mut String, plan: &Plan, facts: &Facts) {
    let e = &plan.predicted;
    open_section(
        out,
        "time",
        "Where a step's time goes",
        &format!(
            "The estimate's {} step on the slowest stage, term by term.",
            seconds(e.step_time_s)
        ),
    );
    let parts = e.breakdown.parts();
    legend(
        out,
        &parts
            .iter()
            .zip(TIME_COLOURS)
            .filter(|((_, t), _)| *t > 0.0)
            .map(|((n, _), c)| (c.to_string(), n.to_string()))
            .collect::<Vec<_>>(),
    );
    let _ = write!(
        out,
        "<svg id=\"time-bar\" width=\"{:.0}\" height=\"22\" viewBox=\"0 0 {:.0} 22\">",
        LABEL + BARS + 80.0,
        LABEL + BARS + 80.0
    );
    let scale = Scale {
        px: BARS / e.step_time_s.max(1e-30),
        unit: &seconds,
    };
    stacked_bar(out, (2.0, 16.0), "estimate", &parts, &TIME_COLOURS, &scale);
    out.push_str("</svg><table id=\"time-table\"><tr><th>term</th><th class=\"n\">seconds</th><th class=\"n\">share</th></tr>");
    for (name, t) in parts.iter().filter(|(_, t)| *t > 0.0) {
        let _ = write!(
            out,
            "<tr><td>{name}</td><td class=\"n\">{}</td><td class=\"n\">{:.1} %</td></tr>",
            seconds(*t),
            100.0 * t / e.step_time_s
        );
    }
    out.push_str("</table>");
    if let Some(s) = &facts.simulated {
        let _ = write!(
            out,
            "<p>Replayed ({}), the step takes {} against the estimate's {}:</p><table id=\"sim-terms\"><tr><th>term</th><th class=\"n\">estimate</th><th class=\"n\">simulated</th></tr>",
            simulate::pricing(s.per_node),
            seconds(s.sim.step_time_s),
            seconds(s.analytic.step_time_s)
        );
        for t in s
            .sim
            .terms(&s.analytic.breakdown)
            .iter()
            .filter(|t| t.analytic_s > 0.0 || t.simulated_s > 0.0)
        {
            let _ = write!(
                out,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                esc(&t.term),
                seconds(t.analytic_s),
                seconds(t.simulated_s)
            );
        }
        out.push_str("</table>");
    }
    out.push_str("</section>\n");
}

/// Timeline cells across the step: fine enough to show micro-batches,
/// coarse enough that a 64-stage plan stays small.
const CELLS: usize = 600;
const ROWS: usize = 32;

/// The simulated step of one rank per stage (at most [`ROWS`]): what its
/// compute stream did over time, one rect per run of equal cells.
pub(super) fn timeline(out: &mut String, facts: &Facts) {
    let Some(s) = &facts.simulated else {
        return;
    };
    let sim = &s.sim;
    let rows = sim.timeline_rows(CELLS, ROWS);
    open_section(
        out,
        "timeline",
        "Simulated pipeline timeline",
        &format!(
            "One simulated step ({}), {:.1} % of it idle in the pipeline on average. {}{}",
            seconds(sim.step_time_s),
            100.0 * sim.bubble_fraction,
            simulate::representatives(sim).map_or(String::new(), |r| format!("The simulator {r}. ")),
            if rows.len() < sim.per_rank.len() {
                format!("{} of {} stages shown.", rows.len(), sim.per_rank.len())
            } else {
                String::new()
            }
        ),
    );
    legend(
        out,
        &Activity::ALL
            .iter()
            .map(|&a| (activity_colour(a).to_string(), a.name().to_string()))
            .collect::<Vec<_>>(),
    );
    timeline_svg(out, "timeline-svg", &rows, sim.step_time_s);
    // Whole-step cells are coarser than one micro-batch of a long
    // pipeline; the warm-up, drawn alone, shows the schedule.
    let zoom = 2.0 * sim.warmed_up_s();
    let stages = sim.per_rank.iter().map(|r| r.stage).max().unwrap_or(0) + 1;
    if stages > 1 && zoom > 0.0 && zoom < 0.5 * sim.step_time_s {
        let _ = write!(
            out,
            "<p>The first {} of the step: the pipeline fills, then forward and backward passes alternate.</p>",
            seconds(zoom)
        );
        timeline_svg(
            out,
            "warmup-svg",
            &sim.timeline_rows_until(zoom, CELLS, ROWS),
            zoom,
        );
    }
    out.push_str("</section>\n");
}

/// Timeline rows over `span_s` seconds as an SVG: one rect per run of
/// equal cells, and a time axis.
fn timeline_svg(out: &mut String, id: &str, rows: &[TimelineRow], span_s: f64) {
    let label = LABEL + 30.0;
    let cell = BARS / CELLS as f64;
    let (h, pitch) = (13.0, 16.0);
    let height = rows.len() as f64 * pitch + 18.0;
    let width = label + BARS + 40.0;
    let _ = write!(
        out,
        "<svg id=\"{id}\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\">"
    );
    for (i, row) in rows.iter().enumerate() {
        let y = i as f64 * pitch;
        let _ = write!(
            out,
            "<text x=\"0\" y=\"{:.1}\">stage {} (rank {})</text>",
            y + h - 2.0,
            row.stage,
            row.rank
        );
        let mut start = 0;
        while start < row.cells.len() {
            let a = row.cells[start];
            let mut end = start + 1;
            while end < row.cells.len() && row.cells[end] == a {
                end += 1;
            }
            if let Some(a) = a {
                let _ = write!(
                    out,
                    "<rect x=\"{:.1}\" y=\"{y:.0}\" width=\"{:.1}\" height=\"{h:.0}\" fill=\"{}\"/>",
                    label + start as f64 * cell,
                    (end - start) as f64 * cell,
                    activity_colour(a)
                );
            }
            start = end;
        }
    }
    let axis = rows.len() as f64 * pitch + 12.0;
    for k in 0..=4 {
        let t = span_s * k as f64 / 4.0;
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{axis:.0}\">{}</text>",
            label + BARS * k as f64 / 4.0 - 12.0,
            if k == 0 { "0 s".to_string() } else { seconds(t) }
        );
    }
    out.push_str("</svg>");
}
