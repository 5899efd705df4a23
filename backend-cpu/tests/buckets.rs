//! Gradient buckets and ZeRO-2/3 gradients sharded as they are reduced:
//! each rank issues as many data-parallel collectives as the cost model's
//! bucket rule (`cost_models::comm::buckets`) counts, a bucket sends what
//! its gradients send one by one, ZeRO-2/3 reduce-scatter every
//! micro-batch's gradients as its backward pass completes them, and so
//! hold far fewer full-size gradient bytes at once than ZeRO-1.

use autopar_cost_models::comm::buckets;
use autopar_cpu::train;
use autopar_exec::train::{Optimizer, TokenSource};
use autopar_exec::{TrainOptions, TrainReport};
use autopar_ir::interp::Precision;
use autopar_lower::{lower, training_graph, Buf, Instr, Objective, Program, Strategy, TrainingGraph};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

mod common;

const SEQ: usize = 8;
/// `common::zoo_gpt`'s layers.
const LAYERS: usize = 2;
const VOCAB: usize = 64;
/// A cap that cuts the tiny GPT's gradients (about 50 KiB a layer) into
/// several buckets; the default (25 MiB) holds them all.
const SMALL: usize = 16 << 10;

fn lowered(s: &Strategy) -> (TrainingGraph, Vec<Program>) {
    let t = training_graph(
        &common::zoo_gpt(),
        s.micro_batch,
        SEQ,
        s.global_batch(),
        Objective::Lm,
    )
    .unwrap();
    let programs = lower(&t, s).unwrap();
    (t, programs)
}

fn strategy(dp: usize, pp: usize, micro_batches: usize, zero: u8, bucket_bytes: usize) -> Strategy {
    let mut s = Strategy::new(dp, pp, LAYERS, 1, micro_batches);
    s.zero = zero;
    s.bucket_bytes = bucket_bytes;
    s
}

/// Bytes of `name`'s gradient on a rank (the graph's f32).
fn grad_bytes(t: &TrainingGraph, name: &str) -> f64 {
    let (_, x) = t.graph.tensors().find(|(_, x)| x.name == name).unwrap();
    let numel: usize = x.ty.shape.resolve(&t.graph.bindings).unwrap().iter().product();
    (numel * x.ty.dtype.size_bytes()) as f64
}

/// The program's gradient reductions: (position, members, micro-batch).
fn reductions(p: &Program) -> Vec<(usize, &[String], Option<usize>)> {
    p.instructions
        .iter()
        .enumerate()
        .filter_map(|(at, i)| match i {
            Instr::AllReduceGrad { params, .. } => Some((at, &params[..], None)),
            Instr::ReduceScatterGrad {
                params, micro_batch, ..
            } => Some((at, &params[..], *micro_batch)),
            _ => None,
        })
        .collect()
}

