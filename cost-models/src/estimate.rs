//! Step-time model: one training step of a configuration on a cluster.
//!
//! Per micro-batch, each pipeline stage runs its layers' forward and
//! backward kernels (plus what recomputation redoes), the tensor-parallel
//! collectives on the critical path, context-parallel key/value gathers
//! (the attention waits for them), expert all-to-alls, and the
//! point-to-point transfers to its neighbours. The slowest stage paces the
//! pipeline; filling and draining it is the bubble. After the last
//! micro-batch, gradients are reduced across data-parallel replicas (exposed,
//! or overlapped with the last backward pass when asked) and the optimizer
//! updates the local shard.

mod data_parallel;

use crate::comm::{self, Algorithm, Collective, Span};
use crate::compute::Rates;
use crate::config::{ConfigError, MeshOrder, Recompute, TrainingConfig};
use crate::memory::{self, MemoryBreakdown, ParamBytes, PartParams};
use crate::pipeline::{self, Stage};
use crate::workload::{CommWork, Group, Unit, Workload};
use crate::{Calibration, Cluster};
use serde::Serialize;

/// Where a step's time goes on the slowest pipeline stage; the parts add up
/// to the step time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct TimeBreakdown {
    /// Kernels: forward, backward and recomputation.
    pub compute_s: f64,
    /// Tensor-parallel collectives (exposed: on the critical path).
    pub tp_comm_s: f64,
    /// Context-parallel key/value gathers and their gradients' reduce-scatters.
    pub cp_comm_s: f64,
    /// Expert-parallel all-to-all.
    pub ep_comm_s: f64,
    /// Data-parallel gradient reduction (and ZeRO gathers) not overlapped.
    pub dp_comm_s: f64,
    /// Pipeline fill and drain, and waiting on slower stages.
    pub bubble_s: f64,
    /// Point-to-point transfers between pipeline stages.
    pub p2p_s: f64,
    /// The optimizer step on the local shard.
    pub optimizer_s: f64,
}

impl TimeBreakdown {
    /// The parts with names for people, in a fixed order.
    pub fn parts(&self) -> [(&'static str, f64); 8] {
        [
            ("compute", self.compute_s),
            ("tensor-parallel comm", self.tp_comm_s),
            ("context-parallel comm", self.cp_comm_s),
            ("expert-parallel comm", self.ep_comm_s),
            ("data-parallel comm", self.dp_comm_s),
            ("pipeline bubble", self.bubble_s),
            ("pipeline p2p", self.p2p_s),
            ("optimizer", self.optimizer_s),
        ]
    }
}

/// The estimate of one configuration.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Estimate {
    pub step_time_s: f64,
    /// Model FLOPs (forward and backward, no recomputation) per GPU per second, in TFLOP/s.
    pub model_tflops_per_gpu: f64,
    /// FLOPs the kernels execute (recomputation and replicated work
    /// included) per GPU per second, in TFLOP/s.
    pub hardware_tflops_per_gpu: f64,
    /// Model FLOP utilisation of the compute dtype's peak.
    pub mfu: f64,
    /// Hardware FLOP utilisation.
    pub hfu: f64,
    /// Peak bytes on the fullest GPU.
    pub memory_per_gpu_bytes: f64,
    /// The peak fits in the device's memory.
    pub fits: bool,
    pub breakdown: TimeBreakdown,
    pub memory: MemoryBreakdown,
    /// The pipeline stage with the memory peak.
    pub memory_peak_stage: usize,
    pub memory_capacity_bytes: f64,
    pub micro_batches: usize,
    pub virtual_stages: usize,
    pub dp: usize,
    /// Bytes the busiest GPU sends per step over every collective and
    /// transfer, hidden or not: between equally fast plans, the one that
    /// loads the links less is the safer pick. Absent in older plan files.
    #[serde(default)]
    pub comm_bytes_per_gpu: f64,
}

