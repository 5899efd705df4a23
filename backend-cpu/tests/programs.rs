//! Per-rank programs against the models they implement: pipeline schedules
//! keep the micro-batches in flight that the cost model assumes, the
//! interpreter's measured activation memory and bytes sent agree with the
//! memory and communication models, an injected failure or a deadlock ends
//! in an error naming the rank (never a hang), and programs are plain data.

use autopar_comm::collective::Buffer;
use autopar_cost_models::comm::{bytes_sent, Algorithm, Collective};
use autopar_cost_models::memory::{stage_memory, PartParams};
use autopar_cost_models::{
    pipeline, AttentionKernel, MeshOrder, Recompute, Schedule, TrainingConfig, Workload, WorkloadOptions,
};
use autopar_cpu::train;
use autopar_exec::trace::{Stream, TraceEvent};
use autopar_exec::train::{initialize, Optimizer, TokenSource};
use autopar_exec::{ExecError, Fault, TrainOptions, TrainReport};
use autopar_ir::interp::Precision;
use autopar_ir::Graph;
use autopar_lower::{lower, training_graph, Instr, Objective, Program, Strategy, TrainingGraph};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

const SEQ: usize = 8;
const LAYERS: usize = 4;
const VOCAB: usize = 64;

/// A tiny GPT (tied embeddings) whose every dimension divides by 4.
fn model() -> Graph {
    let spec = format!("gpt:layers={LAYERS},hidden=32,heads=4,vocab={VOCAB},seq={SEQ}");
    let mut g = autopar_import::zoo::build(&spec).unwrap();
    initialize(&mut g, 7).unwrap();
    g
}

/// The training graph for `s`'s micro-batch and every rank's program.
fn lowered(s: &Strategy) -> (TrainingGraph, Vec<Program>) {
    let t = training_graph(&model(), s.micro_batch, SEQ, s.global_batch(), Objective::Lm).unwrap();
    let programs = lower(&t, s).unwrap();
    (t, programs)
}

/// One f32 SGD step with deadlock timeout `timeout`.
fn one_step(timeout: Duration) -> TrainOptions {
    let mut opts = TrainOptions::new(Precision::F32, Optimizer::sgd(0.1), 1);
    opts.timeout = timeout;
    opts
}

fn execute(t: &TrainingGraph, programs: &[Program], opts: &TrainOptions) -> Result<TrainReport, ExecError> {
    train(
        t,
        programs,
        &TokenSource::synthetic(VOCAB, 3).into(),
        opts,
        &|_| {},
    )
}

fn run_ok(t: &TrainingGraph, programs: &[Program]) -> TrainReport {
    execute(t, programs, &one_step(Duration::from_secs(30))).unwrap()
}

fn with(mut s: Strategy, f: impl FnOnce(&mut Strategy)) -> Strategy {
    f(&mut s);
    s
}

/// Elements of training-graph tensor `name` at the micro-batch's shapes.
fn numel(t: &TrainingGraph, name: &str) -> usize {
    let (_, tensor) = t
        .graph
        .tensors()
        .find(|(_, x)| x.name == name)
        .unwrap_or_else(|| panic!("no tensor '{name}'"));
    let dims = tensor.ty.shape.resolve(&t.graph.bindings).unwrap();
    dims.iter().product()
}

/// Bytes of `name` on the wire in an f32 run: floats as f32, integer and
/// boolean tensors (ids, masks) as f64, as the CPU backend sends them.
fn wire_bytes(t: &TrainingGraph, name: &str) -> u64 {
    let (_, tensor) = t.graph.tensors().find(|(_, x)| x.name == name).unwrap();
    let elem = if tensor.ty.dtype.is_float() { 4 } else { 8 };
    (numel(t, name) * elem) as u64
}

// ---------------------------------------------------------------------------
// 1. Schedule order

