//! The GPU memory planner on real lowered programs: the placement never
//! gives two buffers alive together the same bytes, the arena stays close
//! to the sum-of-live lower bound, the lower bound is the live sum replayed
//! instruction by instruction, the activation peak is what the CPU
//! interpreter measures running the same program, and it is within a small
//! factor of the cost model's activation memory.

use autopar_cost_models::{
    Calibration, Cluster, Evaluator, Mesh, Recompute, TrainingConfig, Workload, WorkloadOptions,
};
use autopar_cpu::train;
use autopar_cuda::memory::{
    check, plan_memory, BufferError, ElementSize, MemoryError, MemoryPlan, ALIGNMENT,
};
use autopar_exec::train::{initialize, Optimizer, TokenSource};
use autopar_exec::TrainOptions;
use autopar_ir::interp::Precision;
use autopar_ir::{DType, Graph};
use autopar_lower::{for_strategy, lower, Buf, Instr, Objective, Program, Strategy, TrainingGraph};
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

const SEQ: usize = 8;
const LAYERS: usize = 4;
const VOCAB: usize = 64;

fn model() -> Graph {
    let spec = format!("gpt:layers={LAYERS},hidden=32,heads=4,vocab={VOCAB},seq={SEQ}");
    let mut g = autopar_import::zoo::build(&spec).unwrap();
    initialize(&mut g, 7).unwrap();
    g
}

fn lowered(s: &Strategy) -> (TrainingGraph, Vec<Program>) {
    let t = for_strategy(&model(), s, SEQ, Objective::Lm).unwrap();
    let programs = lower(&t, s).unwrap();
    (t, programs)
}

fn with(mut s: Strategy, f: impl FnOnce(&mut Strategy)) -> Strategy {
    f(&mut s);
    s
}

/// The strategies planned: one of each kind of program.
fn strategies() -> Vec<(&'static str, Strategy)> {
    vec![
        ("single, 4 micro-batches", Strategy::new(1, 1, LAYERS, 1, 4)),
        ("dp2", Strategy::new(2, 1, LAYERS, 1, 2)),
        ("pp2 1F1B, 4 micro-batches", Strategy::new(1, 2, LAYERS, 1, 4)),
        ("tp2", Strategy::new(1, 1, LAYERS, 2, 2).with_tp(2, false)),
        (
            "ZeRO-3 dp2",
            with(Strategy::new(2, 1, LAYERS, 2, 2), |s| s.zero = 3),
        ),
        (
            "pp2 recompute",
            with(Strategy::new(1, 2, LAYERS, 2, 2), |s| {
                s.recompute = vec![Recompute::Full, Recompute::Selective]
            }),
        ),
    ]
}

/// The largest sum of aligned buffer sizes alive after an instruction,
/// replaying the program with a set of live buffers (sized from the graph
/// here, independently of the planner).
fn replayed_peak(t: &TrainingGraph, p: &Program) -> u64 {
    let g = &t.graph;
    let tensors: HashMap<&str, _> = g.tensors().map(|(_, x)| (x.name.as_str(), x)).collect();
    let extent = |buf: &Buf| {
        let x = tensors[buf.tensor.as_str()];
        let bytes = (x.ty.shape.numel(&g.bindings).unwrap() * x.ty.dtype.size_bits() as u64).div_ceil(8);
        bytes.div_ceil(ALIGNMENT) * ALIGNMENT
    };
    let mut live: HashMap<Buf, u64> = HashMap::new();
    let (mut sum, mut peak) = (0, 0);
    for instr in &p.instructions {
        let created: Vec<Buf> = match instr {
            Instr::Load { buf, .. } | Instr::Recv { buf, .. } => vec![buf.clone()],
            Instr::GatherParam { param, .. } => vec![Buf::step(param)],
            Instr::Compute { node, micro_batch }
            | Instr::Collective {
                node, micro_batch, ..
            } => {
                let n = g
                    .node_indices()
                    .map(|i| g.node(i))
                    .find(|n| &n.name == node)
                    .unwrap();
                n.outputs
                    .iter()
                    .map(|&o| Buf::of(&g.tensor(o).name, *micro_batch))
                    .collect()
            }
            Instr::Free { buf } => {
                sum -= live.remove(buf).unwrap();
                Vec::new()
            }
            _ => Vec::new(),
        };
        for buf in created {
            let e = extent(&buf);
            if let Entry::Vacant(slot) = live.entry(buf) {
                slot.insert(e);
                sum += e;
            }
        }
        peak = peak.max(sum);
    }
    peak
}

