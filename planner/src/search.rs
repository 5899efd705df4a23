//! The outer search: every mesh (tensor × context × pipeline × data
//! parallel, expert parallel inside data parallel, which dimension shares a
//! node) and every knob (micro-batch, schedule and virtual stages, ZeRO
//! stage, gradient reduction), with the stage split and per-stage
//! recomputation chosen by [`crate::stages`].
//!
//! Pruning is exact under the cost model:
//! - a mesh whose model state alone, spread perfectly over its stages and
//!   fully sharded, exceeds the memory limit is skipped;
//! - once a micro-batch size fits nowhere on a mesh, larger ones are not tried
//!   (activations grow with it);
//! - sequence parallelism is always on when tensor parallelism is: it moves
//!   the same bytes (all-gather + reduce-scatter = all-reduce) and
//!   divides the replicated work and activations;
//! - GPipe is never tried: it takes 1F1B's time and holds more micro-batches;
//!
//! The space itself is bounded: tensor parallelism stays inside a node,
//! context parallelism leaves each rank at least 512 tokens, micro-batches
//! hold at most 32 samples.
//! - the second mesh order is tried only when it places ranks differently;
//! - gradient reduction always overlaps the last backward pass (bucketed, as
//!   PyTorch DDP and Megatron-LM's `--overlap-grad-reduce` do): it is never slower.
//!
//! Meshes are searched in parallel (rayon); results are merged in a fixed
//! order, so the output does not depend on the thread count.

use crate::stages::{self, StageChoice};
use autopar_cost_models::comm::Algorithm;
use autopar_cost_models::estimate::unsplit_heads;
use autopar_cost_models::workload::Layered;
use autopar_cost_models::{
    AttentionKernel, Calibration, Cluster, Estimate, EstimateError, Evaluator, GradCompression, GradReduce,
    Mesh, MeshOrder, Recompute, Schedule, Sharding, TrainingConfig, Workload, WorkloadError, WorkloadOptions,
};
use autopar_ir::{Graph, Loss, Objective, Op};
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Context parallelism leaves each rank at least this many tokens of the
/// sequence: below it gathering the keys and values costs more than the
/// attention they feed on any current GPU.
const MIN_CONTEXT_CHUNK: usize = 512;

/// Micro-batches larger than this are not tried: beyond it GEMMs gain
/// nothing and each micro-batch's activations only grow.
const MAX_MICRO_BATCH: usize = 32;

/// What to plan for.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchOptions {
    pub global_batch: usize,
    pub seq: Option<usize>,
    /// Share of each GPU's memory a plan may use.
    pub max_memory_fraction: f64,
    pub attention: AttentionKernel,
    pub dropout: bool,
    /// MoE capacity factor the model trains with (drop and pad); `None`:
    /// no token is dropped.
    pub moe_capacity_factor: Option<f64>,
    /// What the model is trained for (its loss is priced, [`Loss::of`]);
    /// `None`: not known.
    pub objective: Option<Objective>,
    /// How many of the fastest plans to keep.
    pub top: usize,
    /// What the search may use (degrees, gradient compression).
    pub limits: DegreeLimits,
    /// Price tensor-parallel communication as overlapped with the GEMMs
    /// (Megatron-Core's option; no backend here runs it).
    pub tp_comm_overlap: bool,
}

impl SearchOptions {
    /// What the runtime runs, keeping the `top` fastest: fused attention,
    /// no dropout, 90 % of each GPU's memory, no gradient compression (see
    /// [`DegreeLimits::RUNNABLE`]).
    pub fn runnable(global_batch: usize, top: usize) -> SearchOptions {
        SearchOptions {
            global_batch,
            seq: None,
            max_memory_fraction: 0.9,
            attention: AttentionKernel::Fused,
            dropout: false,
            moe_capacity_factor: None,
            objective: None,
            top,
            limits: DegreeLimits::RUNNABLE,
            tp_comm_overlap: false,
        }
    }
}

