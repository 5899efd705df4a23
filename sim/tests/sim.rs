//! The simulator against itself and the analytic model: one representative
//! per stage gives the same step as replaying every rank; a single-stage
//! plan without communication takes exactly the sum of its instructions;
//! Megatron-LM's published single-stage runs simulate within 10 % of the
//! analytic estimate (every row of the table is checked by
//! `cargo bench -p autopar-sim --bench simulate`).

use autopar_cost_models::calibration::{InterpreterCost, OpRate};
use autopar_cost_models::comm::{Algorithm, Collective};
use autopar_cost_models::published::megatron_sc21;
use autopar_cost_models::{estimate, AttentionKernel, Calibration, Cluster, Recompute, Workload};
use autopar_ir::DType;
use autopar_lower::{for_strategy, Objective, Strategy};
use autopar_sim::{simulate, Pricing, PricingOptions, SimOptions, Simulation};

const ZOO: &str = "gpt:layers=4,hidden=64,heads=4,vocab=128,seq=16";

fn run(s: &Strategy, every_rank: bool) -> Simulation {
    run_with(s, every_rank, &Calibration::default())
}

fn run_with(s: &Strategy, every_rank: bool, calibration: &Calibration) -> Simulation {
    let g = autopar_import::zoo::build(ZOO).unwrap();
    let t = for_strategy(&g, s, 16, Objective::Lm).unwrap();
    let cluster = Cluster::preset("dgx-a100-80g")
        .unwrap()
        .with_gpus(s.world())
        .unwrap();
    let opts = PricingOptions {
        attention: AttentionKernel::Fused,
        dropout: false,
        ..PricingOptions::default()
    };
    let pricing = Pricing::new(&t, &cluster, calibration, &opts).unwrap();
    let sim_opts = SimOptions {
        every_rank,
        ..SimOptions::default()
    };
    simulate(&t, s, &pricing, &sim_opts).unwrap()
}

#[test]
fn representatives_replay_the_same_step_as_every_rank() {
    let mut zero1 = Strategy::new(2, 2, 4, 1, 4);
    zero1.zero = 1;
    for s in [
        Strategy::new(2, 2, 4, 1, 4).with_tp(2, false),
        Strategy::new(2, 1, 4, 1, 2).with_tp(2, true),
        zero1,
    ] {
        let all = run(&s, true);
        let reps = run(&s, false);
        assert_eq!(all.simulated_ranks, s.world());
        assert_eq!(reps.simulated_ranks, s.pp);
        assert!(reps.reduced());
        let rel = (all.step_time_s - reps.step_time_s).abs() / all.step_time_s;
        assert!(rel < 1e-9, "{} vs {}", all.step_time_s, reps.step_time_s);
        assert!((all.bubble_fraction - reps.bubble_fraction).abs() < 1e-9);
    }
}

#[test]
fn pipelines_idle_in_fill_and_drain_and_more_micro_batches_shrink_it() {
    let few = run(&Strategy::new(1, 4, 4, 1, 4), false);
    let many = run(&Strategy::new(1, 4, 4, 1, 16), false);
    assert!(few.bubble_fraction > 0.2, "{}", few.bubble_fraction);
    assert!(many.bubble_fraction < few.bubble_fraction);
    // Without a pipeline nobody waits on another stage.
    let flat = run(&Strategy::new(1, 1, 4, 1, 4), false);
    assert!(flat.bubble_fraction < 1e-12, "{}", flat.bubble_fraction);
    // One rank, no communication: the step is the compute stream's busy time.
    let r = &flat.per_rank[0];
    assert!((r.busy_s - flat.step_time_s).abs() < 1e-12 * flat.step_time_s.max(1.0));
    // Every rank's memory peak includes its weights, gradients and Adam state.
    assert!(few.per_rank.iter().all(|r| r.peak_memory_bytes > 0.0));
    let timeline = few.timeline(60, 8);
    assert_eq!(timeline.lines().count(), 4 + 1, "{timeline}");
    assert!(timeline.contains('F') && timeline.contains('B') && timeline.contains('.'));
}