/// Most micro-batches alive at once in `p`: micro-batch `k` is alive from
/// its first forward compute on the rank to its last backward compute.
fn alive_peak(t: &TrainingGraph, p: &Program) -> usize {
    let forward: HashSet<&str> = t.forward.iter().map(String::as_str).collect();
    let mut span: HashMap<usize, (Option<usize>, usize)> = HashMap::new();
    for (i, instr) in p.instructions.iter().enumerate() {
        if let Instr::Compute { node, micro_batch } = instr {
            let e = span.entry(*micro_batch).or_insert((None, i));
            if forward.contains(node.as_str()) {
                e.0.get_or_insert(i);
            } else {
                e.1 = i;
            }
        }
    }
    let intervals: Vec<(usize, usize)> = span
        .values()
        .map(|&(first, last)| (first.expect("every micro-batch has a forward"), last))
        .collect();
    (0..p.instructions.len())
        .map(|i| intervals.iter().filter(|&&(a, b)| a <= i && i <= b).count())
        .max()
        .unwrap_or(0)
}

#[test]
fn schedules_bound_the_micro_batches_in_flight() {
    let (pp, m) = (4, 8);
    for schedule in [Schedule::OneFOneB, Schedule::Gpipe] {
        let s = with(Strategy::new(1, pp, LAYERS, 1, m), |s| s.schedule = schedule);
        let (t, programs) = lowered(&s);
        let report = run_ok(&t, &programs);
        for p in &programs {
            let stage = p.coord.pp;
            let alive = alive_peak(&t, p);
            let measured = report.ranks[p.rank].peak_micro_batches;
            eprintln!("{schedule} stage {stage}: {alive} alive in the program, {measured} with live buffers in the run");
            match schedule {
                Schedule::Gpipe => assert_eq!(alive, m, "GPipe stage {stage}"),
                _ => {
                    assert!(alive <= pp - stage, "1F1B stage {stage}: {alive}");
                    assert_eq!(alive, (pp - stage).min(m), "1F1B stage {stage}");
                }
            }
            assert_eq!(
                measured, alive,
                "{schedule} stage {stage}: the run held buffers of {measured} micro-batches, the program keeps {alive} alive"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// 2. Peak activation memory against the memory model

/// The cost model's view of one micro-batch of `micro_batch` rows on one rank.
fn workload(micro_batch: usize) -> Workload {
    // One rank; the training graph differentiates attention with one
    // fused AttentionGrad, as the default prices it.
    let opts = WorkloadOptions {
        micro_batch: Some(micro_batch),
        seq: Some(SEQ),
        ..WorkloadOptions::default()
    };
    Workload::build(&model(), &opts).unwrap()
}

/// The memory model's activation bytes of each stage of the configuration `s` runs.
fn modelled_activations(s: &Strategy) -> Vec<f64> {
    let w = workload(s.micro_batch);
    let cfg = TrainingConfig {
        dp: s.dp,
        tp: 1,
        pp: s.pp,
        virtual_stages: 1,
        sp: false,
        cp: 1,
        ep: 1,
        zero: s.zero,
        recompute: Recompute::None,
        schedule: s.schedule,
        micro_batch: s.micro_batch,
        global_batch: s.global_batch(),
        seq: Some(SEQ),
        attention: AttentionKernel::Fused,
        dropout: false,
        mesh_order: MeshOrder::DataInner,
        ..TrainingConfig::default()
    };
    let parts = PartParams::of(&w);
    pipeline::stages(w.layers, s.pp, 1, Recompute::None)
        .iter()
        .map(|stage| stage_memory(&w, &parts, &cfg, stage).activations)
        .collect()
}

#[test]
fn peak_activations_follow_the_memory_model() {
    let base = Strategy::new(1, 2, LAYERS, 2, 4);
    let mut measured = HashMap::new();
    let mut modelled = HashMap::new();
    eprintln!("schedule  stage  measured (B)  modelled (B)  ratio");
    for schedule in [Schedule::OneFOneB, Schedule::Gpipe] {
        let s = with(base.clone(), |s| s.schedule = schedule);
        let (t, programs) = lowered(&s);
        let report = run_ok(&t, &programs);
        let model = modelled_activations(&s);
        for p in &programs {
            let stage = p.coord.pp;
            let got = report.ranks[p.rank].peak_activation_bytes as f64;
            let want = model[stage];
            let ratio = got / want;
            eprintln!("{schedule:<8}  {stage:>5}  {got:>12}  {want:>12}  {ratio:.2}");
            // The interpreter keeps what the model fuses away or does not
            // count: every unfused backward temporary, the integer token and
            // target buffers, and the logits' softmax next to the logits; so
            // agreement is only up to a small factor.
            assert!(
                (0.25..=4.0).contains(&ratio),
                "{schedule} stage {stage}: measured {got} B vs modelled {want} B"
            );
            measured.insert((schedule, stage), got);
            modelled.insert((schedule, stage), want);
        }
    }
    let (gpipe, one_f_one_b) = ((Schedule::Gpipe, 0), (Schedule::OneFOneB, 0));
    assert!(modelled[&gpipe] > modelled[&one_f_one_b]);
    assert!(
        measured[&gpipe] > measured[&one_f_one_b],
        "GPipe holds all 4 micro-batches on stage 0, 1F1B 2: {} vs {} B",
        measured[&gpipe],
        measured[&one_f_one_b]
    );
}

// ---------------------------------------------------------------------------
// 3. Bytes sent against the communication model

/// Each parameter whose gradient the program all-reduces, with its element count.
fn reduced_params(t: &TrainingGraph, p: &Program) -> Vec<(String, usize)> {
    p.instructions
        .iter()
        .filter_map(|i| match i {
            Instr::AllReduceGrad { params, .. } => Some(params),
            _ => None,
        })
        .flatten()
        .map(|param| (param.clone(), numel(t, param)))
        .collect()
}

#[test]
fn ring_all_reduce_sends_what_the_model_says() {
    let n = 4;
    let s = Strategy::new(n, 1, LAYERS, 1, 1);
    let (t, programs) = lowered(&s);
    let report = run_ok(&t, &programs);
    for (pos, p) in programs.iter().enumerate() {
        let params = reduced_params(&t, p);
        assert_eq!(params.len(), t.gradients.len(), "every gradient is reduced");
        // The model's 2(n−1)/n·bytes, exact here because every parameter's size divides by n.
        let model: f64 = params
            .iter()
            .map(|(name, len)| {
                assert_eq!(len % n, 0, "'{name}' has {len} elements");
                bytes_sent(Collective::AllReduce, Algorithm::Ring, n, (len * 4) as f64).unwrap()[pos]
            })
            .sum();
        // What the ring sends for any size: every chunk but its own in the
        // reduce-scatter, every chunk but the next rank's in the all-gather.
        let exact: usize = params
            .iter()
            .map(|(_, len)| {
                let chunks = Buffer::balanced_lengths(*len, n);
                4 * (2 * len - chunks[pos] - chunks[(pos + 1) % n])
            })
            .sum();
        let got = report.ranks[p.rank].bytes_sent;
        eprintln!(
            "ring all-reduce over {n}: rank {} sent {got} B, model {model} B",
            p.rank
        );
        assert_eq!(got, exact as u64, "rank {}", p.rank);
        assert_eq!(got as f64, model, "rank {}", p.rank);
    }
}

/// ZeRO-1 and ZeRO-2 reduce-scatter the gradients and all-gather the
/// updated weights: two volumes, what a ring all-reduce sends (ZeRO-0), not
/// an all-reduce and a gather (three).
#[test]
fn zero_1_and_2_send_what_an_all_reduce_sends() {
    let sent = |zero: u8| {
        let s = with(Strategy::new(4, 1, LAYERS, 1, 1), |s| s.zero = zero);
        let (t, programs) = lowered(&s);
        let report = run_ok(&t, &programs);
        report.ranks.iter().map(|r| r.bytes_sent).collect::<Vec<_>>()
    };
    let ring = sent(0);
    assert_eq!(sent(1), ring, "ZeRO-1");
    assert_eq!(sent(2), ring, "ZeRO-2");
}

#[test]
fn parameter_server_sends_what_the_model_says() {
    for n in [2, 3] {
        let s = with(Strategy::new(n, 1, LAYERS, 1, 1), |s| {
            s.reduction = Algorithm::ParameterServer
        });
        let (t, programs) = lowered(&s);
        let report = run_ok(&t, &programs);
        for (pos, p) in programs.iter().enumerate() {
            let model: f64 = reduced_params(&t, p)
                .iter()
                .map(|(_, len)| {
                    bytes_sent(
                        Collective::AllReduce,
                        Algorithm::ParameterServer,
                        n,
                        (len * 4) as f64,
                    )
                    .unwrap()[pos]
                })
                .sum();
            let got = report.ranks[p.rank].bytes_sent;
            eprintln!(
                "parameter server over {n}: rank {} sent {got} B, model {model} B",
                p.rank
            );
            assert_eq!(got as f64, model, "n = {n}, rank {}", p.rank);
        }
    }
}

#[test]
fn pipeline_sends_its_boundary_tensors() {
    let s = Strategy::new(1, 2, LAYERS, 2, 4);
    let m = s.micro_batches as u64;
    let boundary = workload(s.micro_batch).boundary_bytes as u64;
    let (t, programs) = lowered(&s);
    let report = run_ok(&t, &programs);
    for p in &programs {
        let (mut activations, mut params) = (0, 0);
        for i in &p.instructions {
            match i {
                Instr::Send { buf, .. } => activations += wire_bytes(&t, &buf.tensor),
                Instr::SendParam { param, .. } => params += wire_bytes(&t, param),
                Instr::SumTiedGrads { key, group, .. } => {
                    let pos = group.iter().position(|&r| r == p.rank).unwrap();
                    let bytes = wire_bytes(&t, key) as f64;
                    params += bytes_sent(Collective::AllReduce, Algorithm::Ring, group.len(), bytes).unwrap()
                        [pos] as u64;
                }
                _ => {}
            }
        }
        let got = report.ranks[p.rank].bytes_sent;
        eprintln!(
            "pp = 2, m = {m}: rank {} sent {got} B = {activations} B of micro-batch tensors + {params} B for shared weights; the model's boundary is {boundary} B per micro-batch",
            p.rank
        );
        assert_eq!(got, activations + params, "rank {}", p.rank);
    }
    // Forward, stage 0 sends exactly the layer boundary the cost model prices.
    let forward: u64 = programs[0]
        .instructions
        .iter()
        .filter_map(|i| match i {
            Instr::Send { buf, .. } => Some(wire_bytes(&t, &buf.tensor)),
            _ => None,
        })
        .sum();
    assert_eq!(forward, m * boundary);
    // Backward, stage 1 sends the boundary's gradient of every micro-batch;
    // the tied embedding's two gradients are summed once per step (a
    // two-rank ring all-reduce: each rank sends the weight's size once).
    let tied = wire_bytes(&t, "wte.weight");
    assert_eq!(report.ranks[1].bytes_sent, m * boundary + tied);
    assert_eq!(report.ranks[0].bytes_sent, m * boundary + tied);
}

// ---------------------------------------------------------------------------
// 4. Failures end runs with errors

#[test]
fn an_injected_failure_ends_the_run_with_an_error() {
    let s = Strategy::new(2, 1, LAYERS, 1, 1);
    let (t, programs) = lowered(&s);
    // Fail where rank 0 will wait for rank 1: its first gradient reduction.
    let instruction = programs[1]
        .instructions
        .iter()
        .position(|i| matches!(i, Instr::AllReduceGrad { .. }))
        .unwrap();
    let mut opts = one_step(Duration::from_secs(2));
    opts.fault = Some(Fault {
        rank: 1,
        step: 0,
        instruction,
    });
    let start = Instant::now();
    let err = execute(&t, &programs, &opts).unwrap_err().to_string();
    let elapsed = start.elapsed();
    eprintln!("after {elapsed:?}: {err}");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    assert!(err.contains("rank 1") && err.contains("injected"), "{err}");
}

/// Runs `programs` with a 1 s deadlock timeout, expecting an error within 10 s.
fn deadlocked(t: &TrainingGraph, programs: &[Program]) -> String {
    let start = Instant::now();
    let err = execute(t, programs, &one_step(Duration::from_secs(1)))
        .unwrap_err()
        .to_string();
    let elapsed = start.elapsed();
    eprintln!("after {elapsed:?}: {err}");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    err
}

#[test]
fn a_missing_send_is_a_reported_deadlock() {
    let s = Strategy::new(1, 2, LAYERS, 1, 2);
    let (t, mut programs) = lowered(&s);
    let first_send = programs[0]
        .instructions
        .iter()
        .position(|i| matches!(i, Instr::Send { .. }))
        .unwrap();
    let Instr::Send { buf, to } = programs[0].instructions.remove(first_send) else {
        unreachable!()
    };
    assert_eq!(to, 1);
    let err = deadlocked(&t, &programs);
    // Rank 1 waits for `buf`; rank 0 then waits for rank 1's first gradient:
    // a cycle. Both time out about 1 s after they start waiting, a few
    // milliseconds apart (less than scheduling noise on a loaded machine),
    // and whichever the run reports must say who waits for whom.
    if err.starts_with("rank 1:") {
        assert!(err.contains(&format!("recv {buf} from rank 0")), "{err}");
        assert!(err.contains("for rank 0"), "{err}");
    } else {
        assert!(err.starts_with("rank 0:"), "{err}");
        assert!(err.contains("recv ") && err.contains("from rank 1"), "{err}");
        assert!(err.contains("for rank 1"), "{err}");
    }
    assert!(err.contains("deadlock"), "{err}");
}

#[test]
fn a_missing_tied_gradient_sum_is_a_reported_deadlock() {
    // Only rank 1 waits: rank 0 skips summing the tied embedding's gradients.
    let s = Strategy::new(1, 2, LAYERS, 1, 2);
    let (t, mut programs) = lowered(&s);
    programs[0]
        .instructions
        .retain(|i| !matches!(i, Instr::SumTiedGrads { .. }));
    let err = deadlocked(&t, &programs);
    assert!(
        err.starts_with("rank 1:") && err.contains("sum the tied gradients of 'wte.weight'"),
        "{err}"
    );
    assert!(err.contains("waited 1.0 s for rank 0"), "{err}");
}

// ---------------------------------------------------------------------------
// 5. Programs are data

#[test]
fn programs_round_trip_through_json() {
    let strategies = [
        with(Strategy::new(2, 2, LAYERS, 1, 2), |s| s.zero = 1),
        with(Strategy::new(2, 1, LAYERS, 1, 2), |s| s.zero = 3),
        with(Strategy::new(2, 1, LAYERS, 1, 2), |s| {
            s.reduction = Algorithm::ParameterServer
        }),
        with(Strategy::new(1, 2, LAYERS, 1, 4), |s| {
            s.schedule = Schedule::Interleaved;
            s.chunks = 2;
            s.recompute = vec![Recompute::Full, Recompute::Selective];
        }),
    ];
    for s in &strategies {
        let (_, programs) = lowered(s);
        let text = serde_json::to_string(&programs).unwrap();
        let back: Vec<Program> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, programs, "{s:?}");
    }
}

// ---------------------------------------------------------------------------
// Gradient reduction overlaps the backward pass.

/// One gradient per collective (`bucket_bytes` 0), ZeRO-0 and 1: each
/// right after its last accumulation. (ZeRO-2/3 and buckets: `buckets.rs`.)
#[test]
fn gradients_are_reduced_as_soon_as_their_last_micro_batch_is_in() {
    for zero in [0, 1] {
        let s = with(Strategy::new(2, 1, LAYERS, 1, 3), |s| {
            s.zero = zero;
            s.bucket_bytes = 0;
        });
        let (t, programs) = lowered(&s);
        let tied: HashSet<&String> = t.tied.iter().flat_map(|(a, b)| [a, b]).collect();
        for p in &programs {
            let at = |f: &dyn Fn(&Instr) -> bool| p.instructions.iter().rposition(f);
            let last_compute = at(&|i| matches!(i, Instr::Compute { .. })).unwrap();
            let mut early = 0;
            for (i, instr) in p.instructions.iter().enumerate() {
                let (Instr::AllReduceGrad { params, .. } | Instr::ReduceScatterGrad { params, .. }) = instr
                else {
                    continue;
                };
                let [param] = &params[..] else {
                    panic!("zero {zero}: a bucket of {params:?} with bucket_bytes 0");
                };
                let last_accumulation =
                    at(&|x| matches!(x, Instr::AccumulateGrad { param: q, .. } if q == param)).unwrap();
                let counted = p
                    .instructions
                    .iter()
                    .filter(|x| matches!(x, Instr::AccumulateGrad { param: q, .. } if q == param))
                    .count();
                assert_eq!(counted, 3, "{param}: one accumulation per micro-batch");
                if tied.contains(param) {
                    // Tied copies are summed first, after the backward pass.
                    let sum = at(&|x| matches!(x, Instr::SumTiedGrads { .. })).unwrap();
                    assert!(i > sum && i > last_compute, "zero {zero}: {param}");
                } else {
                    // Right after its last accumulation (and the frees of what
                    // that read), before the backward pass ends.
                    let between = &p.instructions[last_accumulation + 1..i];
                    assert!(
                        between.iter().all(|x| matches!(x, Instr::Free { .. })),
                        "zero {zero}: {param}: {between:?}"
                    );
                    early += usize::from(i < last_compute);
                }
            }
            // All but the first layer's (and the embeddings') reductions
            // start while the backward pass still computes.
            let reductions = p
                .instructions
                .iter()
                .filter(|i| matches!(i, Instr::AllReduceGrad { .. } | Instr::ReduceScatterGrad { .. }))
                .count();
            assert!(
                early * 2 > reductions,
                "zero {zero}: {early} of {reductions} reductions overlap the backward pass"
            );
        }
    }
}

#[test]
fn overlapped_and_inline_communication_train_alike() {
    let s = with(Strategy::new(2, 2, LAYERS, 1, 2), |s| s.zero = 1);
    let (t, programs) = lowered(&s);
    let mut opts = TrainOptions::new(Precision::F32, Optimizer::adamw(1e-2), 3);
    opts.record_grads = true;
    opts.trace = true;
    let overlapped = execute(&t, &programs, &opts).unwrap();
    opts.overlap_comm = false;
    let inline = execute(&t, &programs, &opts).unwrap();
    let losses = |r: &TrainReport| r.steps.iter().map(|s| s.loss.to_bits()).collect::<Vec<_>>();
    assert_eq!(losses(&overlapped), losses(&inline));
    assert_eq!(overlapped.gradients, inline.gradients);
    let bytes = |r: &TrainReport| r.ranks.iter().map(|r| r.bytes_sent).collect::<Vec<_>>();
    assert_eq!(bytes(&overlapped), bytes(&inline));
    // The communication worker's collectives ran while the rank computed.
    let spans = |r: &TrainReport, stream: Stream| -> Vec<(usize, f64, f64)> {
        r.trace
            .iter()
            .filter_map(|e| match e {
                TraceEvent::Span {
                    rank,
                    stream: s,
                    start_us,
                    duration_us,
                    ..
                } if *s == stream => Some((*rank, *start_us, start_us + duration_us)),
                _ => None,
            })
            .collect()
    };
    let gradients = spans(&overlapped, Stream::Gradients);
    let compute = spans(&overlapped, Stream::Compute);
    assert!(!gradients.is_empty());
    let overlapping = gradients
        .iter()
        .filter(|g| compute.iter().any(|c| c.0 == g.0 && c.1 < g.2 && g.1 < c.2))
        .count();
    assert!(overlapping > 0, "no gradient collective overlapped compute");
}

/// A rank's products split over its threads (`threads_per_rank`) train the
/// same bits as on the rank's own thread: losses and every gradient of
/// two AdamW steps, one rank and two, in f32.
#[test]
fn products_split_over_threads_train_the_same_bits() {
    let spec = "gpt:layers=1,hidden=256,heads=4,vocab=2048,seq=64";
    let mut g = autopar_import::zoo::build(spec).unwrap();
    initialize(&mut g, 3).unwrap();
    for dp in [1, 2] {
        let s = Strategy::new(dp, 1, 1, 4, 1);
        let t = training_graph(&g, s.micro_batch, 64, s.global_batch(), Objective::Lm).unwrap();
        let programs = lower(&t, &s).unwrap();
        let trained = |threads: usize| {
            let mut opts = TrainOptions::new(Precision::F32, Optimizer::adamw(1e-3), 2);
            opts.record_grads = true;
            opts.threads_per_rank = threads;
            let data = TokenSource::synthetic(2048, 5).into();
            train(&t, &programs, &data, &opts, &|_| {}).unwrap()
        };
        let (one, three) = (trained(1), trained(3));
        let losses = |r: &TrainReport| r.steps.iter().map(|s| s.loss.to_bits()).collect::<Vec<_>>();
        assert_eq!(losses(&one), losses(&three), "dp {dp}");
        assert_eq!(one.gradients.len(), three.gradients.len());
        for (name, g) in &one.gradients {
            assert!(g.data == three.gradients[name].data, "dp {dp}: {name}");
        }
    }
}
