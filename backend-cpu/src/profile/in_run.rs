//! What a node and a collective cost inside a real training step rather
//! than in a timing loop: the CPU backend's rank interpreter feeds each
//! kernel fresh buffers, stores and frees its outputs and walks the program
//! between kernels, and hands each data-parallel collective to its
//! communication stream through host memory. One short single-rank run of
//! a profile model, traced, gives the ratio of each node's traced time to
//! its predicted time, and the time between instructions that no kernel
//! accounts for; one short data-parallel run (ZeRO-1: a reduce-scatter and
//! a gather per weight), what each collective takes beyond the link model.

use super::{node_time, Plan, ProfileError};
use crate::train;
use autopar_cost_models::calibration::InterpreterCost;
use autopar_cost_models::comm::{self, Span};
use autopar_cost_models::{Calibration, Cluster};
use autopar_exec::trace::{Stream, TraceEvent};
use autopar_exec::train::{initialize, Optimizer, TokenSource};
use autopar_exec::TrainOptions;
use autopar_exec::TrainReport;
use autopar_import::ModelSpec;
use autopar_ir::interp::Precision;
use autopar_ir::NodeIndex;
use autopar_lower::{for_strategy, lower, Instr, Objective, Program, Strategy, TrainingGraph};
use std::collections::HashMap;

/// Steps run; the first (warm-up) is left out, and each node's time and
/// each step's time between instructions is the least over the others:
/// other work on a shared host only ever adds time, and a cached profile
/// should describe the host, not the builds that ran beside its
/// measurement (the median node factor over steps read 1.5-1.9 on a busy
/// host where an idle one reads 1.0; the least step's, up to 1.4).
const STEPS: usize = 20;

/// `plan`'s first model lowered for `dp` ranks under ZeRO stage `zero` and
/// trained, traced, for [`STEPS`] steps.
fn traced_run(
    plan: &Plan,
    dp: usize,
    zero: u8,
) -> Result<(TrainingGraph, Vec<Program>, TrainReport), ProfileError> {
    let spec = plan.models.first().copied().unwrap_or_default();
    let model_error = |message: String| ProfileError::Model {
        spec: spec.to_string(),
        message,
    };
    let parsed: ModelSpec = spec.parse().map_err(|e| model_error(format!("{e}")))?;
    let (layers, seq, vocab) = match &parsed {
        ModelSpec::Gpt(c) => (c.layers, c.seq, c.vocab),
        ModelSpec::Llama(c) => (c.layers, c.seq, c.vocab),
        ModelSpec::Bert(c) => (c.layers, c.seq, c.vocab),
    };
    let mut g = autopar_import::zoo::build(spec).map_err(|e| model_error(e.to_string()))?;
    initialize(&mut g, 1).map_err(|e| model_error(e.to_string()))?;
    let mut s = Strategy::new(dp, 1, layers, plan.micro_batch, 1);
    s.zero = zero;
    let t = for_strategy(&g, &s, seq, Objective::Lm).map_err(|e| model_error(e.to_string()))?;
    let programs = lower(&t, &s).map_err(|e| model_error(e.to_string()))?;
    let mut opts = TrainOptions::new(Precision::F32, Optimizer::adamw(1e-3), STEPS);
    opts.trace = true;
    let report = train(
        &t,
        &programs,
        &TokenSource::synthetic(vocab, 1).into(),
        &opts,
        &|_| {},
    )
    .map_err(|e| model_error(e.to_string()))?;
    Ok((t, programs, report))
}