/// Why a configuration cannot be estimated.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EstimateError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("--tp {tp} does not divide the attention's {heads} {kind} heads")]
    Heads {
        tp: usize,
        heads: usize,
        kind: &'static str,
    },
    #[error("--pp {pp} × --virtual-stages {virtual_stages} exceeds the model's {layers} layers")]
    TooManyStages {
        pp: usize,
        virtual_stages: usize,
        layers: usize,
    },
    #[error("--pp {0} needs repeated layers to split, and none were found in the model")]
    NoLayers(usize),
    #[error(
        "--cp {cp} cuts the sequence into {} chunks (two per rank, balanced for causal attention), \
         but {seq} tokens do not divide into them",
        2 * cp
    )]
    ContextChunks { cp: usize, seq: usize },
    #[error("the configuration's mesh differs from the one the evaluator priced")]
    MeshMismatch,
    #[error("the stages hold {total} layers in all; the model has {layers}")]
    StageLayers { total: usize, layers: usize },
    #[error(transparent)]
    Peak(#[from] crate::compute::NoPeak),
    #[error(transparent)]
    Comm(#[from] comm::CommError),
}

/// Where a step's time goes, per stage and after the pipeline.
struct Timing {
    /// Per stage: unit times, exposed ZeRO-3 comm and p2p per micro-batch.
    per_stage: Vec<(UnitTime, f64, f64)>,
    /// Per stage: seconds per micro-batch.
    times: Vec<f64>,
    pipe: f64,
    slowest: usize,
    dp_exposed: f64,
    optimizer: f64,
}

/// Times of one unit for one micro-batch on one rank.
#[derive(Debug, Clone, Copy, Default)]
struct UnitTime {
    compute: f64,
    tp: f64,
    cp: f64,
    ep: f64,
    /// The compute stream's time in the forward pass: kernels and the
    /// collectives on the critical path.
    forward: f64,
    /// The same in the backward pass (recomputation included): what
    /// gradient reduction hides under. `forward + backward` is the sum of
    /// the four parts above.
    backward: f64,
    hardware_flops: f64,
    /// Bytes this rank sends in the unit's collectives.
    sent: f64,
    /// Seconds of the linear layers' GEMMs (forward, backward and
    /// recomputed): what tensor-parallel communication overlap hides under.
    gemm: f64,
}

impl UnitTime {
    fn scaled(self, k: f64) -> UnitTime {
        UnitTime {
            compute: self.compute * k,
            tp: self.tp * k,
            cp: self.cp * k,
            ep: self.ep * k,
            forward: self.forward * k,
            backward: self.backward * k,
            hardware_flops: self.hardware_flops * k,
            sent: self.sent * k,
            gemm: self.gemm * k,
        }
    }

    /// The unit with its tensor-parallel collectives run beside its GEMMs:
    /// the part the GEMMs cover leaves the compute stream, from each pass
    /// in proportion to its length.
    fn tp_overlapped(self) -> UnitTime {
        let hidden = self.tp.min(self.gemm);
        let busy = self.forward + self.backward;
        let share = if busy > 0.0 { self.forward / busy } else { 0.5 };
        UnitTime {
            tp: self.tp - hidden,
            forward: self.forward - hidden * share,
            backward: self.backward - hidden * (1.0 - share),
            ..self
        }
    }

    fn add(self, o: UnitTime) -> UnitTime {
        UnitTime {
            compute: self.compute + o.compute,
            tp: self.tp + o.tp,
            cp: self.cp + o.cp,
            ep: self.ep + o.ep,
            forward: self.forward + o.forward,
            backward: self.backward + o.backward,
            hardware_flops: self.hardware_flops + o.hardware_flops,
            sent: self.sent + o.sent,
            gemm: self.gemm + o.gemm,
        }
    }
}

/// The groups a rank talks to, located on the cluster. Ranks are numbered
/// tensor-parallel fastest, then context parallel, then data and pipeline
/// parallel in the configuration's [`MeshOrder`], so tensor-parallel groups
/// sit inside nodes.
struct Groups {
    tensor: Span,
    context: Span,
    expert: Span,
    data: Span,
    expert_data: Span,
    /// A rank and the same rank of the next stage.
    stage_hop: Span,
}

/// The mesh shape an [`Evaluator`] is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mesh {
    pub dp: usize,
    pub tp: usize,
    pub pp: usize,
    pub cp: usize,
    pub ep: usize,
    pub order: MeshOrder,
}

impl Mesh {
    /// The mesh of `cfg`.
    pub fn of(cfg: &TrainingConfig) -> Mesh {
        Mesh {
            dp: cfg.dp,
            tp: cfg.tp,
            pp: cfg.pp,
            cp: cfg.cp,
            ep: cfg.ep,
            order: cfg.mesh_order,
        }
    }