#[test]
fn single_stage_sc21_runs_simulate_within_ten_percent_of_the_analytic_estimate() {
    for r in megatron_sc21().iter().filter(|r| r.pp == 1) {
        let cfg = r.config();
        let g = autopar_import::zoo::build(&r.model_spec()).unwrap();
        let mut s =
            Strategy::new(cfg.dp, cfg.pp, r.layers, 1, cfg.global_batch / cfg.dp).with_tp(cfg.tp, false);
        s.recompute = vec![Recompute::Full; cfg.pp];
        let t = for_strategy(&g, &s, r.setting.seq, Objective::Lm).unwrap();
        let cluster = Cluster::preset("dgx-a100-80g")
            .unwrap()
            .with_gpus(r.gpus)
            .unwrap();
        let calibration = Calibration::default();
        let opts = r.workload_options();
        let analytic = estimate(&Workload::build(&g, &opts).unwrap(), &cluster, &calibration, &cfg).unwrap();
        let pricing = Pricing::new(
            &t,
            &cluster,
            &calibration,
            &PricingOptions {
                attention: opts.attention,
                dropout: opts.dropout,
                ..PricingOptions::default()
            },
        )
        .unwrap();
        let sim = simulate(&t, &s, &pricing, &SimOptions::default()).unwrap();
        let ratio = sim.step_time_s / analytic.step_time_s;
        assert!((ratio - 1.0).abs() < 0.10, "{} GPUs: {ratio}", r.gpus);
        // The terms of the slowest stage add up to the simulated step.
        let sum: f64 = sim.terms(&analytic.breakdown).iter().map(|t| t.simulated_s).sum();
        assert!((sum - sim.step_time_s).abs() < 1e-6 * sim.step_time_s, "{sum}");
    }
}

#[test]
fn an_interpreter_runs_each_rank_on_one_lane_with_its_measured_costs() {
    let s = Strategy::new(2, 2, 4, 1, 4);
    // Measured per-op rates mark an interpreter (the CPU backend).
    let rate = OpRate {
        op: "Add".into(),
        dtype: DType::F32,
        at_bytes: None,
        bytes_per_s: Some(1e9),
        flops_per_s: None,
    };
    let measured = Calibration {
        ops: vec![rate],
        ..Calibration::default()
    };
    let base = run_with(&s, false, &measured);
    // On one lane nothing overlaps: the slowest rank is never idle for its own communication.
    assert!(base.per_rank.iter().any(|r| r.communication_s > 0.0));
    let slower = Calibration {
        interpreter: Some(InterpreterCost {
            node_factor: 2.0,
            instruction_overhead_s: 1e-3,
            collective_overhead_s: Some(1e-3),
        }),
        ..measured.clone()
    };
    let costly = run_with(&s, false, &slower);
    assert!(
        costly.step_time_s > 2.0 * base.step_time_s,
        "{} vs {}",
        costly.step_time_s,
        base.step_time_s
    );
}

/// The communication stream's busy seconds on rank 0 (data parallelism only).
fn communication_s(s: &Strategy) -> f64 {
    run(s, true).per_rank[0].communication_s
}

/// A bucket is one collective of its gradients' summed bytes: one latency
/// where reducing them one by one pays one each; ZeRO-2 reduce-scatters
/// every micro-batch's gradients (ZeRO-1 the step's once).
#[test]
fn a_bucket_is_priced_as_one_collective_and_zero_2_reduces_every_micro_batch() {
    let g = autopar_import::zoo::build(ZOO).unwrap();
    let with = |zero: u8, micro_batches: usize, bucket_bytes: usize| {
        let mut s = Strategy::new(2, 1, 4, 1, micro_batches);
        s.zero = zero;
        s.bucket_bytes = bucket_bytes;
        s
    };
    let s = with(0, 1, 0);
    let t = for_strategy(&g, &s, 16, Objective::Lm).unwrap();
    let cluster = Cluster::preset("dgx-a100-80g").unwrap().with_gpus(2).unwrap();
    let calibration = Calibration::default();
    let pricing = Pricing::new(&t, &cluster, &calibration, &PricingOptions::default()).unwrap();
    let bytes = |name: &str| {
        let (_, x) = t.graph.tensors().find(|(_, x)| x.name == name).unwrap();
        let numel: usize = x.ty.shape.resolve(&t.graph.bindings).unwrap().iter().product();
        (numel * x.ty.dtype.size_bytes()) as f64
    };
    let tied: Vec<&String> = t.tied.iter().flat_map(|(a, b)| [a, b]).collect();
    let (early, late): (Vec<f64>, Vec<f64>) = {
        let (late, early): (Vec<_>, Vec<_>) = t.gradients.iter().partition(|(p, _)| tied.contains(&p));
        let sizes = |v: Vec<&(String, String)>| v.iter().map(|(p, _)| bytes(p)).collect::<Vec<f64>>();
        (sizes(early), sizes(late))
    };
    let price = |c, b: f64| pricing.collective(c, Algorithm::Ring, b, &[0, 1]);
    let sum = |v: &[f64]| v.iter().sum::<f64>();
    // ZeRO-0: one all-reduce per tensor against one per bucket (the
    // backward pass's, then the tied copies' after the pipeline).
    let one_by_one: f64 = early
        .iter()
        .chain(&late)
        .map(|&b| price(Collective::AllReduce, b))
        .sum();
    let bucketed = price(Collective::AllReduce, sum(&early)) + price(Collective::AllReduce, sum(&late));
    let (a, b) = (
        communication_s(&with(0, 1, 0)),
        communication_s(&with(0, 1, 25 << 20)),
    );
    assert!(((a - b) - (one_by_one - bucketed)).abs() < 1e-9 * a, "{a} - {b}");
    assert!(b < a);
    // ZeRO-2 over 4 micro-batches: three reduce-scatters more of the
    // backward pass's bucket than ZeRO-1.
    let (z1, z2) = (
        communication_s(&with(1, 4, 25 << 20)),
        communication_s(&with(2, 4, 25 << 20)),
    );
    let extra = 3.0 * price(Collective::ReduceScatter, sum(&early));
    assert!(((z2 - z1) - extra).abs() < 1e-9 * z2, "{z2} - {z1} vs {extra}");
}