/// The arena never exceeds the lower bound by more than this on these
/// programs (measured: 1.000 to 1.008, and 1.091 on the first stage of the
/// 1F1B pipeline, whose micro-batches' lifetimes interleave; see the
/// test's output).
const MAX_OVERHEAD: f64 = 1.12;

#[test]
fn plans_are_sound_tight_and_peak_where_the_program_does() {
    eprintln!("strategy                    rank  blocks  arena (B)  lower bound (B)  ratio");
    for (name, s) in strategies() {
        let (t, programs) = lowered(&s);
        for p in &programs {
            let plan = plan_memory(&t, p, ElementSize::AsGraph).unwrap();
            check(&plan).unwrap_or_else(|e| panic!("{name}, rank {}: {e}", p.rank));
            eprintln!(
                "{name:<26}  {:>4}  {:>6}  {:>9}  {:>15}  {:.3}",
                p.rank,
                plan.blocks.len(),
                plan.arena_bytes,
                plan.peak_live_bytes,
                plan.overhead()
            );
            assert!(
                plan.arena_bytes >= plan.peak_live_bytes,
                "{name}, rank {}",
                p.rank
            );
            assert!(
                plan.overhead() <= MAX_OVERHEAD,
                "{name}, rank {}: arena {} B vs lower bound {} B",
                p.rank,
                plan.arena_bytes,
                plan.peak_live_bytes
            );
            assert_eq!(
                plan.peak_live_bytes,
                replayed_peak(&t, p),
                "{name}, rank {}",
                p.rank
            );
            // Every buffer an instruction names is placed where it runs.
            for (i, instr) in p.instructions.iter().enumerate() {
                if let Instr::Send { buf, .. } | Instr::Free { buf } | Instr::ReportLoss { buf } = instr {
                    assert!(plan.offset(buf, i).is_some(), "{name}: {buf} at {i}");
                }
            }
        }
    }
}

#[test]
fn recomputed_buffers_get_a_block_per_lifetime() {
    let (_, s) = strategies().pop().unwrap();
    let (t, programs) = lowered(&s);
    let plan = plan_memory(&t, &programs[0], ElementSize::AsGraph).unwrap();
    let mut seen = HashSet::new();
    let again: Vec<&Buf> = plan
        .blocks
        .iter()
        .map(|b| &b.buf)
        .filter(|b| !seen.insert(*b))
        .collect();
    assert!(
        !again.is_empty(),
        "full recomputation writes forward buffers twice"
    );
    check(&plan).unwrap();
}

#[test]
fn the_activation_peak_is_what_the_interpreter_measures() {
    for (name, s) in strategies() {
        let (t, programs) = lowered(&s);
        let opts = TrainOptions::new(Precision::F32, Optimizer::sgd(0.1), 1);
        let report = train(
            &t,
            &programs,
            &TokenSource::synthetic(VOCAB, 3).into(),
            &opts,
            &|_| {},
        )
        .unwrap();
        for p in &programs {
            let plan = plan_memory(&t, p, ElementSize::AsGraph).unwrap();
            let measured = report.ranks[p.rank].peak_activation_bytes;
            assert_eq!(plan.peak_activation_bytes, measured, "{name}, rank {}", p.rank);
        }
    }
}

#[test]
fn bf16_activations_shrink_the_arena_but_not_the_integer_buffers() {
    let (t, programs) = lowered(&Strategy::new(1, 1, LAYERS, 1, 4));
    let f32 = plan_memory(&t, &programs[0], ElementSize::AsGraph).unwrap();
    let bf16 = plan_memory(&t, &programs[0], ElementSize::Float(DType::Bf16)).unwrap();
    check(&bf16).unwrap();
    assert!(bf16.arena_bytes < f32.arena_bytes);
    // Token ids and targets stay i64: more than half of the f32 peak.
    assert!(2 * bf16.peak_activation_bytes >= f32.peak_activation_bytes);
    let tokens = |plan: &MemoryPlan| {
        plan.blocks
            .iter()
            .find(|b| b.buf.tensor == "targets")
            .unwrap()
            .bytes
    };
    assert_eq!(tokens(&bf16), tokens(&f32));
    // Adam keeps an f32 master copy of bf16 weights: 12 bytes an element, not 8.
    let (a, b) = (f32.persistent, bf16.persistent);
    assert_eq!((a.optimizer, a.gradients), (2 * a.weights, a.weights));
    assert_eq!((b.weights, b.optimizer), (a.weights / 2, 3 * a.weights));
}