    /// Stride between consecutive data-parallel replicas and between
    /// consecutive pipeline stages, in ranks.
    pub fn strides(&self) -> (usize, usize) {
        let inner = self.tp * self.cp;
        match self.order {
            MeshOrder::DataInner => (inner, inner * self.dp),
            MeshOrder::PipelineInner => (inner * self.pp, inner),
        }
    }

    /// The global rank of a (tp, cp, dp, pp) coordinate.
    pub fn rank(&self, tp: usize, cp: usize, dp: usize, pp: usize) -> usize {
        let (dp_stride, pp_stride) = self.strides();
        tp + self.tp * cp + dp_stride * dp + pp_stride * pp
    }
}

impl Groups {
    fn new(cluster: &Cluster, mesh: &Mesh) -> Result<Groups, comm::CommError> {
        let span = |ranks: Vec<usize>| Span::of(cluster, &ranks);
        let replicas = |step: usize, count: usize| -> Vec<usize> {
            (0..count)
                .flat_map(|d| (0..mesh.cp).map(move |c| mesh.rank(0, c, step * d, 0)))
                .collect()
        };
        // Groups of one kind can sit differently on the nodes (tensor
        // parallelism 6 on 8-GPU nodes): the widest paces every rank. Up to
        // a node's worth of each other coordinate sees every way one sits.
        let reach = |n: usize| 0..n.min(cluster.gpus_per_node);
        let widest = |groups: Vec<Vec<usize>>| -> Result<Span, comm::CommError> {
            let spans = groups
                .iter()
                .map(|g| Span::of(cluster, g))
                .collect::<Result<Vec<_>, _>>()?;
            spans
                .into_iter()
                .max_by_key(|s| (s.nodes, s.per_node))
                .ok_or(comm::CommError::EmptyGroup)
        };
        let pairs = |a: usize, b: usize| reach(a).flat_map(move |x| reach(b).map(move |y| (x, y)));
        let tensor = widest(
            pairs(mesh.cp, mesh.dp)
                .map(|(c, d)| (0..mesh.tp).map(|t| mesh.rank(t, c, d, 0)).collect())
                .collect(),
        )?;
        let context = widest(
            pairs(mesh.tp, mesh.dp)
                .map(|(t, d)| (0..mesh.cp).map(|c| mesh.rank(t, c, d, 0)).collect())
                .collect(),
        )?;
        let ep = mesh.ep.max(1);
        let expert = widest(
            pairs(mesh.tp, mesh.cp)
                .flat_map(|(t, c)| {
                    reach(mesh.dp / ep)
                        .map(move |g| (0..ep).map(|e| mesh.rank(t, c, g * ep + e, 0)).collect())
                })
                .collect(),
        )?;
        Ok(Groups {
            tensor,
            context,
            expert,
            data: span(replicas(1, mesh.dp))?,
            expert_data: span(replicas(mesh.ep, mesh.dp / mesh.ep.max(1)))?,
            stage_hop: if mesh.pp > 1 {
                span(vec![0, mesh.rank(0, 0, 0, 1)])?
            } else {
                Span {
                    per_node: 1,
                    nodes: 1,
                }
            },
        })
    }
}

/// Estimates one configuration. `cluster` must already be sized to the
/// configuration's GPUs ([`Cluster::with_gpus`]).
pub fn estimate(
    w: &Workload,
    cluster: &Cluster,
    calibration: &Calibration,
    cfg: &TrainingConfig,
) -> Result<Estimate, EstimateError> {
    Evaluator::new(w, cluster, calibration, &Mesh::of(cfg), cfg.sp)?.evaluate(cfg)
}

/// Everything about a workload on a mesh that does not depend on the
/// schedule, ZeRO stage, recomputation or stage split, priced once so that
/// the planner can evaluate many of those cheaply.
pub struct Evaluator<'a> {
    w: &'a Workload,
    cluster: &'a Cluster,
    calibration: &'a Calibration,
    rates: Rates<'a>,
    mesh: Mesh,
    /// One layer's times under none, selective and full recomputation.
    layer: [UnitTime; 3],
    pre: UnitTime,
    post: UnitTime,
    /// Forward and backward seconds Megatron-LM's f32 cross-entropy adds
    /// to the loss lowering runs (`cfg.f32_cross_entropy`).
    f32_cross_entropy: (f64, f64),
    /// One forward or backward transfer between stages, and the bytes a rank sends in it.
    p2p: f64,
    p2p_bytes: f64,
    params: PartParams,
    data_parallel: data_parallel::Traffic,
}