/// The simulator replays data-parallel traffic on the stream the backends
/// run it on: beside the computation exactly for the instructions the
/// program declares so ([`autopar_lower::Instr::overlaps_compute`]: bucket
/// reductions, the ZeRO refresh, ZeRO-3's prefetched gathers), on the
/// compute stream otherwise (the tied weights' sum).
#[test]
fn data_parallel_traffic_runs_on_the_stream_its_instruction_declares() {
    use autopar_exec::trace::{Stream, TraceEvent};
    let g = autopar_import::zoo::build(ZOO).unwrap();
    for zero in [0, 1, 3] {
        let mut s = Strategy::new(2, 2, 4, 1, 2);
        s.zero = zero;
        let t = for_strategy(&g, &s, 16, Objective::Lm).unwrap();
        let programs = autopar_lower::lower(&t, &s).unwrap();
        let declared: std::collections::HashMap<String, bool> = programs
            .iter()
            .flat_map(|p| &p.instructions)
            .map(|i| (i.describe(), i.overlaps_compute()))
            .collect();
        let cluster = Cluster::preset("dgx-a100-80g")
            .unwrap()
            .with_gpus(s.world())
            .unwrap();
        let calibration = Calibration::default();
        let pricing = Pricing::new(&t, &cluster, &calibration, &PricingOptions::default()).unwrap();
        let opts = SimOptions {
            every_rank: true,
            trace: true,
            ..SimOptions::default()
        };
        let sim = simulate(&t, &s, &pricing, &opts).unwrap();
        let mut beside = 0;
        for e in &sim.trace {
            let TraceEvent::Span { stream, name, .. } = e else {
                continue;
            };
            let Some(&overlaps) = declared.get(name) else {
                continue;
            };
            assert_eq!(
                *stream == Stream::Gradients,
                overlaps,
                "ZeRO-{zero}: {name} on {stream:?}"
            );
            beside += usize::from(overlaps);
        }
        assert!(beside > 0, "ZeRO-{zero}: nothing ran beside the computation");
    }
}

/// A tensor-parallel copy's and an identity's output is its input, as the
/// backends hold it: the replay counts their memory once and gives it back
/// once both are freed, so every buffer is given back exactly once by the
/// step's end.
#[test]
fn a_tensor_parallel_copy_shares_its_input_s_memory() {
    use autopar_sim::compile::{Compiler, GraphIndex};
    let s = autopar_lower::Strategy::new(1, 1, 2, 1, 2).with_tp(2, false);
    let g = autopar_import::zoo::build("gpt:layers=2,hidden=32,heads=4,vocab=64,seq=8").unwrap();
    let t = autopar_lower::for_strategy(&g, &s, 8, Objective::Lm).unwrap();
    let programs = autopar_lower::lower(&t, &s).unwrap();
    let op = |node: &str| {
        let g = &t.graph;
        let i = g.node_indices().find(|&i| g.node(i).name == node).unwrap();
        g.node(i).op.clone()
    };
    // Copies, and identities of activations (each weight's gradient is named by one).
    let copies = programs[0]
        .instructions
        .iter()
        .filter(|i| match i {
            autopar_lower::Instr::Collective {
                kind: autopar_ir::CommKind::Copy,
                ..
            } => true,
            autopar_lower::Instr::Compute { node, .. } => matches!(
                op(node),
                autopar_ir::Op::Unary {
                    func: autopar_ir::UnaryOp::Identity
                }
            ),
            _ => false,
        })
        .count();
    let cluster = autopar_cost_models::Cluster::preset("dgx-a100-80g")
        .unwrap()
        .with_gpus(2)
        .unwrap();
    let cal = autopar_cost_models::Calibration::default();
    let pricing = autopar_sim::Pricing::new(&t, &cluster, &cal, &Default::default()).unwrap();
    let index = GraphIndex::new(&t, 0, &pricing);
    let reps = autopar_sim::ranks::Representatives::all(s.world());
    let compiler = Compiler {
        index: &index,
        pricing: &pricing,
        reps: &reps,
        labels: true,
        micro_batches: s.micro_batches,
    };
    let compiled: Vec<_> = programs.iter().map(|p| compiler.compile(p)).collect();
    let aliases = compiled[0].alias_of.iter().filter(|&&a| a != u32::MAX).count();
    assert!(
        copies > 0 && aliases == copies,
        "{aliases} aliased slots for {copies} copies"
    );
    let timelines = autopar_sim::engine::replay(&compiled).unwrap();
    for (tl, p) in timelines.iter().zip(&compiled) {
        let end = tl.memory.last().map_or(0.0, |&(_, bytes)| bytes);
        assert!(
            (end - p.static_bytes).abs() < 1e-6,
            "rank {}: {end} left against {}",
            p.rank,
            p.static_bytes
        );
    }
}

