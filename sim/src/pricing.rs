//! Durations of a program's instructions: every node of the training graph,
//! every collective and transfer, the optimizer, priced by the same cost
//! models the analytic estimate uses (kernels, rooflines, alpha-beta links),
//! so the simulator and the estimate differ only where replaying the
//! programs finds something the closed forms do not.
//!
//! Two ways to price a backward node:
//! - **as the analytic model does** (GPU runtimes, fused backward kernels):
//!   each forward op's backward time comes from its kernels
//!   ([`Rates::backward`]) and is shared among the backward nodes autodiff
//!   made for it, in proportion to their own rooflines;
//! - **node by node** (the CPU interpreter runs every node as its own
//!   kernel): when the calibration holds measured per-op rates
//!   (`autopar profile`), each node is priced from its op's measured rate.

use autopar_cost_models::comm::{self, Algorithm, Collective, Span};
use autopar_cost_models::compute::Rates;
use autopar_cost_models::measured::node_time;
use autopar_cost_models::memory::optimizer_bytes_per_param;
use autopar_cost_models::workload::kernels::{self, Context, ProductSplit};
use autopar_cost_models::workload::{is_residual_add, AttentionKernel};
use autopar_cost_models::{Calibration, Cluster, GradCompression};
use autopar_ir::interp::Precision;
use autopar_ir::{DType, Graph, NodeIndex, Op, Role, TensorType, UnaryOp};
use autopar_lower::TrainingGraph;
use std::collections::{HashMap, HashSet};

/// How the programs' kernels run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PricingOptions {
    pub attention: AttentionKernel,
    /// Dropout after attention and on residual branches (priced, as the
    /// analytic model does; the training graph itself has none).
    pub dropout: bool,
    /// What the CPU interpreter computes in, for pricing from measured per-op rates.
    pub precision: Precision,
}

impl Default for PricingOptions {
    fn default() -> Self {
        PricingOptions {
            attention: AttentionKernel::Fused,
            dropout: false,
            precision: Precision::F32,
        }
    }
}

/// Seconds of everything a program does, on one cluster.
pub struct Pricing<'a> {
    cluster: Cluster,
    calibration: &'a Calibration,
    rates: Rates<'a>,
    /// Per node of the training graph, by name.
    node_seconds: HashMap<String, f64>,
    /// Whether nodes were priced from measured per-op rates.
    pub per_node: bool,
    /// Share of a processor each rank's computation gets (1: its own).
    core_share: f64,
    /// Per node split over a rank's threads: its time's factor.
    threaded: HashMap<String, f64>,
    /// Ranks sharing the host's cores ([`Pricing::sharing_cores`]).
    ranks: usize,
}

