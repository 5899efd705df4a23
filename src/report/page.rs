//! The report's document: head, style, the sections in order, and the
//! helpers every section writes with.

use super::{charts, mesh, tables, Facts};
use crate::plan::{spares_line, summary, why};
use crate::units::{binary, flop_rate, seconds};
use autopar_lower::Strategy;
use autopar_planner::Plan;
use std::fmt::Write;

/// Text made safe for HTML content and attribute values.
pub(super) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The whole page.
pub(super) fn render(plan: &Plan, strategy: &Strategy, facts: &Facts) -> String {
    let mut out = String::with_capacity(256 * 1024);
    let title = format!("autopar plan: {}", plan.inputs.model);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><style>{STYLE}</style></head><body>\n",
        esc(&title)
    );
    header(&mut out, plan, facts);
    mesh::section(&mut out, plan, strategy, facts.cluster.as_ref());
    tables::stages(&mut out, plan, facts);
    charts::memory(&mut out, plan, facts);
    charts::time(&mut out, plan, facts);
    charts::timeline(&mut out, facts);
    tables::ranking(&mut out, plan);
    let _ = write!(
        out,
        "<footer>autopar {} · plan format {} v{} · model hash {}</footer>\n\
         <script>addEventListener('load',function(){{document.body.dataset.renderMs=performance.now().toFixed(0)}})</script>\n\
         </body></html>\n",
        env!("CARGO_PKG_VERSION"),
        esc(&plan.format),
        plan.version,
        esc(&plan.inputs.model_hash)
    );
    out
}

/// The model, the cluster, the chosen configuration and its headline figures.
fn header(out: &mut String, plan: &Plan, facts: &Facts) {
    let c = &plan.inputs.cluster;
    let e = &plan.predicted;
    let _ = write!(
        out,
        "<header><h1>{}</h1><p class=\"sub\">{} nodes × {} {} ({}) · global batch {}{}</p>\
         <p id=\"summary\">{}</p><div class=\"cards\">",
        esc(&plan.inputs.model),
        c.nodes,
        c.gpus_per_node,
        esc(&c.device),
        esc(&c.name),
        plan.inputs.global_batch,
        plan.inputs
            .seq
            .map_or(String::new(), |s| format!(", sequence {s}")),
        esc(&summary(&plan.parallel, e))
    );
    card(out, "predicted step", &seconds(e.step_time_s));
    if let Some(s) = facts
        .simulated
        .as_ref()
        .map(|s| s.sim.step_time_s)
        .or(plan.simulated_step_time_s)
    {
        card(out, "simulated step", &seconds(s));
    }
    card(out, "MFU", &format!("{:.1} %", 100.0 * e.mfu));
    card(
        out,
        "model FLOP/s per GPU",
        &flop_rate(e.model_tflops_per_gpu * 1e12),
    );
    card(
        out,
        "memory per GPU",
        &format!("{} of {}", binary(e.memory_per_gpu_bytes), binary(c.memory_bytes)),
    );
    card(out, "fits", if e.fits { "yes" } else { "NO" });
    out.push_str("</div>");
    if let Some(spares) = spares_line(plan) {
        let _ = write!(out, "<p class=\"note\">{}</p>", esc(&spares));
    }
    for m in &facts.missing {
        let _ = write!(out, "<p class=\"note\">{}</p>", esc(m));
    }
    let _ = writeln!(out, "<p id=\"why\">{}</p></header>", esc(&why(plan)));
}

fn card(out: &mut String, label: &str, value: &str) {
    let _ = write!(
        out,
        "<div class=\"card\"><div class=\"v\">{}</div><div class=\"l\">{}</div></div>",
        esc(value),
        esc(label)
    );
}

/// Opens a section with an id (what tests and links find) and a heading.
pub(super) fn open_section(out: &mut String, id: &str, heading: &str, lead: &str) {
    let _ = write!(
        out,
        "<section id=\"{id}\"><h2>{}</h2><p class=\"lead\">{}</p>",
        esc(heading),
        esc(lead)
    );
}

/// A legend: one coloured box and a label per entry.
pub(super) fn legend(out: &mut String, entries: &[(String, String)]) {
    out.push_str("<div class=\"legend\">");
    for (colour, label) in entries {
        let _ = write!(
            out,
            "<span><i style=\"background:{}\"></i>{}</span>",
            esc(colour),
            esc(label)
        );
    }
    out.push_str("</div>");
}

const STYLE: &str = "\
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;max-width:1180px;padding:16px 24px;color:#1d2433;background:#fff}\
h1{font-size:22px;margin:4px 0;word-break:break-all}h2{font-size:18px;margin:28px 0 4px;border-bottom:1px solid #dde2ea;padding-bottom:4px}\
.sub,.lead{color:#566176;margin:2px 0 8px}.note{color:#8a5a00;background:#fff6e0;padding:4px 8px;border-radius:4px}\
#summary{font-weight:600}#why{background:#eef5ff;padding:6px 10px;border-radius:4px}\
.cards{display:flex;flex-wrap:wrap;gap:8px;margin:8px 0}.card{border:1px solid #dde2ea;border-radius:6px;padding:6px 12px;min-width:120px}\
.card .v{font-size:18px;font-weight:600}.card .l{color:#566176;font-size:12px}\
table{border-collapse:collapse;margin:6px 0;font-variant-numeric:tabular-nums}th,td{border-bottom:1px solid #eceff4;padding:3px 10px;text-align:left;vertical-align:top}\
th{background:#f5f7fa;font-weight:600}td.n,th.n{text-align:right;white-space:nowrap}tr.win td{background:#eef9ee;font-weight:600}\
.legend{display:flex;flex-wrap:wrap;gap:12px;margin:6px 0;font-size:12px}.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px;border-radius:2px}\
svg{display:block;margin:6px 0;overflow:visible}svg text{font:11px system-ui,sans-serif;fill:#1d2433}\
.scroll{max-height:420px;overflow:auto;border:1px solid #eceff4}\
footer{margin-top:32px;color:#8893a5;font-size:12px}";