/// On the CPU backend a rank splits each large product over its threads
/// by `split_ways`, attention by `attention_ways` and the row-wise kernels
/// by `row_split`, the rules the kernels run: the simulator prices such a node at `1 / ways` of its
/// time, slowed as the calibration measured for that many threads at once,
/// and every other node as before.
#[test]
fn kernels_split_over_a_ranks_threads_are_priced_as_the_kernel_splits_them() {
    use autopar_cost_models::calibration::ThreadSlowdown;
    use autopar_cost_models::measured::gemm_shape;
    let g = autopar_import::zoo::build("gpt:layers=1,hidden=256,heads=4,vocab=2048,seq=64").unwrap();
    let s = Strategy::new(1, 1, 1, 4, 1);
    let t = for_strategy(&g, &s, 64, Objective::Lm).unwrap();
    let cluster = Cluster::preset("cpu").unwrap().with_gpus(1).unwrap();
    let slowdowns = [(1, 1.0), (2, 1.25)].map(|(threads, slowdown)| ThreadSlowdown { threads, slowdown });
    let cal = Calibration {
        ops: vec![OpRate {
            op: "Add".into(),
            dtype: DType::F32,
            at_bytes: None,
            bytes_per_s: Some(1e9),
            flops_per_s: None,
        }],
        threads: slowdowns.to_vec(),
        ..Calibration::default()
    };
    let priced = |threads: usize| {
        Pricing::new(&t, &cluster, &cal, &PricingOptions::default())
            .unwrap()
            .sharing_cores(&t, 1, 2, threads)
    };
    let (one, two) = (priced(1), priced(2));
    let (mut split, mut attention, mut rows) = (0, 0, 0);
    for i in t.graph.node_indices() {
        let n = t.graph.node(i);
        let dims = |slot: usize| {
            let x = n.inputs[slot].unwrap();
            t.graph.tensor(x).ty.shape.resolve(&t.graph.bindings).unwrap()
        };
        let ways = match (&n.op, gemm_shape(&t.graph, i)) {
            (op, Some([m, c, k])) if autopar_ir::op::splits_over_threads(op) => {
                autopar_ir::op::split_ways(m as usize, c as usize, k as usize, 2)
            }
            (autopar_ir::Op::Attention { .. } | autopar_ir::Op::AttentionGrad { .. }, _) => {
                let mask_grad = matches!(n.op, autopar_ir::Op::AttentionGrad { mask_grad: true, .. });
                let ways = autopar_ir::op::attention_ways(&dims(0), &dims(1), mask_grad, 2);
                attention += usize::from(ways == 2);
                ways
            }
            (op, _) => {
                let dtypes = n.inputs.iter().flatten().map(|&x| t.graph.tensor(x).ty.dtype);
                let float = autopar_ir::op::one_float_type(dtypes);
                let out = t
                    .graph
                    .tensor(n.outputs[0])
                    .ty
                    .shape
                    .resolve(&t.graph.bindings)
                    .unwrap();
                let ways = autopar_ir::op::row_split(op, &out, float)
                    .map_or(1, |(r, e)| autopar_ir::op::row_ways(r, e, 2));
                rows += usize::from(ways == 2);
                ways
            }
        };
        let want = one.node(&n.name) * if ways == 2 { 1.25 / 2.0 } else { 1.0 };
        assert!(
            (two.node(&n.name) - want).abs() <= 1e-12 * want.max(1e-30),
            "{}",
            n.name
        );
        split += usize::from(ways == 2);
    }
    assert!(
        split >= 6 && attention == 2 && rows >= 3,
        "the forward and backward products of the layer and the head, attention and its adjoint, \
         and the MLP's activation and its adjoint and the loss's softmax and its adjoint split: {split}, {rows}"
    );
}