/// Each ZeRO-1/2 refresh all-gather's weights.
fn refreshes(p: &Program) -> Vec<Vec<String>> {
    p.instructions
        .iter()
        .filter_map(|i| match i {
            Instr::AllGatherParams { params, .. } => Some(params.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn each_rank_issues_the_collectives_the_bucket_rule_counts() {
    let micro_batches = 3;
    for (pp, zeros) in [(1, 0..=3), (2, 0..=2)] {
        for zero in zeros {
            let (t, singles) = lowered(&strategy(2, pp, micro_batches, zero, 0));
            for cap in [0, SMALL, 64 << 10, 25 << 20] {
                let (_, programs) = lowered(&strategy(2, pp, micro_batches, zero, cap));
                for (single, p) in singles.iter().zip(&programs) {
                    // One gradient per collective at cap 0, in the order the
                    // backward pass completes them (micro-batch 0's under
                    // ZeRO-2/3); those after the tied sum reduce after the pipeline.
                    let one_by_one = reductions(single);
                    assert!(one_by_one.iter().all(|(_, params, _)| params.len() == 1));
                    let tied_sum = single
                        .instructions
                        .iter()
                        .rposition(|i| matches!(i, Instr::SumTiedGrads { .. }));
                    let (mut early, mut late) = (Vec::new(), Vec::new());
                    for &(at, params, mb) in &one_by_one {
                        let bytes = grad_bytes(&t, &params[0]);
                        match (tied_sum.is_some_and(|sum| at > sum), mb.unwrap_or(0)) {
                            (true, _) => late.push(bytes),
                            (false, 0) => early.push(bytes),
                            (false, _) => {}
                        }
                    }
                    let per_step = if zero >= 2 { micro_batches } else { 1 };
                    let counted = per_step * buckets(&early, cap as f64) + buckets(&late, cap as f64);
                    let got = reductions(p);
                    let sizes: Vec<usize> = got.iter().map(|r| r.1.len()).collect();
                    let what = format!("pp {pp} zero {zero} cap {cap} rank {}: {sizes:?}", p.rank);
                    assert_eq!(got.len(), counted, "{what}");
                    if cap == 0 {
                        assert_eq!(got.len(), one_by_one.len(), "{what}");
                    } else {
                        assert!(got.len() < one_by_one.len(), "{what}");
                    }
                    // ZeRO-1/2 refresh the same weights in the same order,
                    // in as many all-gathers as the rule counts.
                    let (singly, bucketed) = (refreshes(single), refreshes(p));
                    let sizes: Vec<f64> = singly.iter().map(|ps| grad_bytes(&t, &ps[0])).collect();
                    assert_eq!(bucketed.len(), buckets(&sizes, cap as f64), "{what}");
                    assert_eq!(bucketed.concat(), singly.concat(), "{what}");
                    assert_eq!(sizes.is_empty(), !(1..=2).contains(&zero), "{what}");
                }
            }
        }
    }
}

fn run(t: &TrainingGraph, programs: &[Program], precision: Precision, steps: usize) -> TrainReport {
    let mut opts = TrainOptions::new(precision, Optimizer::adamw(1e-2), steps);
    opts.timeout = Duration::from_secs(30);
    opts.record_grads = true;
    train(
        t,
        programs,
        &TokenSource::synthetic(VOCAB, 3).into(),
        &opts,
        &|_| {},
    )
    .unwrap()
}

/// A bucket moves its gradients' bytes: each rank sends what it sends
/// reducing them one by one, and trains to the same losses.
#[test]
fn a_bucket_sends_what_its_gradients_send_one_by_one() {
    for zero in 0..=3 {
        let run_with = |cap| {
            let (t, programs) = lowered(&strategy(4, 1, 2, zero, cap));
            run(&t, &programs, Precision::F64, 2)
        };
        let one_by_one = run_with(0);
        for cap in [SMALL, 25 << 20] {
            let bucketed = run_with(cap);
            let sent = |r: &TrainReport| r.ranks.iter().map(|r| r.bytes_sent).collect::<Vec<_>>();
            assert_eq!(sent(&bucketed), sent(&one_by_one), "zero {zero} cap {cap}");
            for (a, b) in one_by_one.steps.iter().zip(&bucketed.steps) {
                assert!(
                    ((a.loss - b.loss) / a.loss).abs() < 1e-12,
                    "zero {zero} cap {cap}: {} vs {}",
                    a.loss,
                    b.loss
                );
            }
        }
    }
}

/// ZeRO-2/3 reduce-scatter each micro-batch's gradient as its backward
/// pass completes it, never accumulating it whole, and free the
/// micro-batch's full-size gradient right after; ZeRO-0/1 reduce once per
/// step, after the last micro-batch's accumulation.
#[test]
fn zero_2_and_3_reduce_every_micro_batch_s_gradients_as_they_come() {
    for zero in 0..=3 {
        let micro_batches = 3;
        let (t, programs) = lowered(&strategy(2, 1, micro_batches, zero, 0));
        let tied: HashSet<&String> = t.tied.iter().flat_map(|(a, b)| [a, b]).collect();
        let grad_of: HashMap<&str, &str> = t
            .gradients
            .iter()
            .map(|(p, g)| (p.as_str(), g.as_str()))
            .collect();
        for p in &programs {
            for (param, _) in &t.gradients {
                let accumulations = p
                    .instructions
                    .iter()
                    .filter(|i| matches!(i, Instr::AccumulateGrad { param: q, .. } if q == param))
                    .count();
                let reduced: Vec<(usize, Option<usize>)> = p
                    .instructions
                    .iter()
                    .enumerate()
                    .filter_map(|(at, i)| match i {
                        Instr::AllReduceGrad { params, .. } if params.contains(param) => Some((at, None)),
                        Instr::ReduceScatterGrad {
                            params, micro_batch, ..
                        } if params.contains(param) => Some((at, *micro_batch)),
                        _ => None,
                    })
                    .collect();
                if zero < 2 || tied.contains(param) {
                    assert_eq!(accumulations, micro_batches, "zero {zero}: {param}");
                    assert_eq!(reduced.len(), 1, "zero {zero}: {param}");
                    assert_eq!(reduced[0].1, None, "zero {zero}: {param}");
                    continue;
                }
                assert_eq!(accumulations, 0, "zero {zero}: {param}");
                let mbs: Vec<Option<usize>> = reduced.iter().map(|r| r.1).collect();
                assert_eq!(mbs, [Some(0), Some(1), Some(2)], "zero {zero}: {param}");
                for (at, mb) in reduced {
                    let buf = Buf::of(grad_of[param.as_str()], mb.unwrap());
                    let freed = p.instructions[at..]
                        .iter()
                        .position(|i| matches!(i, Instr::Free { buf: b } if *b == buf))
                        .map(|k| at + k);
                    // Freed before anything else computes.
                    let next_compute = p.instructions[at..]
                        .iter()
                        .position(|i| matches!(i, Instr::Compute { .. }))
                        .map_or(usize::MAX, |k| at + k);
                    assert!(freed.is_some_and(|f| f < next_compute), "zero {zero}: {buf}");
                }
            }
        }
    }
}

/// The most full-size gradient bytes a program holds at once: the step's
/// accumulated gradients (from their first accumulation until they are
/// reduce-scattered or stepped) plus the micro-batch gradient buffers
/// (from the node computing them until they are freed).
fn peak_full_gradient_bytes(t: &TrainingGraph, p: &Program) -> f64 {
    let g = &t.graph;
    let params: HashMap<&str, &str> = t
        .gradients
        .iter()
        .map(|(p, gr)| (gr.as_str(), p.as_str()))
        .collect();
    let nodes: HashMap<&str, _> = g.node_indices().map(|i| (g.node(i).name.as_str(), i)).collect();
    let mut live: HashMap<(String, Option<usize>), f64> = HashMap::new();
    let mut peak: f64 = 0.0;
    for instr in &p.instructions {
        match instr {
            Instr::Compute { node, micro_batch } => {
                for &o in &g.node(nodes[node.as_str()]).outputs {
                    let name = &g.tensor(o).name;
                    if params.contains_key(name.as_str()) {
                        live.insert((name.clone(), Some(*micro_batch)), grad_bytes(t, name));
                    }
                }
            }
            Instr::Free { buf } => {
                live.remove(&(buf.tensor.clone(), buf.micro_batch));
            }
            Instr::AccumulateGrad { param, .. } => {
                live.insert((param.clone(), None), grad_bytes(t, param));
            }
            Instr::ReduceScatterGrad {
                params,
                micro_batch: None,
                ..
            } => {
                for q in params {
                    live.remove(&(q.clone(), None));
                }
            }
            Instr::OptimizerStep { param, .. } => {
                live.remove(&(param.clone(), None));
            }
            _ => {}
        }
        peak = peak.max(live.values().sum());
    }
    peak
}

/// ZeRO-2 holds a full-size gradient only until its bucket is reduced;
/// ZeRO-1 (and ZeRO-2 before it sharded as it reduced, whose program was
/// ZeRO-1's with one tensor per collective) holds every gradient whole
/// until the step's reduction.
#[test]
fn zero_2_holds_a_fraction_of_the_full_size_gradients_zero_1_holds() {
    let total = |t: &TrainingGraph| t.gradients.iter().map(|(p, _)| grad_bytes(t, p)).sum::<f64>();
    for micro_batches in [2, 4] {
        let peak = |zero, cap| {
            let (t, programs) = lowered(&strategy(2, 1, micro_batches, zero, cap));
            let peak = programs
                .iter()
                .map(|p| peak_full_gradient_bytes(&t, p))
                .fold(0.0, f64::max);
            (peak, total(&t))
        };
        let (before, all) = peak(1, 0);
        eprintln!("micro-batches {micro_batches}: gradients {all} B; ZeRO-1 (= ZeRO-2 before), one per tensor: peak {before} B");
        assert!(
            before >= all,
            "ZeRO-1 holds every gradient whole: {before} < {all}"
        );
        for cap in [0, SMALL, 64 << 10, 25 << 20] {
            let (after, _) = peak(2, cap);
            let (zero1, _) = peak(1, cap);
            eprintln!("  cap {cap:>8} B: ZeRO-2 peak {after} B, ZeRO-1 peak {zero1} B");
            // A bucket below a layer's gradients: about one layer's at most.
            if cap <= SMALL {
                assert!(after * 3.0 < before, "cap {cap}: {after} B vs {before} B");
            }
            assert!(after < before, "cap {cap}: {after} B vs {before} B");
        }
    }
}