/// What makes two stages' data-parallel traffic and optimizer step
/// alike: the parts and layers they hold, what they recompute, and under
/// ZeRO-2 (whose reductions wait for the pipeline to drain) their place.
type StageKind = (bool, bool, usize, Recompute, usize);

fn kind_of(cfg: &TrainingConfig, s: &Stage) -> StageKind {
    let place = if cfg.zero == 2 { s.index } else { 0 };
    (s.first, s.last, s.layers, s.recompute, place)
}

fn policy_index(r: Recompute) -> usize {
    match r {
        Recompute::None => 0,
        Recompute::Selective => 1,
        Recompute::Full => 2,
    }
}

impl<'a> Evaluator<'a> {
    /// Prices `w` on `mesh` over `cluster` (sized to the mesh's GPUs).
    pub fn new(
        w: &'a Workload,
        cluster: &'a Cluster,
        calibration: &'a Calibration,
        mesh: &Mesh,
        sp: bool,
    ) -> Result<Evaluator<'a>, EstimateError> {
        let rates = Rates::new(&cluster.device, calibration, w.compute_dtype)?;
        let effective = Cluster {
            intra_node: calibration.effective_link(cluster.intra_node, true),
            inter_node: calibration.effective_link(cluster.inter_node, false),
            ..cluster.clone()
        };
        if mesh.dp % mesh.ep.max(1) != 0 {
            return Err(ConfigError::EpNotDividingDp {
                ep: mesh.ep,
                dp: mesh.dp,
            }
            .into());
        }
        let groups = Groups::new(&effective, mesh)?;
        let net = Net {
            cluster: &effective,
            groups: &groups,
        };
        let layer = [Recompute::None, Recompute::Selective, Recompute::Full]
            .map(|policy| unit_time(&w.layer, &rates, &net, policy));
        let [none, selective, full] = layer;
        let layer = [none?, selective?, full?];
        let pre = unit_time(&w.pre, &rates, &net, Recompute::None)?;
        let post = unit_time(&w.post, &rates, &net, Recompute::None)?;
        let megatron = crate::workload::kernels::megatron_cross_entropy(w.loss_elements, w.compute_dtype);
        let ours = |time: &dyn Fn(&crate::workload::OpWork) -> f64| w.loss.iter().map(time).sum::<f64>();
        let f32_cross_entropy = (
            rates.forward(&megatron) - ours(&|k| rates.forward(k)),
            rates.backward(&megatron) - ours(&|k| rates.backward(k)),
        );
        let p2p = p2p_transfer(w, mesh, sp, &net)?;
        let ends = match mesh.pp {
            1 => groups.stage_hop,
            pp => Span::of(&effective, &[0, mesh.rank(0, 0, 0, pp - 1)])?,
        };
        let data_parallel = data_parallel::Traffic::new(
            w,
            &data_parallel::Net {
                cluster: &effective,
                data: groups.data,
                expert_data: groups.expert_data,
                ends,
            },
        )?;
        Ok(Evaluator {
            w,
            cluster,
            calibration,
            rates,
            mesh: *mesh,
            layer,
            pre,
            post,
            f32_cross_entropy,
            p2p,
            p2p_bytes: w.boundary_bytes / mesh.tp as f64,
            params: PartParams::of(w),
            data_parallel,
        })
    }

    /// The workload's parameter totals per part.
    pub fn params(&self) -> &PartParams {
        &self.params
    }

    /// Seconds one micro-batch spends on `stage` (forward, backward,
    /// recomputation, collectives and transfers): the planner balances these.
    pub fn stage_seconds(&self, cfg: &TrainingConfig, stage: &Stage) -> Result<f64, EstimateError> {
        let (t, zero3, p2p) = self.stage_time(cfg, stage)?;
        Ok(t.compute + t.tp + t.cp + t.ep + p2p + zero3)
    }

    /// Peak memory of one GPU on `stage` under `cfg`.
    pub fn stage_memory(&self, cfg: &TrainingConfig, stage: &Stage) -> MemoryBreakdown {
        memory::stage_memory(self.w, &self.params, cfg, stage)
    }

    /// Time of one micro-batch through one stage (forward and backward,
    /// with its collectives and transfers), and the parts of it.
    fn stage_time(&self, cfg: &TrainingConfig, stage: &Stage) -> Result<(UnitTime, f64, f64), EstimateError> {
        let [pre, layer, post] = self.unit_times(cfg, stage);
        let mut t = layer.scaled(stage.layers as f64);
        if stage.first {
            t = t.add(pre);
        }
        if stage.last {
            t = t.add(post);
        }
        let zero3 = self
            .data_parallel
            .zero3_exposed(cfg, stage, [&pre, &layer, &post])?;
        let p2p = if cfg.pp > 1 {
            2.0 * cfg.virtual_stages as f64 * self.p2p
        } else {
            0.0
        };
        Ok((t, zero3, p2p))
    }

    /// One micro-batch of the part before the layers, of one of `stage`'s
    /// layers and of the part after them, with tensor-parallel overlap if
    /// `cfg` asks for it.
    fn unit_times(&self, cfg: &TrainingConfig, stage: &Stage) -> [UnitTime; 3] {
        let overlap = |u: UnitTime| if cfg.tp_comm_overlap { u.tp_overlapped() } else { u };
        let mut post = self.post;
        if cfg.f32_cross_entropy {
            let (forward, backward) = self.f32_cross_entropy;
            post.forward += forward;
            post.backward += backward;
            post.compute += forward + backward;
        }
        [
            overlap(self.pre),
            overlap(self.layer[policy_index(stage.recompute)]),
            overlap(post),
        ]
    }

    /// The pipeline's stages under `cfg` (explicit or evenly spread).
    pub fn stages(&self, cfg: &TrainingConfig) -> Vec<Stage> {
        match &cfg.stages {
            Some(specs) => pipeline::from_specs(specs),
            None => pipeline::stages(self.w.layers, cfg.pp, cfg.virtual_stages, cfg.recompute),
        }
    }

    /// Estimates `cfg`, which must have this evaluator's mesh.
    pub fn evaluate(&self, cfg: &TrainingConfig) -> Result<Estimate, EstimateError> {
        let w = self.w;
        let stages = self.checked_stages(cfg)?;
        let gpus = self.cluster.gpus();
        let m = cfg.micro_batches();
        let Timing {
            per_stage,
            times,
            pipe,
            slowest,
            dp_exposed,
            optimizer,
        } = self.timing(cfg, &stages)?;
        let (t, zero3, p2p) = per_stage[slowest];
        let step = pipe + dp_exposed + optimizer;
        let mf = m as f64;
        let breakdown = TimeBreakdown {
            compute_s: mf * t.compute,
            tp_comm_s: mf * t.tp,
            cp_comm_s: mf * t.cp,
            ep_comm_s: mf * t.ep,
            dp_comm_s: dp_exposed + mf * zero3,
            bubble_s: pipe - mf * times[slowest],
            p2p_s: mf * p2p,
            optimizer_s: optimizer,
        };

        let model_flops = (w.model_flops.0 + w.model_flops.1) * mf * cfg.dp as f64;
        let ranks_per_stage = (cfg.tp * cfg.cp * cfg.dp) as f64;
        let hardware_flops: f64 =
            per_stage.iter().map(|(t, _, _)| t.hardware_flops).sum::<f64>() * mf * ranks_per_stage;
        let per_gpu = |flops: f64| flops / step / gpus as f64;
        let (peak_stage, mem) = stages
            .iter()
            .map(|s| (s.index, memory::stage_memory(w, &self.params, cfg, s)))
            .max_by(|a, b| a.1.total.total_cmp(&b.1.total))
            .unwrap_or_default();
        let capacity = self.cluster.device.memory_bytes;
        let mut comm_bytes: f64 = 0.0;
        let mut sent: Vec<(StageKind, f64)> = Vec::new();
        for (s, (t, _, _)) in stages.iter().zip(&per_stage) {
            let p2p = if cfg.pp > 1 {
                2.0 * cfg.virtual_stages as f64 * self.p2p_bytes
            } else {
                0.0
            };
            let kind = kind_of(cfg, s);
            let dp = match sent.iter().find(|(k, _)| *k == kind) {
                Some(&(_, dp)) => dp,
                None => {
                    let wire =
                        cfg.grad_reduce
                            .wire(cfg.zero, w.compute_dtype, w.params_counted(), &self.rates);
                    let dp = self.data_parallel.sent(cfg, s, wire)?;
                    sent.push((kind, dp));
                    dp
                }
            };
            comm_bytes = comm_bytes.max(mf * (t.sent + p2p) + dp);
        }
        Ok(Estimate {
            step_time_s: step,
            model_tflops_per_gpu: per_gpu(model_flops) / 1e12,
            hardware_tflops_per_gpu: per_gpu(hardware_flops) / 1e12,
            mfu: per_gpu(model_flops) / self.rates.peak(),
            hfu: per_gpu(hardware_flops) / self.rates.peak(),
            memory_per_gpu_bytes: mem.total,
            fits: mem.total <= capacity,
            breakdown,
            memory: mem,
            memory_peak_stage: peak_stage,
            memory_capacity_bytes: capacity,
            micro_batches: m,
            virtual_stages: cfg.virtual_stages,
            dp: cfg.dp,
            comm_bytes_per_gpu: comm_bytes,
        })
    }

    /// The step time of `cfg` alone: what the planner compares candidate
    /// stage splits by, without the memory and FLOP accounting.
    pub fn step_seconds(&self, cfg: &TrainingConfig) -> Result<f64, EstimateError> {
        let stages = self.checked_stages(cfg)?;
        let t = self.timing(cfg, &stages)?;
        Ok(t.pipe + t.dp_exposed + t.optimizer)
    }

    /// `cfg`'s stages after checking `cfg` fits the model and this mesh.
    fn checked_stages(&self, cfg: &TrainingConfig) -> Result<Vec<Stage>, EstimateError> {
        if Mesh::of(cfg) != self.mesh {
            return Err(EstimateError::MeshMismatch);
        }
        check_model(self.w, cfg)?;
        cfg.check(self.cluster.gpus())?;
        if let Some(specs) = &cfg.stages {
            let total: usize = specs.iter().map(|s| s.layers).sum();
            if total != self.w.layers {
                return Err(EstimateError::StageLayers {
                    total,
                    layers: self.w.layers,
                });
            }
        }
        Ok(self.stages(cfg))
    }

    /// Per-stage times, the pipeline's time, and what follows it.
    fn timing(&self, cfg: &TrainingConfig, stages: &[Stage]) -> Result<Timing, EstimateError> {
        let mut per_stage = Vec::with_capacity(stages.len());
        for s in stages {
            per_stage.push(self.stage_time(cfg, s)?);
        }
        let times: Vec<f64> = per_stage
            .iter()
            .map(|(t, zero3, p2p)| t.compute + t.tp + t.cp + t.ep + p2p + zero3)
            .collect();
        let pipe = pipeline::step_time(cfg.micro_batches(), cfg.virtual_stages, &times);
        let slowest = (0..times.len())
            .max_by(|&a, &b| times[a].total_cmp(&times[b]))
            .unwrap_or(0);
        let mut dp_exposed: f64 = 0.0;
        let mut optimizer: f64 = 0.0;
        let wire = cfg.grad_reduce.wire(
            cfg.zero,
            self.w.compute_dtype,
            self.w.params_counted(),
            &self.rates,
        );
        let mut priced = Vec::new();
        for s in stages {
            // Stages alike in what they hold price alike (middle stages of
            // a deep pipeline; ZeRO-2's draining depends on the index too).
            let kind = kind_of(cfg, s);
            if priced.contains(&kind) {
                continue;
            }
            priced.push(kind);
            let params = self.params.stage(s);
            let [pre, layer, post] = self.unit_times(cfg, s);
            let tail = self
                .data_parallel
                .after_pipeline(cfg, s, [&pre, &layer, &post], wire)?;
            dp_exposed = dp_exposed.max(tail);
            optimizer = optimizer.max(self.optimizer_time(&params, cfg, s));
        }
        Ok(Timing {
            per_stage,
            times,
            pipe,
            slowest,
            dp_exposed,
            optimizer,
        })
    }

    /// Adam over the local shard: memory-bound, reading and writing the
    /// master weights and both moments, reading the gradient, writing the
    /// weights; one kernel per parameter tensor, as the backends step them.
    fn optimizer_time(&self, params: &ParamBytes, cfg: &TrainingConfig, stage: &Stage) -> f64 {
        let shards = |expert: bool| {
            let r = if expert { cfg.dp / cfg.ep } else { cfg.dp } * cfg.cp;
            if cfg.zero >= 1 {
                r.max(1) as f64
            } else {
                1.0
            }
        };
        let traffic = |weights: f64, state: f64| 2.0 * state + 2.0 * weights;
        let bytes = traffic(params.dense, params.dense_state) / shards(false)
            + traffic(params.expert, params.expert_state) / shards(true);
        if bytes == 0.0 {
            0.0
        } else {
            let tensors = self.data_parallel.tensors(stage) as f64;
            bytes / self.rates.memory_bandwidth() + tensors * self.calibration.kernel_overhead_s
        }
    }
}

