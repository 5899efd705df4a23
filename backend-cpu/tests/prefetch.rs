//! ZeRO-3's weight gathers prefetched `Strategy::prefetch` layers ahead:
//! the programs gather earlier, the CPU backend's communication stream runs
//! the gathers beside the computation, and training is unchanged bit for bit.

use autopar_cost_models::Recompute;
use autopar_cpu::train;
use autopar_exec::train::{Optimizer, TokenSource};
use autopar_exec::{TrainOptions, TrainReport};
use autopar_ir::interp::Precision;
use autopar_lower::{lower, training_graph, Instr, Program, Strategy, TrainingGraph};
use std::collections::HashMap;
use std::time::Duration;

mod common;

const SEQ: usize = 8;
/// `common::zoo_gpt`'s layers.
const LAYERS: usize = 2;

fn lowered(prefetch: usize) -> (TrainingGraph, Vec<Program>) {
    let mut s = Strategy::new(2, 1, LAYERS, 1, 2);
    s.zero = 3;
    s.prefetch = prefetch;
    let t = training_graph(&common::zoo_gpt(), s.micro_batch, SEQ, s.global_batch() * SEQ).unwrap();
    let programs = lower(&t, &s).unwrap();
    (t, programs)
}

/// The most node computations between a weight's gather and the first
/// node reading it.
fn lead(t: &TrainingGraph, p: &Program) -> usize {
    let g = &t.graph;
    let nodes: HashMap<&str, _> = g.node_indices().map(|i| (g.node(i).name.as_str(), i)).collect();
    let reads = |node: &str, param: &str| {
        let n = g.node(nodes[node]);
        n.inputs.iter().flatten().any(|&x| g.tensor(x).name == param)
    };
    let mut most = 0;
    for (at, instr) in p.instructions.iter().enumerate() {
        let Instr::GatherParam { param, .. } = instr else {
            continue;
        };
        let computes = p.instructions[at..]
            .iter()
            .filter(|i| matches!(i, Instr::Compute { .. }))
            .take_while(|i| !matches!(i, Instr::Compute { node, .. } if reads(node, param)))
            .count();
        most = most.max(computes);
    }
    most
}

fn run(t: &TrainingGraph, programs: &[Program], overlap: bool) -> TrainReport {
    let mut opts = TrainOptions::new(Precision::F64, Optimizer::adamw(1e-2), 3);
    opts.timeout = Duration::from_secs(30);
    opts.overlap_comm = overlap;
    train(t, programs, &TokenSource::synthetic(64, 3), &opts, &|_| {}).unwrap()
}

#[test]
fn zero_3_gathers_layers_ahead_and_trains_alike() {
    let losses = |r: &TrainReport| r.steps.iter().map(|s| s.loss.to_bits()).collect::<Vec<_>>();
    let (t, programs) = lowered(0);
    let reference = losses(&run(&t, &programs, true));
    let mut leads = Vec::new();
    for prefetch in [0, 1, 2] {
        let (t, programs) = lowered(prefetch);
        leads.push(programs.iter().map(|p| lead(&t, p)).max().unwrap());
        for overlap in [true, false] {
            let got = losses(&run(&t, &programs, overlap));
            assert_eq!(got, reference, "prefetch {prefetch}, overlap {overlap}");
        }
    }
    eprintln!("most computations between a gather and its first reader, prefetch 0, 1, 2: {leads:?}");
    // A layer ahead gathers weights several nodes before they are read.
    assert!(leads[1] > leads[0] && leads[2] >= leads[1], "{leads:?}");
}

/// Most gathered weights alive at once in `p`, in program order.
fn most_gathered(p: &Program) -> usize {
    let (mut live, mut most) = (std::collections::HashSet::new(), 0);
    for instr in &p.instructions {
        match instr {
            Instr::GatherParam { param, .. } => {
                live.insert(param.clone());
            }
            Instr::Free { buf } if buf.micro_batch.is_none() => {
                live.remove(&buf.tensor);
            }
            _ => {}
        }
        most = most.max(live.len());
    }
    most
}

/// Under full recomputation a backward task runs each layer's forward
/// nodes again just before that layer's backward nodes, and gathers the
/// weights in that order: no more are alive at once than without
/// recomputation (gathering in the forward order would hold every layer's).
#[test]
fn recomputation_gathers_layer_by_layer() {
    let mut g = autopar_import::zoo::build("gpt:layers=6,hidden=32,heads=4,vocab=64,seq=8").unwrap();
    autopar_exec::train::initialize(&mut g, 7).unwrap();
    let most = |recompute| {
        let mut s = Strategy::new(2, 1, 6, 1, 2);
        s.zero = 3;
        s.prefetch = 1;
        s.recompute = vec![recompute];
        let t = training_graph(&g, s.micro_batch, SEQ, s.global_batch() * SEQ).unwrap();
        let programs = lower(&t, &s).unwrap();
        programs.iter().map(most_gathered).max().unwrap()
    };
    let (plain, full) = (most(Recompute::None), most(Recompute::Full));
    eprintln!("most gathered weights alive: {plain} without recomputation, {full} with");
    assert!(full <= plain, "{full} > {plain}");
}