/// Why a plan cannot be priced.
#[derive(Debug, thiserror::Error)]
pub enum PricingError {
    #[error(transparent)]
    Peak(#[from] autopar_cost_models::compute::NoPeak),
    #[error(transparent)]
    Comm(#[from] comm::CommError),
    #[error("tensor '{0}' has a shape the micro-batch does not bind")]
    Unbound(String),
}

/// The resolved type of every input and output of `node`.
fn node_types(g: &Graph, i: NodeIndex) -> Result<(Vec<Option<TensorType>>, Vec<TensorType>), PricingError> {
    let resolve = |id| -> Result<TensorType, PricingError> {
        let t = g.tensor(id);
        let dims =
            t.ty.shape
                .resolve(&g.bindings)
                .ok_or_else(|| PricingError::Unbound(t.name.clone()))?;
        Ok(TensorType {
            dtype: t.ty.dtype,
            shape: autopar_ir::Shape::fixed(&dims),
        })
    };
    let n = g.node(i);
    let inputs = n
        .inputs
        .iter()
        .map(|x| x.map(resolve).transpose())
        .collect::<Result<Vec<_>, _>>()?;
    let outputs = n
        .outputs
        .iter()
        .map(|&o| resolve(o))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((inputs, outputs))
}

/// Bytes of a tensor of `t`.
pub fn type_bytes(t: &TensorType, g: &Graph) -> f64 {
    let elements = t.shape.numel(&g.bindings).unwrap_or(0) as f64;
    elements * t.dtype.size_bits() as f64 / 8.0
}

/// The kernels of node `i` on its own, at its local shapes (the graph is
/// already one rank's share).
fn node_kernels(
    g: &Graph,
    i: NodeIndex,
    opts: &PricingOptions,
    op: &Op,
) -> Result<(Vec<kernels::OpWork>, autopar_ir::Cost, DType), PricingError> {
    let n = g.node(i);
    let (inputs, outputs) = node_types(g, i)?;
    let dtype = outputs
        .first()
        .map(|t| t.dtype)
        .filter(|d| d.is_float())
        .or_else(|| inputs.iter().flatten().map(|t| t.dtype).find(|d| d.is_float()))
        .unwrap_or(DType::F32);
    let cost = op.cost(
        &inputs.iter().map(Option::as_ref).collect::<Vec<_>>(),
        &outputs.iter().collect::<Vec<_>>(),
    );
    let ctx = Context {
        op,
        name: &n.name,
        input_types: &inputs,
        output_types: &outputs,
        dtype,
        work_div: 1.0,
        head_div: 1.0,
        seq_div: 1.0,
        tp: 1.0,
        ep: 1.0,
        // Every linear is whole on this rank; `Columns` at tp 1 prices it as one GEMM over all rows.
        split: if matches!(op, Op::Linear) {
            ProductSplit::Columns
        } else {
            ProductSplit::Whole
        },
        attention: opts.attention,
        dropout: opts.dropout,
        residual_add: is_residual_add(g, n),
    };
    Ok((kernels::price(&ctx, &cost), cost, dtype))
}

impl<'a> Pricing<'a> {
    /// Prices every node of `t` on `cluster` (sized to the plan's ranks).
    pub fn new(
        t: &TrainingGraph,
        cluster: &'a Cluster,
        calibration: &'a Calibration,
        opts: &PricingOptions,
    ) -> Result<Pricing<'a>, PricingError> {
        let g = &t.graph;
        let dtype = compute_dtype(g);
        let effective = Cluster {
            intra_node: calibration.effective_link(cluster.intra_node, true),
            inter_node: calibration.effective_link(cluster.inter_node, false),
            ..cluster.clone()
        };
        let rates = Rates::new(&cluster.device, calibration, dtype)?;
        let per_node = !calibration.ops.is_empty();
        let by_name: HashMap<&str, NodeIndex> =
            g.node_indices().map(|i| (g.node(i).name.as_str(), i)).collect();
        let gradients: HashSet<&str> = t.gradients.iter().map(|(_, g)| g.as_str()).collect();
        // Standalone time of every node: its own kernels as forward kernels.
        let mut own = HashMap::new();
        for i in g.node_indices() {
            let n = g.node(i);
            let layout_only = !per_node && weight_layout(t, i, &by_name, &gradients);
            // Communication is priced as such; a node passing its input on
            // costs nothing on every backend.
            let seconds = if matches!(n.op, Op::Comm { .. }) || layout_only || n.op.passes_input() {
                0.0
            } else if per_node {
                node_time(calibration, &cluster.device, g, i, opts.precision)
                    * calibration.interpreter.map_or(1.0, |c| c.node_factor)
            } else {
                let (works, _, _) = node_kernels(g, i, opts, &n.op)?;
                works.iter().map(|w| rates.forward(w)).sum()
            };
            own.insert(n.name.clone(), seconds);
        }
        let mut node_seconds = own.clone();
        if !per_node {
            // Backward nodes share their forward op's analytic backward time.
            let mut by_origin: HashMap<&str, Vec<&str>> = HashMap::new();
            for (node, origin) in &t.origins {
                by_origin.entry(origin.as_str()).or_default().push(node.as_str());
            }
            for (origin, nodes) in by_origin {
                let Some(&i) = by_name.get(origin) else { continue };
                let op = &g.node(i).op;
                if matches!(op, Op::Comm { .. }) {
                    continue;
                }
                let (works, _, _) = node_kernels(g, i, opts, op)?;
                let backward: f64 = works.iter().map(|w| rates.backward(w)).sum();
                let total: f64 = nodes.iter().map(|n| own[*n]).sum();
                for n in &nodes {
                    let share = if total > 0.0 {
                        own[*n] / total
                    } else {
                        1.0 / nodes.len() as f64
                    };
                    node_seconds.insert(n.to_string(), backward * share);
                }
            }
        }
        Ok(Pricing {
            cluster: effective,
            calibration,
            rates,
            node_seconds,
            per_node,
            core_share: 1.0,
            threaded: HashMap::new(),
            ranks: 1,
        })
    }

    /// The same prices for `ranks` ranks run as threads on `cores`
    /// processors (the CPU backend), each splitting its kernels over
    /// `threads` threads: a rank gets `cores / ranks` of one when there are
    /// more ranks than cores, and computes as much slower than alone as the
    /// calibration measured for the threads running at once (`autopar
    /// profile`); a kernel split `w` ways (by the rules the kernels run:
    /// [`kernel_ways`]) takes `1 / w` of its time, slowed for `ranks · w`
    /// threads instead.
    pub fn sharing_cores(mut self, t: &TrainingGraph, ranks: usize, cores: usize, threads: usize) -> Self {
        let slowdown = self.calibration.thread_slowdown(ranks);
        let share = (cores.max(1) as f64 / ranks.max(1) as f64).min(1.0);
        self.core_share = share / slowdown.max(1.0);
        self.ranks = ranks.max(1);
        let g = &t.graph;
        for i in g.node_indices() {
            let ways = kernel_ways(g, i, threads);
            if ways > 1 {
                let factor = self.split_factor(ways);
                self.threaded.insert(g.node(i).name.clone(), factor);
            }
        }
        self
    }

    /// The factor on a kernel's time when it splits `ways` ways over a
    /// rank's threads ([`Pricing::sharing_cores`]).
    fn split_factor(&self, ways: usize) -> f64 {
        let cal = self.calibration;
        cal.thread_slowdown(self.ranks * ways) / (ways as f64 * cal.thread_slowdown(self.ranks).max(1.0))
    }

    /// Seconds of node `name` for one micro-batch.
    pub fn node(&self, name: &str) -> f64 {
        let threaded = self.threaded.get(name).copied().unwrap_or(1.0);
        self.node_seconds.get(name).copied().unwrap_or(0.0) * threaded / self.core_share
    }

    /// Seconds of a collective over `ranks` moving `bytes` (see
    /// [`comm`]'s conventions).
    pub fn collective(
        &self,
        collective: Collective,
        algorithm: Algorithm,
        bytes: f64,
        ranks: &[usize],
    ) -> f64 {
        if ranks.len() <= 1 || bytes == 0.0 {
            return 0.0;
        }
        let link = Span::of(&self.cluster, ranks)
            .and_then(|span| comm::time(&self.cluster, span, collective, algorithm, bytes))
            .unwrap_or(0.0);
        (link + self.collective_overhead()) / self.comm_share()
    }

    /// What an interpreter spends on each collective beyond the link (0
    /// unless measured).
    fn collective_overhead(&self) -> f64 {
        match (self.serial(), self.calibration.interpreter) {
            (true, Some(c)) => c.collective_overhead_s.unwrap_or(0.0),
            _ => 0.0,
        }
    }

    /// Whether `ranks` sit on more than one node (their traffic crosses
    /// each one's inter-node link).
    pub fn spans_nodes(&self, ranks: &[usize]) -> bool {
        let node = |r: &usize| self.cluster.node_of(*r);
        ranks
            .first()
            .is_some_and(|first| ranks.iter().any(|r| node(r) != node(first)))
    }

    /// Seconds of one message of `bytes` from rank `from` to rank `to`.
    pub fn transfer(&self, bytes: f64, from: usize, to: usize) -> f64 {
        let link = if self.cluster.node_of(from) == self.cluster.node_of(to) {
            self.cluster.intra_node
        } else {
            self.cluster.inter_node
        };
        (link.latency + bytes / link.bandwidth) / self.comm_share()
    }

    /// Bookkeeping an interpreter spends on every instruction (0 unless measured).
    pub fn instruction_overhead(&self) -> f64 {
        match (self.serial(), self.calibration.interpreter) {
            (true, Some(c)) => c.instruction_overhead_s / self.core_share,
            _ => 0.0,
        }
    }

    /// Whether each rank runs its instructions one at a time on one thread
    /// (the CPU interpreter, priced node by node): its collectives and
    /// transfers are work of that thread, not of a separate engine.
    pub fn serial(&self) -> bool {
        self.per_node
    }

    /// Share of a processor a rank's communication gets: collectives are
    /// thread work when the ranks are threads.
    fn comm_share(&self) -> f64 {
        if self.serial() {
            self.core_share
        } else {
            1.0
        }
    }

    /// A streaming pass over `bytes` (gradient accumulation, data loads).
    pub fn streaming(&self, bytes: f64) -> f64 {
        (bytes / self.rates.memory_bandwidth() + self.calibration.kernel_overhead_s) / self.core_share
    }

    /// A gradient compression's own work on `elements` values of
    /// `elem_bytes` each ([`GradCompression::work`]).
    pub fn compression(&self, c: GradCompression, elements: f64, elem_bytes: f64) -> f64 {
        let (flops, bytes) = c.work(elements, elem_bytes);
        self.rates.vector(flops, bytes) / self.core_share
    }

    /// Adding one micro-batch's gradient of `bytes` into the step's: a
    /// pass of its own on an interpreter that runs node by node; free on
    /// GPU runtimes, which accumulate inside the weight-gradient GEMM (as
    /// the analytic model assumes).
    pub fn accumulation(&self, bytes: f64) -> f64 {
        if self.per_node {
            self.streaming(3.0 * bytes)
        } else {
            0.0
        }
    }

    /// Adam over `elements` of a parameter in `dtype`: reads and writes the
    /// master weights and moments, reads the gradient, writes the weights
    /// (the analytic model's optimizer traffic).
    pub fn optimizer(&self, elements: f64, dtype: DType) -> f64 {
        let weights = elements * dtype.size_bits() as f64 / 8.0;
        let state = elements * optimizer_bytes_per_param(dtype);
        ((2.0 * state + 2.0 * weights) / self.rates.memory_bandwidth() + self.calibration.kernel_overhead_s)
            / self.core_share
    }

    /// Bytes per parameter element of the optimizer state.
    pub fn state_bytes_per_element(&self, dtype: DType) -> f64 {
        optimizer_bytes_per_param(dtype)
    }
}

/// A transpose or copy of a weight or of a weight's gradient: free on GPU
/// runtimes, where a GEMM reads a transposed operand in place and a copy
/// aliases its buffer.
fn weight_layout(
    t: &TrainingGraph,
    i: NodeIndex,
    by_name: &HashMap<&str, NodeIndex>,
    gradients: &HashSet<&str>,
) -> bool {
    let g = &t.graph;
    let layout = |i: NodeIndex| {
        matches!(
            g.node(i).op,
            Op::Transpose { .. }
                | Op::Unary {
                    func: UnaryOp::Identity
                }
        )
    };
    let reads_weight = |i: NodeIndex| {
        g.node(i)
            .inputs
            .iter()
            .flatten()
            .any(|&x| g.tensor(x).role == Role::Parameter)
    };
    let n = g.node(i);
    let origin = t
        .origins
        .get(&n.name)
        .and_then(|o| by_name.get(o.as_str()))
        .copied();
    layout(i)
        && (reads_weight(i)
            || n.outputs
                .iter()
                .any(|&o| gradients.contains(g.tensor(o).name.as_str()))
            || origin.is_some_and(|o| layout(o) && reads_weight(o)))
}

/// The dtype of the graph's products: the first float parameter's.
pub fn compute_dtype(g: &Graph) -> DType {
    g.tensors()
        .map(|(_, t)| t)
        .find(|t| t.role == Role::Parameter && t.ty.dtype.is_float())
        .map_or(DType::F32, |t| t.ty.dtype)
}

/// Ways node `i`'s kernel splits over `threads` threads, by the rules the
/// kernels run: a product's rows ([`autopar_ir::op::split_ways`]),
/// attention's (batch, key/value head) groups
/// ([`autopar_ir::op::attention_ways`]), a row-wise kernel's rows
/// ([`autopar_ir::op::row_split`]); 1 for every other kernel.
pub fn kernel_ways(g: &Graph, i: NodeIndex, threads: usize) -> usize {
    let n = g.node(i);
    let rows = || -> Option<usize> {
        let (inputs, outputs) = node_types(g, i).ok()?;
        let float = autopar_ir::op::one_float_type(inputs.iter().flatten().map(|t| t.dtype));
        let out = outputs.first()?.shape.as_fixed()?;
        let (rows, elements) = autopar_ir::op::row_split(&n.op, &out, float)?;
        Some(autopar_ir::op::row_ways(rows, elements, threads))
    };
    let heads = |mask_grad: bool| -> Option<usize> {
        let (inputs, _) = node_types(g, i).ok()?;
        let dims = |slot: usize| inputs.get(slot)?.as_ref()?.shape.as_fixed();
        Some(autopar_ir::op::attention_ways(
            &dims(0)?,
            &dims(1)?,
            mask_grad,
            threads,
        ))
    };
    match &n.op {
        op if autopar_ir::op::splits_over_threads(op) => autopar_cost_models::measured::gemm_shape(g, i)
            .map_or(1, |[m, cols, k]| {
                autopar_ir::op::split_ways(m as usize, cols as usize, k as usize, threads)
            }),
        Op::Attention { .. } => heads(false).unwrap_or(1),
        Op::AttentionGrad { mask_grad, .. } => heads(*mask_grad).unwrap_or(1),
        _ => rows().unwrap_or(1),
    }
}