/// The heads an attention with `q` query and `kv` key/value heads cannot
/// split `tp` ways, as `(count, kind)`: query heads must divide, and so
/// must key/value heads unless there is one (multi-query attention, which
/// every rank reads whole: the attention's `query heads` sharding rule).
pub fn unsplit_heads(q: usize, kv: usize, tp: usize) -> Option<(usize, &'static str)> {
    if q % tp != 0 {
        Some((q, "query"))
    } else if kv % tp != 0 && kv != 1 {
        Some((kv, "key/value"))
    } else {
        None
    }
}

/// Checks the model can be split as asked.
fn check_model(w: &Workload, cfg: &TrainingConfig) -> Result<(), EstimateError> {
    for &(q, kv) in &w.heads {
        if let Some((heads, kind)) = unsplit_heads(q, kv, cfg.tp) {
            return Err(EstimateError::Heads {
                tp: cfg.tp,
                heads,
                kind,
            });
        }
    }
    if cfg.pp > 1 && w.layers == 0 {
        return Err(EstimateError::NoLayers(cfg.pp));
    }
    if let Some(seq) = w.seq.filter(|s| cfg.cp > 1 && s % (2 * cfg.cp) != 0) {
        return Err(EstimateError::ContextChunks { cp: cfg.cp, seq });
    }
    if w.layers > 0 && cfg.pp * cfg.virtual_stages > w.layers {
        return Err(EstimateError::TooManyStages {
            pp: cfg.pp,
            virtual_stages: cfg.virtual_stages,
            layers: w.layers,
        });
    }
    Ok(())
}