/// Caps on the tensor, context and expert-parallel degrees, and whether
/// gradients may be compressed: a backend that does not run some form of
/// parallelism plans without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DegreeLimits {
    pub tp: usize,
    pub cp: usize,
    pub ep: usize,
    /// 16-bit gradient reductions of wider gradients.
    pub grad_compression: bool,
    /// The lossy gradient compressions (PowerSGD, top-k) at their default
    /// settings ([`GradCompression::LOSSY_DEFAULTS`]): training differs from
    /// uncompressed, so only when asked (`plan --allow-lossy-compression`).
    pub lossy_compression: bool,
}

impl DegreeLimits {
    /// No caps.
    pub const NONE: DegreeLimits = DegreeLimits {
        tp: usize::MAX,
        cp: usize::MAX,
        ep: usize::MAX,
        grad_compression: true,
        lossy_compression: false,
    };

    /// What the backends run as priced: no caps on the degrees, and no
    /// gradient compression, which the CPU backend runs as priced but the
    /// CUDA backend still stages through the host instead of sending
    /// 16-bit values with NCCL. A plan file may ask for it.
    pub const RUNNABLE: DegreeLimits = DegreeLimits {
        grad_compression: false,
        ..DegreeLimits::NONE
    };
}

/// One evaluated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub config: TrainingConfig,
    pub estimate: Estimate,
}

/// What the search found.
#[derive(Debug, Clone)]
pub struct SearchResult {
    /// The fastest plans that fit, fastest first.
    pub ranked: Vec<Candidate>,
    /// Plans no other plan beats in both step time and memory, fastest first.
    pub pareto: Vec<Candidate>,
    pub configs_evaluated: usize,
    pub seconds: f64,
    pub memory_limit_bytes: f64,
}

/// Why no plan came out.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error(
        "no plan fits in {limit_gib:.1} GiB per GPU: the smallest needs {needed_gib:.1} GiB per GPU ({term} alone takes {term_gib:.1} GiB); add GPUs, raise --max-memory-fraction, or shorten the sequence"
    )]
    Infeasible {
        limit_gib: f64,
        needed_gib: f64,
        term: &'static str,
        term_gib: f64,
    },
    #[error("no configuration applies: {0}")]
    Empty(String),
    #[error(
        "no parallel layout uses all {gpus} GPUs with a global batch of {global_batch} (tp·cp·pp·dp must equal the GPUs, dp divide the batch, tp stay in a node)"
    )]
    NoLayout { gpus: usize, global_batch: usize },
    #[error("{what} {value} is above the planner's limit of {limit} ({name})")]
    Limit {
        what: &'static str,
        value: usize,
        limit: usize,
        name: &'static str,
    },
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error(transparent)]
    Estimate(#[from] EstimateError),
}

/// Refuses a space beyond the planner's [`limits`](crate::limits), whose
/// enumeration would not end in reasonable time.
fn check_limits(gpus: usize, opts: &SearchOptions, layers: usize) -> Result<(), SearchError> {
    use crate::limits::{MAX_GLOBAL_BATCH, MAX_LAYERS, MAX_RANKS, MAX_SEQ};
    let checks = [
        ("GPUs", gpus, MAX_RANKS, "MAX_RANKS"),
        (
            "global batch",
            opts.global_batch,
            MAX_GLOBAL_BATCH,
            "MAX_GLOBAL_BATCH",
        ),
        ("sequence length", opts.seq.unwrap_or(0), MAX_SEQ, "MAX_SEQ"),
        ("layers", layers, MAX_LAYERS, "MAX_LAYERS"),
    ];
    match checks.into_iter().find(|&(_, value, limit, _)| value > limit) {
        Some((what, value, limit, name)) => Err(SearchError::Limit {
            what,
            value,
            limit,
            name,
        }),
        None => Ok(()),
    }
}