/// Measures the interpreter's cost on `plan`'s first model under `cal`'s
/// kernel rates and links.
pub(super) fn interpreter_cost(plan: &Plan, cal: &Calibration) -> Result<InterpreterCost, ProfileError> {
    let (t, programs, report) = traced_run(plan, 1, 0)?;
    let model_error = |message: String| ProfileError::Model {
        spec: plan.models.first().copied().unwrap_or_default().to_string(),
        message,
    };
    let device = Cluster::preset("cpu")
        .map_err(|e| model_error(e.to_string()))?
        .device;
    let by_name: HashMap<&str, NodeIndex> = t
        .graph
        .node_indices()
        .map(|i| (t.graph.node(i).name.as_str(), i))
        .collect();
    // Each span's (a node of one micro-batch, or other work) least time
    // over the steps after the first, and per step the time of all spans.
    let mut least_span: HashMap<&str, f64> = HashMap::new();
    let mut spans_per_step = vec![0.0; STEPS];
    for e in &report.trace {
        let TraceEvent::Span {
            name,
            step,
            duration_us,
            ..
        } = e
        else {
            continue;
        };
        let Some(total) = spans_per_step.get_mut(*step) else {
            continue;
        };
        let seconds = duration_us * 1e-6;
        *total += seconds;
        if *step > 0 {
            least_span
                .entry(name.as_str())
                .and_modify(|s| *s = s.min(seconds))
                .or_insert(seconds);
        }
    }
    let (mut traced, mut predicted) = (0.0, 0.0);
    for (name, seconds) in &least_span {
        let node = name.strip_prefix("compute '").and_then(|n| n.split('\'').next());
        if let Some(&i) = node.and_then(|n| by_name.get(n)) {
            traced += seconds;
            predicted += node_time(cal, &device, &t.graph, i, Precision::F32);
        }
    }
    let instructions = programs[0].instructions.len().max(1) as f64;
    let overheads = report
        .steps
        .iter()
        .zip(&spans_per_step)
        .skip(1)
        .map(|(s, spans)| ((s.seconds - spans) / instructions).max(0.0));
    Ok(InterpreterCost {
        node_factor: super::four_digits(if predicted > 0.0 {
            (traced / predicted).max(1.0)
        } else {
            1.0
        }),
        instruction_overhead_s: super::four_digits(overheads.min_by(f64::total_cmp).unwrap_or(0.0)),
        collective_overhead_s: Some(collective_overhead(plan, cal)?),
    })
}

/// Seconds each data-parallel collective of a real run takes beyond the
/// link model (`cal`'s measured ring on the `cpu` preset): rank 0's traced
/// collectives of a ZeRO-1 run on `plan.ring_ranks` ranks (one per core),
/// each step's mean excess over the model, the least over the steps after
/// the first (as for every figure: other work only ever adds time).
fn collective_overhead(plan: &Plan, cal: &Calibration) -> Result<f64, ProfileError> {
    let (t, programs, report) = traced_run(plan, plan.ring_ranks, 1)?;
    let preset = Cluster::preset("cpu").map_err(|e| ProfileError::Model {
        spec: "cpu".into(),
        message: e.to_string(),
    })?;
    let cluster = Cluster {
        intra_node: cal.effective_link(preset.intra_node, true),
        inter_node: cal.effective_link(preset.inter_node, false),
        ..preset
    };
    let g = &t.graph;
    let bytes_of: HashMap<&str, f64> = g
        .tensors()
        .filter_map(|(_, x)| {
            let numel = x.ty.shape.numel(&g.bindings)?;
            Some((x.name.as_str(), (numel as usize * x.ty.dtype.size_bytes()) as f64))
        })
        .collect();
    // The link model's seconds of each of rank 0's collectives, by the name
    // its trace span carries.
    let mut modelled: HashMap<String, f64> = HashMap::new();
    for instr in &programs[0].instructions {
        let (Some((collective, algorithm)), Some(group)) = (instr.collective(), instr.group()) else {
            continue;
        };
        let params: &[String] = match instr {
            Instr::AllReduceGrad { params, .. }
            | Instr::ReduceScatterGrad { params, .. }
            | Instr::AllGatherParams { params, .. } => params,
            _ => continue,
        };
        let bytes: f64 = params.iter().filter_map(|p| bytes_of.get(p.as_str())).sum();
        let seconds = Span::of(&cluster, group)
            .and_then(|span| comm::time(&cluster, span, collective, algorithm, bytes))
            .unwrap_or(0.0);
        modelled.insert(instr.describe(), seconds);
    }
    let mut excess = vec![(0.0, 0usize); STEPS];
    for e in &report.trace {
        let TraceEvent::Span {
            rank: 0,
            stream: Stream::Gradients,
            name,
            step,
            duration_us,
            ..
        } = e
        else {
            continue;
        };
        if let (Some(&model), Some(slot)) = (modelled.get(name), excess.get_mut(*step)) {
            slot.0 += duration_us * 1e-6 - model;
            slot.1 += 1;
        }
    }
    let least = excess
        .iter()
        .skip(1)
        .filter(|&&(_, n)| n > 0)
        .map(|&(sum, n)| sum / n as f64)
        .fold(f64::INFINITY, f64::min);
    Ok(super::four_digits(if least.is_finite() {
        least.max(0.0)
    } else {
        0.0
    }))
}