/// ZeRO-3 keeps shards of the weights, the optimizer state and the
/// gradients it reduce-scatters per micro-batch; the tied embedding's
/// copies, summed after the pipeline, accumulate whole.
#[test]
fn zero3_keeps_weight_optimizer_and_gradient_shards() {
    let planned = |s: &Strategy| {
        let (t, programs) = lowered(s);
        let tied: u64 = t
            .tied
            .iter()
            .flat_map(|(a, b)| [a, b])
            .map(|p| t.graph.tensors().find(|(_, x)| &x.name == p).unwrap().1)
            .map(|x| 4 * x.ty.shape.numel(&t.graph.bindings).unwrap())
            .sum();
        (plan_memory(&t, &programs[0], ElementSize::AsGraph).unwrap(), tied)
    };
    let (whole, tied) = planned(&Strategy::new(2, 1, LAYERS, 2, 2));
    let whole = whole.persistent;
    let (sharded, _) = planned(&with(Strategy::new(2, 1, LAYERS, 2, 2), |s| s.zero = 3));
    let z = sharded.persistent;
    // Halves, rounded up per parameter (a few elements of padding).
    let half = |x: u64| x / 2..=x / 2 + 1024;
    assert!(half(whole.weights).contains(&z.weights), "{z:?} vs {whole:?}");
    assert!(half(whole.optimizer).contains(&z.optimizer), "{z:?} vs {whole:?}");
    let untied = half(whole.gradients - tied);
    assert!(
        (untied.start() + tied..=untied.end() + tied).contains(&z.gradients),
        "{z:?} vs {whole:?}, tied {tied} B"
    );
    // The gathered weights are in the arena instead.
    assert!(sharded.blocks.iter().any(|b| b.buf.micro_batch.is_none()));
}

#[test]
fn a_program_reading_a_buffer_nobody_wrote_is_refused_naming_the_instruction() {
    let (t, mut programs) = lowered(&Strategy::new(1, 1, LAYERS, 1, 1));
    let p = &mut programs[0];
    let load = p
        .instructions
        .iter()
        .position(|i| matches!(i, Instr::Load { .. }))
        .unwrap();
    let Instr::Load { buf, .. } = p.instructions.remove(load) else {
        unreachable!()
    };
    match plan_memory(&t, p, ElementSize::AsGraph) {
        Err(MemoryError::Instruction {
            source: BufferError::NotAlive { buf: missing, .. },
            ..
        }) => assert_eq!(missing, buf),
        other => panic!("{other:?}"),
    }
}

/// The cost model's activation memory (what `autopar estimate` reports)
/// against the planner's activation peak, per pipeline stage.
#[test]
fn the_activation_peak_is_near_the_cost_model_s_activation_memory() {
    let s = Strategy::new(1, 2, LAYERS, 2, 4);
    let (t, programs) = lowered(&s);
    let g = model();
    let w = Workload::build(
        &g,
        // One rank; the training graph differentiates attention with one
        // fused AttentionGrad, as the default prices it.
        &WorkloadOptions {
            micro_batch: Some(s.micro_batch),
            seq: Some(SEQ),
            ..WorkloadOptions::default()
        },
    )
    .unwrap();
    let cfg = TrainingConfig {
        pp: s.pp,
        micro_batch: s.micro_batch,
        global_batch: s.global_batch(),
        seq: Some(SEQ),
        ..TrainingConfig::default()
    };
    let cluster = Cluster::preset("dgx-a100-80g")
        .unwrap()
        .with_gpus(s.world())
        .unwrap();
    let calibration = Calibration::default();
    let evaluator = Evaluator::new(&w, &cluster, &calibration, &Mesh::of(&cfg), false).unwrap();
    eprintln!("stage  planned (B)  modelled (B)  ratio");
    for stage in evaluator.stages(&cfg) {
        let modelled = evaluator.stage_memory(&cfg, &stage).activations;
        let p = programs.iter().find(|p| p.coord.pp == stage.index).unwrap();
        let planned = plan_memory(&t, p, ElementSize::AsGraph)
            .unwrap()
            .peak_activation_bytes as f64;
        let ratio = planned / modelled;
        eprintln!("{:>5}  {planned:>11}  {modelled:>12}  {ratio:.2}", stage.index);
        // Measured 1.43 (stage 0) and 1.78 (stage 1). The program keeps
        // what the model fuses away or does not count: every unfused
        // backward temporary, the integer token and target buffers, the
        // logits' softmax next to the logits; the model counts whole saved
        // layers where the program frees some early. So they agree only up
        // to a small factor.
        assert!(
            (1.0 / 2.5..=2.5).contains(&ratio),
            "stage {}: {planned} vs {modelled}",
            stage.index
        );
    }
}
