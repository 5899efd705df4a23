//! The report's tables: the stage map and the search's ranking.

use super::mesh::stage_colour;
use super::page::{esc, open_section};
use super::Facts;
use crate::plan::{degrees, grads, rank_ranges, ranked_estimate, why};
use crate::units::{binary, seconds};
use autopar_planner::Plan;
use std::fmt::Write;

/// The pipeline's stages: layers, recomputation, ranks, and what each
/// stage's representative did in the simulated step.
pub(super) fn stages(out: &mut String, plan: &Plan, facts: &Facts) {
    let p = &plan.parallel;
    open_section(
        out,
        "stages",
        "Stage map",
        &format!(
            "{} pipeline stage{}{}, {} schedule, {} micro-batches of {} per replica.",
            plan.stages.len(),
            if plan.stages.len() == 1 { "" } else { "s" },
            if p.virtual_stages > 1 {
                format!(" of {} interleaved chunks each", p.virtual_stages)
            } else {
                String::new()
            },
            p.schedule,
            p.micro_batches,
            p.micro_batch
        ),
    );
    let sim = facts.simulated.as_ref().map(|s| &s.sim);
    let long = plan.stages.len() > 16;
    if long {
        out.push_str("<div class=\"scroll\">");
    }
    out.push_str("<table id=\"stage-table\"><tr><th>stage</th><th>layers</th><th>also holds</th><th>recompute</th><th>ranks</th><th class=\"n\">memory (estimate)</th>");
    if sim.is_some() {
        out.push_str("<th class=\"n\">busy (simulated)</th><th class=\"n\">pipeline idle</th><th class=\"n\">peak memory (simulated)</th>");
    }
    out.push_str("</tr>");
    for s in &plan.stages {
        let mut holds = Vec::new();
        if s.holds_pre {
            holds.push("embeddings");
        }
        if s.holds_post {
            holds.push("head and loss");
        }
        let memory = facts
            .stage_memory
            .get(s.index)
            .map_or("–".to_string(), |m| binary(m.total));
        let _ = write!(
            out,
            "<tr><td><i style=\"display:inline-block;width:10px;height:10px;background:{}\"></i> {}</td><td>{}–{} ({})</td><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{memory}</td>",
            stage_colour(s.index),
            s.index,
            s.layers[0],
            s.layers[1].saturating_sub(1),
            s.layers[1] - s.layers[0],
            holds.join(", "),
            s.recompute,
            esc(&rank_ranges(&s.ranks))
        );
        if let Some(sim) = sim {
            match sim.per_rank.iter().find(|r| r.stage == s.index) {
                Some(r) => {
                    let _ = write!(
                        out,
                        "<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>",
                        seconds(r.busy_s),
                        seconds(r.bubble_s),
                        binary(r.peak_memory_bytes)
                    );
                }
                None => out.push_str("<td></td><td></td><td></td>"),
            }
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    if long {
        out.push_str("</div>");
    }
    out.push_str("</section>\n");
}

/// The search's top configurations, the winner marked, and why it won.
pub(super) fn ranking(out: &mut String, plan: &Plan) {
    open_section(
        out,
        "ranking",
        "Top configurations",
        &format!(
            "The {} fastest of {} configurations the search priced{}.",
            plan.search.top.len(),
            plan.search.configs_evaluated,
            if plan.search.top.iter().any(|a| a.simulated_step_time_s.is_some()) {
                "; the simulated ones were re-ranked by their replayed programs"
            } else {
                ""
            }
        ),
    );
    let (ranked, predicted) = (ranked_estimate(plan).step_time_s, plan.predicted.step_time_s);
    if (ranked - predicted).abs() > 1e-9 * predicted {
        let _ = write!(
            out,
            "<p class=\"note\">The ranking prices each configuration with the standard tensor-parallel layout ({} for the chosen one); the plan's predicted step, {}, prices the per-op sharding it carries.</p>",
            seconds(ranked),
            seconds(predicted)
        );
    }
    out.push_str("<table id=\"top-k\"><tr><th class=\"n\">#</th><th>degrees</th><th>schedule</th><th class=\"n\">micro-batch</th><th class=\"n\">ZeRO</th><th>recompute</th><th>gradients</th><th class=\"n\">step</th><th class=\"n\">vs chosen</th><th class=\"n\">memory</th><th class=\"n\">MFU</th><th class=\"n\">simulated</th></tr>");
    let ours = ranked_estimate(plan).step_time_s;
    for (i, alt) in plan.search.top.iter().enumerate() {
        let p = &alt.parallel;
        let chosen = *p == plan.parallel;
        let _ = write!(
            out,
            "<tr{}><td class=\"n\">{}</td><td>{}{}{}</td><td>{}{}</td><td class=\"n\">{} × {}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{:.1} %</td><td class=\"n\">{}</td></tr>",
            if chosen { " class=\"win\"" } else { "" },
            i + 1,
            esc(&degrees(p)),
            if p.sp { " · sp" } else { "" },
            if chosen { " (chosen)" } else { "" },
            p.schedule,
            if p.virtual_stages > 1 {
                format!(" v{}", p.virtual_stages)
            } else {
                String::new()
            },
            p.micro_batch,
            p.micro_batches,
            p.zero,
            p.recompute,
            esc(&grads(p)),
            seconds(alt.predicted.step_time_s),
            if chosen {
                "–".to_string()
            } else {
                format!("{:+.2} %", 100.0 * (alt.predicted.step_time_s / ours - 1.0))
            },
            binary(alt.predicted.memory_per_gpu_bytes),
            100.0 * alt.predicted.mfu,
            alt.simulated_step_time_s.map_or("–".to_string(), seconds)
        );
    }
    let _ = writeln!(out, "</table><p>{}</p></section>", esc(&why(plan)));
}