/// Facts about the model the space depends on.
struct ModelFacts {
    layers: usize,
    heads: Vec<(usize, usize)>,
    experts: Option<usize>,
    canonical_attention: bool,
    seq: Option<usize>,
    weight_bits: usize,
}

fn model_facts(graph: &Graph, layered: &Layered, opts: &SearchOptions) -> Result<ModelFacts, SearchError> {
    let w = Workload::from_layered(layered, &workload_options(opts, None, 1, false, 1, 1))?;
    let mut experts = None;
    let mut canonical_attention = false;
    for idx in graph.node_indices() {
        let node = graph.node(idx);
        match node.op {
            Op::MoeExperts { .. } => {
                experts = node
                    .inputs
                    .get(3)
                    .copied()
                    .flatten()
                    .and_then(|t| graph.tensor(t).ty.shape.0.first().and_then(|d| d.fixed()));
            }
            Op::Attention { .. } => canonical_attention = true,
            _ => {}
        }
    }
    Ok(ModelFacts {
        layers: w.layers,
        heads: w.heads.clone(),
        experts,
        canonical_attention,
        seq: w.seq,
        weight_bits: w.compute_dtype.size_bits(),
    })
}

fn workload_options(
    opts: &SearchOptions,
    micro_batch: Option<usize>,
    tp: usize,
    sp: bool,
    cp: usize,
    ep: usize,
) -> WorkloadOptions {
    WorkloadOptions {
        micro_batch,
        seq: opts.seq,
        sharding: Sharding { tp, sp, cp, ep },
        attention: opts.attention,
        dropout: opts.dropout,
        moe_capacity_factor: opts.moe_capacity_factor,
        loss: Loss::of(opts.objective),
    }
}

/// The divisors of `n`, ascending, found in `√n` steps.
fn divisors(n: usize) -> Vec<usize> {
    let mut low = Vec::new();
    let mut high = Vec::new();
    let mut d = 1;
    while d <= n / d {
        if n % d == 0 {
            low.push(d);
            if d != n / d {
                high.push(n / d);
            }
        }
        d += 1;
    }
    low.extend(high.into_iter().rev());
    low
}

/// The divisors of `n` up to `max`, ascending.
fn divisors_up_to(n: usize, max: usize) -> Vec<usize> {
    (1..=max.min(n)).filter(|d| n % d == 0).collect()
}

/// Whether groups of `span` consecutive ranks on nodes of `per_node` GPUs
/// (`gpus` in all) all span nodes alike: each inside one node, or each on
/// whole nodes. Otherwise some groups straddle a node boundary and run
/// their collectives over the inter-node link while the others do not,
/// and the slowest sets everyone's pace (tensor parallelism 6 on 8-GPU
/// nodes); no one trains so.
fn spans_nodes_alike(span: usize, per_node: usize, gpus: usize) -> bool {
    gpus <= per_node || per_node % span == 0 || span % per_node == 0
}

/// The tensor × context × expert-parallel groups to search, one task each.
fn sharding_groups(
    gpus: usize,
    per_node: usize,
    facts: &ModelFacts,
    limits: DegreeLimits,
) -> Vec<(usize, usize, usize)> {
    let mut groups = Vec::new();
    for tp in divisors(gpus) {
        let heads_ok = facts
            .heads
            .iter()
            .all(|&(q, kv)| unsplit_heads(q, kv, tp).is_none());
        if tp > per_node || tp > limits.tp || !heads_ok || !spans_nodes_alike(tp, per_node, gpus) {
            continue;
        }
        for cp in divisors(gpus / tp) {
            let cp_ok = cp == 1
                || (facts.canonical_attention
                    && facts
                        .seq
                        .is_some_and(|s| s % (2 * cp) == 0 && s / cp >= MIN_CONTEXT_CHUNK));
            if !cp_ok || cp > limits.cp || !spans_nodes_alike(tp * cp, per_node, gpus) {
                continue;
            }
            let eps = match facts.experts {
                Some(e) => divisors(gpus / (tp * cp))
                    .into_iter()
                    .filter(|&ep| {
                        e % ep == 0 && ep <= limits.ep && spans_nodes_alike(tp * cp * ep, per_node, gpus)
                    })
                    .collect(),
                None => vec![1],
            };
            for ep in eps {
                groups.push((tp, cp, ep));
            }
        }
    }
    groups
}