/// The cluster with achievable link rates, and where the groups sit on it.
struct Net<'a> {
    cluster: &'a Cluster,
    groups: &'a Groups,
}

impl Net<'_> {
    fn time(&self, span: Span, collective: Collective, bytes: f64) -> Result<f64, comm::CommError> {
        comm::time(self.cluster, span, collective, Algorithm::Ring, bytes)
    }

    fn span(&self, group: Group) -> Span {
        match group {
            Group::Tensor => self.groups.tensor,
            Group::Context => self.groups.context,
            Group::Expert => self.groups.expert,
        }
    }

    /// Bytes one member sends in `collective` over `c`'s group.
    fn sent(&self, c: &CommWork, collective: Option<Collective>) -> Result<f64, comm::CommError> {
        let Some(collective) = collective else {
            return Ok(0.0);
        };
        let n = self.span(c.group).ranks();
        Ok(comm::bytes_sent(collective, Algorithm::Ring, n, c.bytes)?[0])
    }

    /// Forward and backward time of one collective of a unit.
    fn comm_times(&self, c: &CommWork) -> Result<(f64, f64), comm::CommError> {
        let span = self.span(c.group);
        let one = |coll: Option<Collective>| coll.map_or(Ok(0.0), |coll| self.time(span, coll, c.bytes));
        Ok((one(c.forward)?, one(c.backward)?))
    }
}

