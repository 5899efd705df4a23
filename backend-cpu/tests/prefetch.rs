//! ZeRO-3's weight gathers prefetched `Strategy::prefetch` layers ahead:
//! the programs gather earlier, the CPU backend's communication stream runs
//! the gathers beside the computation, and training is unchanged bit for bit.

use autopar_cost_models::Recompute;
use autopar_cpu::train;
use autopar_exec::train::{Optimizer, TokenSource};
use autopar_exec::{TrainOptions, TrainReport};
use autopar_ir::interp::Precision;
use autopar_ir::{CommGroup, CommKind, Graph, Node, Op};
use autopar_lower::{
    for_strategy, lower, training_graph, Instr, Objective, Program, Strategy, TrainingGraph,
};
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
    let t = training_graph(
        &common::zoo_gpt(),
        s.micro_batch,
        SEQ,
        s.global_batch(),
        Objective::Lm,
    )
    .unwrap();
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
    train(t, programs, &TokenSource::synthetic(64, 3).into(), &opts, &|_| {}).unwrap()
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
        let t = training_graph(&g, s.micro_batch, SEQ, s.global_batch(), Objective::Lm).unwrap();
        let programs = lower(&t, &s).unwrap();
        programs.iter().map(most_gathered).max().unwrap()
    };
    let (plain, full) = (most(Recompute::None), most(Recompute::Full));
    eprintln!("most gathered weights alive: {plain} without recomputation, {full} with");
    assert!(full <= plain, "{full} > {plain}");
}

/// A tensor-parallel copy of a weight (a plan that keeps a weight whole
/// beside activations split along the sequence) is run again by the
/// backward pass, as recomputation runs nodes again: the forward's copy is
/// freed before the backward pass defines its own, so no layer's weight
/// stays alive from its forward to its backward pass (under ZeRO-3, no
/// gathered weight). Training is unchanged.
#[test]
fn weight_copies_are_made_again_for_the_backward_pass() {
    let g = common::zoo_gpt();
    // The layer's feed-forward products on tokens split along the
    // sequence, their weights whole.
    let pins = [("h.0.mlp.fc", "dim1"), ("h.0.mlp.proj", "dim1")];
    let ops = common::planned(&g, 2, false, SEQ, common::Ask::Pinned(&pins));
    for zero in [0, 3] {
        let mut s = Strategy::new(1, 1, LAYERS, 1, 2)
            .with_tp(2, false)
            .with_sharding(ops.clone());
        s.zero = zero;
        let t = for_strategy(&g, &s, SEQ, Objective::Lm).unwrap();
        let programs = lower(&t, &s).unwrap();
        let graph = &t.graph;
        let copies = comm_outputs(graph, CommKind::Copy, |n| {
            n.inputs
                .iter()
                .flatten()
                .all(|&x| graph.tensor(x).role == autopar_ir::Role::Parameter)
        });
        let what = format!("zero {zero}");
        let checked: usize = programs
            .iter()
            .map(|p| common::made_again_for_the_backward_pass(p, &copies, &what))
            .sum();
        assert!(checked > 0, "zero {zero}: the plan copies no weight");
    }
}

/// Under sequence parallelism a product's input is gathered along the
/// sequence, and gathered again by the backward pass rather than kept from
/// the forward pass (Megatron-LM keeps the rank's slice too): every such
/// gather runs twice per micro-batch, the forward's copy freed before the
/// second. Training is unchanged (the parallel suites).
#[test]
fn sequence_parallel_inputs_are_gathered_again_for_the_backward_pass() {
    let g = common::zoo_gpt();
    let s = Strategy::new(1, 1, LAYERS, 1, 2).with_tp(2, true);
    let t = for_strategy(&g, &s, SEQ, Objective::Lm).unwrap();
    let programs = lower(&t, &s).unwrap();
    let graph = &t.graph;
    let gathers = comm_outputs(graph, CommKind::GatherForCompute, |n| {
        matches!(
            n.op,
            Op::Comm {
                group: CommGroup::Tensor,
                ..
            }
        ) && !n.name.starts_with("grad/")
    });
    let checked: usize = programs
        .iter()
        .map(|p| common::made_again_for_the_backward_pass(p, &gathers, "gather"))
        .sum();
    // Per layer: the attention's and the feed-forward's inputs.
    assert!(checked >= 2 * LAYERS, "{checked} gathers checked");
}

/// The nodes of `graph` that are collectives of `kind` and that `keep`
/// accepts, by name, with their output's name: what
/// `common::made_again_for_the_backward_pass` checks.
fn comm_outputs(graph: &Graph, kind: CommKind, keep: impl Fn(&Node) -> bool) -> HashMap<String, String> {
    graph
        .node_indices()
        .map(|i| graph.node(i))
        .filter(|n| matches!(&n.op, Op::Comm { kind: k, .. } if *k == kind) && keep(n))
        .map(|n| (n.name.clone(), graph.tensor(n.outputs[0]).name.clone()))
        .collect()
}