/// Schedules and chunk counts for `pp` stages of `layers` layers.
fn schedules(pp: usize, layers: usize) -> Vec<(Schedule, usize)> {
    if pp == 1 {
        return vec![(Schedule::OneFOneB, 1)];
    }
    let mut out = vec![(Schedule::OneFOneB, 1)];
    if layers % pp == 0 {
        for v in divisors(layers / pp).into_iter().filter(|&v| v > 1) {
            out.push((Schedule::Interleaved, v));
        }
    }
    out
}

/// Gradient-reduction variants worth pricing under `limits`.
fn grad_reductions(zero: u8, replicas: usize, weight_bits: usize, limits: &DegreeLimits) -> Vec<GradReduce> {
    if zero > 0 || replicas == 1 {
        return vec![GradReduce::default()];
    }
    let mut out = Vec::new();
    for algorithm in [Algorithm::Ring, Algorithm::ParameterServer] {
        out.push(GradReduce {
            algorithm,
            ..GradReduce::default()
        });
    }
    // 16-bit reductions of wider gradients, on rings (as lowering runs them).
    let mut compressions = Vec::new();
    if weight_bits > 16 && limits.grad_compression {
        compressions.push(GradCompression::Bf16);
    }
    // Lossy methods at their default settings, when asked for.
    if limits.lossy_compression {
        compressions.extend(GradCompression::LOSSY_DEFAULTS);
    }
    for c in compressions {
        out.push(GradReduce {
            compression: Some(c),
            ..GradReduce::default()
        });
    }
    out
}

/// The fastest first; ties to the one that sends less, then the smaller
/// memory, then the earlier found.
fn faster(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    let (a, b) = (&a.estimate, &b.estimate);
    a.step_time_s
        .total_cmp(&b.step_time_s)
        .then(a.comm_bytes_per_gpu.total_cmp(&b.comm_bytes_per_gpu))
        .then(a.memory_per_gpu_bytes.total_cmp(&b.memory_per_gpu_bytes))
}

/// What one task found.
#[derive(Default)]
struct TaskResult {
    candidates: Vec<Candidate>,
    evaluated: usize,
    /// The lowest peak memory of any configuration, with its estimate when evaluated.
    lowest: Option<(f64, Option<Estimate>)>,
}

impl TaskResult {
    fn saw_memory(&mut self, bytes: f64, estimate: Option<Estimate>) {
        if self.lowest.as_ref().is_none_or(|(b, _)| bytes < *b) {
            self.lowest = Some((bytes, estimate));
        }
    }
}