/// One micro-batch of `unit` on one rank under recomputation `policy`.
fn unit_time(unit: &Unit, rates: &Rates, net: &Net, policy: Recompute) -> Result<UnitTime, EstimateError> {
    let (mut fwd, mut bwd, mut redo) = (0.0, 0.0, 0.0);
    let (mut flops, mut redo_flops, mut gemm) = (0.0, 0.0, 0.0);
    for op in &unit.ops {
        let f = rates.forward(op);
        fwd += f;
        bwd += rates.backward(op);
        let linear = matches!(op.kernel, crate::workload::Kernel::Matmul { .. }) && !op.attention_core;
        if linear {
            gemm += f + rates.backward(op);
        }
        flops += op.forward_flops + op.backward_flops;
        let redone = match policy {
            Recompute::None => false,
            Recompute::Selective => op.attention_core,
            Recompute::Full => true,
        };
        if redone {
            redo += f;
            redo_flops += op.forward_flops;
            if linear {
                gemm += f;
            }
        }
    }
    let (mut tp, mut cp_fwd, mut cp_bwd, mut ep) = (0.0, 0.0, 0.0, 0.0);
    // Collectives of the forward pass on the compute stream (tensor and expert).
    let mut forward_comm = 0.0;
    let mut sent = 0.0;
    // Inputs the backward pass gathers again: issued as the layer's backward
    // pass starts, read by the weights' gradients later in it.
    let mut regather = 0.0;
    for c in &unit.comms {
        let (f, b) = net.comm_times(c)?;
        // Full recomputation repeats the forward pass's collectives.
        let full = policy == Recompute::Full;
        let again = c.regathered && !full;
        let repeats = if full { 2.0 } else { 1.0 };
        sent += (repeats + f64::from(u8::from(again))) * net.sent(c, c.forward)? + net.sent(c, c.backward)?;
        if again {
            regather += f;
        }
        let f_total = repeats * f;
        match c.group {
            Group::Tensor => tp += f_total + b,
            Group::Context => {
                cp_fwd += f_total;
                cp_bwd += b;
            }
            Group::Expert => ep += f_total + b,
        }
        if c.group != Group::Context {
            forward_comm += f;
        }
    }
    // The attention waits for its gathered keys and values, and their
    // gradients' reduce-scatter ends the attention's backward: lowering
    // runs them beside no compute.
    let cp = cp_fwd + cp_bwd;
    // The second gathers run beside the backward pass's computation.
    tp += (regather - bwd).max(0.0);
    let forward = fwd + forward_comm + cp_fwd;
    Ok(UnitTime {
        compute: fwd + bwd + redo,
        tp,
        cp,
        ep,
        forward,
        backward: fwd + bwd + redo + tp + cp + ep - forward,
        hardware_flops: flops + redo_flops,
        sent,
        gemm,
    })
}

/// One transfer between stages of one micro-batch's boundary activation.
/// Each tensor-parallel rank sends its `1/tp` slice and the receivers
/// all-gather it over the fast links (Megatron-LM's scatter/gather); under
/// sequence parallelism the slices are what the next stage needs.
fn p2p_transfer(w: &Workload, mesh: &Mesh, sp: bool, net: &Net) -> Result<f64, EstimateError> {
    if mesh.pp == 1 {
        return Ok(0.0);
    }
    let slice = w.boundary_bytes / mesh.tp as f64;
    let mut one = net.time(net.groups.stage_hop, Collective::SendRecv, slice)?;
    if !sp {
        one += net.time(net.groups.tensor, Collective::AllGather, w.boundary_bytes)?;
    }
    Ok(one)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MeshOrder;

    fn groups(gpus: usize, tp: usize, cp: usize, dp: usize) -> Groups {
        let cluster = Cluster::preset("dgx-h100")
            .and_then(|c| c.with_gpus(gpus))
            .unwrap();
        let mesh = Mesh {
            dp,
            tp,
            pp: 1,
            cp,
            ep: 1,
            order: MeshOrder::DataInner,
        };
        Groups::new(&cluster, &mesh).unwrap()
    }

    /// Tensor parallelism 6 on 8-GPU nodes: the first group sits in one
    /// node, the second straddles two, and it sets the pace; groups that
    /// divide the node stay inside it.
    #[test]
    fn the_widest_group_of_a_kind_is_priced() {
        let straddling = groups(48, 6, 1, 8);
        assert_eq!((straddling.tensor.nodes, straddling.tensor.per_node), (2, 4));
        let inside = groups(48, 4, 2, 6);
        assert_eq!((inside.tensor.nodes, inside.context.nodes), (1, 1));
        // Context parallelism 3 over tensor parallelism 2: 6 ranks a group.
        let context = groups(48, 2, 3, 8);
        assert_eq!(context.context.nodes, 2);
    }
}