/// Searches every configuration of `graph` (canonical, layers found) on
/// `cluster` (sized to the GPUs to use). `progress` is told each finished task.
pub fn search(
    graph: &Graph,
    cluster: &Cluster,
    calibration: &Calibration,
    opts: &SearchOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<SearchResult, SearchError> {
    let start = Instant::now();
    let gpus = cluster.gpus();
    check_limits(gpus, opts, 0)?;
    let layered = Layered::new(graph)?;
    let facts = model_facts(graph, &layered, opts)?;
    check_limits(gpus, opts, facts.layers)?;
    let limit = opts.max_memory_fraction * cluster.device.memory_bytes;
    let groups = sharding_groups(gpus, cluster.gpus_per_node, &facts, opts.limits);
    if groups.is_empty() {
        return Err(SearchError::Empty(format!(
            "no tensor-parallel degree up to {} divides the attention heads {:?}",
            cluster.gpus_per_node, facts.heads
        )));
    }
    let done = AtomicUsize::new(0);
    let results: Vec<Result<TaskResult, SearchError>> = groups
        .par_iter()
        .map(|&(tp, cp, ep)| {
            let r = search_group(&layered, cluster, calibration, opts, &facts, (tp, cp, ep), limit);
            progress(done.fetch_add(1, Ordering::Relaxed) + 1, groups.len());
            r
        })
        .collect();
    let mut all = Vec::new();
    let mut evaluated = 0;
    let mut lowest: Option<(f64, Option<Estimate>)> = None;
    for r in results {
        let r = r?;
        evaluated += r.evaluated;
        all.extend(r.candidates);
        if let Some((b, e)) = r.lowest {
            if lowest.as_ref().is_none_or(|(l, _)| b < *l) {
                lowest = Some((b, e));
            }
        }
    }
    if all.is_empty() {
        return Err(match lowest {
            Some(_) => infeasible(limit, lowest),
            None => SearchError::NoLayout {
                gpus,
                global_batch: opts.global_batch,
            },
        });
    }
    all.sort_by(faster);
    let pareto = pareto_front(&all);
    all.truncate(opts.top.max(1));
    Ok(SearchResult {
        ranked: all,
        pareto,
        configs_evaluated: evaluated,
        seconds: start.elapsed().as_secs_f64(),
        memory_limit_bytes: limit,
    })
}

/// Plans no other beats in both step time and memory (input sorted fastest first).
fn pareto_front(sorted: &[Candidate]) -> Vec<Candidate> {
    let mut front: Vec<Candidate> = Vec::new();
    for c in sorted {
        let smaller = front
            .last()
            .is_none_or(|last| c.estimate.memory_per_gpu_bytes < last.estimate.memory_per_gpu_bytes);
        if smaller {
            front.push(c.clone());
        }
    }
    front
}

fn infeasible(limit: f64, lowest: Option<(f64, Option<Estimate>)>) -> SearchError {
    const GIB: f64 = (1u64 << 30) as f64;
    let (needed, estimate) = lowest.unwrap_or((f64::INFINITY, None));
    let (term, term_bytes) = estimate
        .map(|e| {
            e.memory
                .parts()
                .into_iter()
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap_or(("model state", needed))
        })
        .unwrap_or(("model state", needed));
    SearchError::Infeasible {
        limit_gib: limit / GIB,
        needed_gib: needed / GIB,
        term,
        term_gib: term_bytes / GIB,
    }
}

/// Every configuration with tensor, context and expert degrees `(tp, cp, ep)`.
fn search_group(
    layered: &Layered,
    cluster: &Cluster,
    calibration: &Calibration,
    opts: &SearchOptions,
    facts: &ModelFacts,
    (tp, cp, ep): (usize, usize, usize),
    limit: f64,
) -> Result<TaskResult, SearchError> {
    let gpus = cluster.gpus();
    let b = opts.global_batch;
    // Sequence parallelism with every tensor-parallel group, except where
    // context parallelism already splits the sequence (lowering runs one
    // split of the sequence, not both).
    let sp = tp > 1 && cp == 1;
    let mut out = TaskResult::default();
    let max_pp = facts.layers.max(1);
    let pps: Vec<usize> = divisors(gpus / (tp * cp))
        .into_iter()
        .filter(|&pp| pp <= max_pp && (gpus / (tp * cp * pp)) % ep == 0)
        .collect();
    // Micro-batch sizes any of these meshes can use, smallest first.
    let mut micro_batches: Vec<usize> = pps
        .iter()
        .flat_map(|&pp| {
            let dp = gpus / (tp * cp * pp);
            if b % dp == 0 {
                divisors_up_to(b / dp, MAX_MICRO_BATCH)
            } else {
                vec![]
            }
        })
        .collect();
    micro_batches.sort_unstable();
    micro_batches.dedup();
    let mut fits_somewhere = vec![true; pps.len()];
    for mb in micro_batches {
        let w = match Workload::from_layered(layered, &workload_options(opts, Some(mb), tp, sp, cp, ep)) {
            Ok(w) => w,
            // A model with a fixed batch admits one micro-batch size.
            Err(WorkloadError::FixedDim { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        for (i, &pp) in pps.iter().enumerate() {
            let dp = gpus / (tp * cp * pp);
            if !fits_somewhere[i] || b % (dp * mb) != 0 {
                continue;
            }
            let fit = search_mesh(
                &w,
                cluster,
                calibration,
                facts,
                (dp, tp, pp, cp, ep),
                mb,
                opts,
                limit,
                &mut out,
            )?;
            fits_somewhere[i] = fit;
        }
    }
    Ok(out)
}

/// Every knob on one mesh and micro-batch; false when nothing fit.
#[allow(clippy::too_many_arguments)]
fn search_mesh(
    w: &Workload,
    cluster: &Cluster,
    calibration: &Calibration,
    facts: &ModelFacts,
    (dp, tp, pp, cp, ep): (usize, usize, usize, usize, usize),
    mb: usize,
    opts: &SearchOptions,
    limit: f64,
    out: &mut TaskResult,
) -> Result<bool, SearchError> {
    // Model state spread evenly over the stages and fully sharded: no plan
    // on this mesh needs less.
    let parts = autopar_cost_models::memory::PartParams::of(w);
    let all = parts
        .pre
        .plus(parts.post_unshared, 1.0)
        .plus(parts.layer, w.layers as f64);
    let (weights, grads, state) = autopar_cost_models::memory::model_state(&all, 3, dp * cp, ep, 1.0);
    let floor = (weights + grads + state) / pp as f64;
    if floor > limit {
        out.saw_memory(floor, None);
        return Ok(false);
    }
    let mut orders = vec![MeshOrder::DataInner];
    if pp > 1 && dp > 1 && tp * cp < cluster.gpus_per_node {
        orders.push(MeshOrder::PipelineInner);
    }
    let replicas = dp * cp;
    let zeros: Vec<u8> = if replicas > 1 { vec![0, 1, 2, 3] } else { vec![0] };
    let mut any_fit = false;
    for order in orders {
        let base = TrainingConfig {
            dp,
            tp,
            pp,
            sp: tp > 1 && cp == 1,
            cp,
            ep,
            micro_batch: mb,
            global_batch: opts.global_batch,
            seq: opts.seq,
            attention: opts.attention,
            dropout: opts.dropout,
            moe_capacity_factor: opts.moe_capacity_factor,
            loss: Loss::of(opts.objective),
            mesh_order: order,
            overlap_grad_reduce: true,
            tp_comm_overlap: opts.tp_comm_overlap,
            ..TrainingConfig::default()
        };
        let ev = Evaluator::new(w, cluster, calibration, &Mesh::of(&base), base.sp)?;
        for (schedule, virtual_stages) in schedules(pp, facts.layers) {
            let scheduled = TrainingConfig {
                schedule,
                virtual_stages,
                ..base.clone()
            };
            if !scheduled.interleaving_fits() {
                continue;
            }
            for &zero in &zeros {
                for grad_reduce in grad_reductions(zero, replicas, facts.weight_bits, &opts.limits) {
                    let mut cfg = TrainingConfig {
                        zero,
                        grad_reduce,
                        ..scheduled.clone()
                    };
                    match stages::choose(&ev, &cfg, w.layers, limit)? {
                        StageChoice::Fits(specs) => {
                            cfg.recompute = strongest(&specs);
                            cfg.stages = Some(specs);
                            let estimate = ev.evaluate(&cfg)?;
                            out.evaluated += 1;
                            out.saw_memory(estimate.memory_per_gpu_bytes, Some(estimate.clone()));
                            any_fit = true;
                            out.candidates.push(Candidate {
                                config: cfg,
                                estimate,
                            });
                        }
                        StageChoice::TooBig(memory) => {
                            out.evaluated += 1;
                            cfg.recompute = Recompute::Full;
                            let estimate = ev.evaluate(&cfg).ok();
                            out.saw_memory(memory, estimate);
                        }
                    }
                }
            }
        }
    }
    Ok(any_fit)
}

/// The most recomputation any stage does (what a uniform setting would need).
fn strongest(specs: &[autopar_cost_models::StageSpec]) -> Recompute {
    let rank = |r: Recompute| match r {
        Recompute::None => 0,
        Recompute::Selective => 1,
        Recompute::Full => 2,
    };
    specs
        .iter()
        .map(|s| s.recompute)
        .max_by_key(|&r| rank(r))
        .unwrap_or(Recompute::None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divisors_and_schedules() {
        assert_eq!(divisors(12), vec![1, 2, 3, 4, 6, 12]);
        assert_eq!(divisors(16), vec![1, 2, 4, 8, 16]);
        assert_eq!(divisors(1), vec![1]);
        assert_eq!(divisors(0), Vec::<usize>::new());
        assert_eq!(divisors(1 << 40).len(), 41);
        assert_eq!(divisors_up_to(96, 32), vec![1, 2, 3, 4, 6, 8, 12, 16, 24, 32]);
        assert_eq!(schedules(1, 8), vec![(Schedule::OneFOneB, 1)]);
        assert_eq!(
            schedules(2, 8),
            vec![
                (Schedule::OneFOneB, 1),
                (Schedule::Interleaved, 2),
                (Schedule::Interleaved, 4)
            ]
        );
        assert_eq!(schedules(3, 8), vec![(Schedule::OneFOneB, 1)]);
    }

    /// Tensor-, context- and expert-parallel groups never straddle node
    /// boundaries unevenly: on 8-GPU nodes no tensor parallelism 6, no
    /// tp × cp of 12; within one partly filled node anything goes.
    #[test]
    fn groups_span_nodes_alike() {
        let facts = ModelFacts {
            layers: 4,
            heads: vec![(24, 24)],
            experts: Some(24),
            canonical_attention: true,
            seq: Some(4096),
            weight_bits: 16,
        };
        let groups = sharding_groups(96, 8, &facts, DegreeLimits::NONE);
        assert!(!groups.is_empty());
        for (tp, cp, ep) in &groups {
            for span in [tp, &(tp * cp), &(tp * cp * ep)] {
                assert!(8 % span == 0 || span % 8 == 0, "tp {tp} cp {cp} ep {ep}");
            }
        }
        assert!(
            groups.contains(&(2, 4, 3)),
            "tp 2 · cp 4 on one node, ep 3 over three"
        );
        let small = sharding_groups(6, 8, &facts, DegreeLimits::NONE);
        assert!(small.contains(&(6, 1, 1)) && small.contains(&(3, 2, 1)));
    }

    #[test]
    fn grad_reduction_variants() {
        let all = DegreeLimits::NONE;
        assert_eq!(grad_reductions(1, 8, 32, &all).len(), 1);
        assert_eq!(grad_reductions(0, 1, 32, &all).len(), 1);
        assert_eq!(grad_reductions(0, 8, 16, &all).len(), 2);
        // Compression on rings only, as lowering runs it.
        let wide = grad_reductions(0, 8, 32, &all);
        assert_eq!(wide.len(), 3);
        assert!(wide
            .iter()
            .all(|r| r.compression.is_none() || r.algorithm == Algorithm::Ring));
        // The lossy methods only when asked, and never under ZeRO.
        let lossy = DegreeLimits {
            lossy_compression: true,
            ..all
        };
        let asked = grad_reductions(0, 8, 16, &lossy);
        assert_eq!(
            asked
                .iter()
                .filter(|r| r.compression.is_some_and(GradCompression::lossy))
                .count(),
            2
        );
        assert_eq!(grad_reductions(1, 8, 16, &lossy).len(), 1);
    }
}
