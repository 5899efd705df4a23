//! What one rank computes for one micro-batch: the model split into the
//! units a pipeline places (the part before the repeated layers, one
//! representative layer, the part after), each op's kernels with their
//! FLOPs and bytes on that rank, the activations it keeps for the backward
//! pass, its parameter shards, and the collectives tensor, context and
//! expert parallelism add.
//!
//! Tensor-parallel layouts follow [`layout`]; sequence parallelism splits
//! the replicated activations along the sequence; context parallelism splits
//! every activation along the sequence and gathers keys and values for
//! attention; expert parallelism spreads each MoE layer's experts and moves
//! tokens with all-to-all.

mod kernels;
pub mod layout;

use crate::comm::Collective;
use autopar_ir::{Bindings, DType, Dim, Graph, NodeIndex, Op, Role, Shape, TensorId, TensorType};
use layout::{decide, Layout};
use std::collections::{BTreeMap, HashMap, HashSet};

pub use kernels::{AttentionKernel, Kernel, OpWork, ProductSplit};

/// How the model is split inside one pipeline stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sharding {
    /// Tensor-parallel degree.
    pub tp: usize,
    /// Sequence parallelism: activations outside the tensor-parallel
    /// regions are split along the sequence across the tensor-parallel group.
    pub sp: bool,
    /// Context-parallel degree (the sequence split across ranks).
    pub cp: usize,
    /// Expert-parallel degree (MoE experts spread across ranks).
    pub ep: usize,
}

/// What to build the workload for.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadOptions {
    /// Samples per micro-batch (binds the `batch` dim); `None` keeps the model's.
    pub micro_batch: Option<usize>,
    /// Sequence length (binds the `seq` dim); `None` keeps the model's.
    pub seq: Option<usize>,
    pub sharding: Sharding,
    pub attention: AttentionKernel,
    /// Training dropout in the Megatron places: on attention probabilities
    /// and on each residual branch (and the embedding sum) before it is added.
    pub dropout: bool,
}

/// The tensor-parallel, context-parallel or expert-parallel group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    Tensor,
    Context,
    Expert,
}

/// One collective a unit issues per micro-batch.
#[derive(Debug, Clone, PartialEq)]
pub struct CommWork {
    pub group: Group,
    /// Collective in the forward pass, if any.
    pub forward: Option<Collective>,
    /// Collective in the backward pass, if any.
    pub backward: Option<Collective>,
    /// Logical buffer size in bytes (see [`crate::comm`] for the convention).
    pub bytes: f64,
    /// Runs concurrently with the attention it feeds (context parallelism's
    /// key/value exchange), so only its excess over that compute is exposed.
    pub overlaps_attention: bool,
}

/// A parameter's share on one rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParamShard {
    pub elements: f64,
    pub dtype: DType,
    /// An MoE expert weight: sharded by expert parallelism and reduced over
    /// the expert-data-parallel group.
    pub expert: bool,
}

/// Part of the model placed as one piece: pre-layers, one layer, post-layers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Unit {
    pub ops: Vec<OpWork>,
    pub comms: Vec<CommWork>,
    pub params: BTreeMap<usize, ParamShard>,
    /// Activation bytes kept for the backward pass without recomputation.
    pub saved_bytes: f64,
    /// Of those, the bytes selective recomputation drops (attention's
    /// score-sized tensors).
    pub selective_bytes: f64,
}

/// One rank's work for one micro-batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub pre: Unit,
    /// One representative layer.
    pub layer: Unit,
    /// How many layers repeat it (0 when the model has no repeated layers).
    pub layers: usize,
    pub post: Unit,
    /// Bytes on one rank of the activation passed from one layer to the next
    /// (before sequence-parallel splitting): what pipeline stages send and
    /// full recomputation checkpoints.
    pub boundary_bytes: f64,
    /// Bytes on one rank of the graph outputs (logits), held with their
    /// gradient while the loss is computed.
    pub output_bytes: f64,
    /// Element type of the products (sets the peak FLOP/s).
    pub compute_dtype: DType,
    /// Forward and backward FLOPs of the whole model for one micro-batch on
    /// one model replica (no recomputation): the "model FLOPs" of MFU.
    pub model_flops: (f64, f64),
    pub micro_batch: usize,
    pub seq: Option<usize>,
    /// `(query heads, key/value heads)` of each attention op in the layer.
    pub heads: Vec<(usize, usize)>,
}

/// Why a workload cannot be built.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WorkloadError {
    #[error("tensor '{tensor}' has shape {shape} with an unbound symbol; give --micro-batch/--seq")]
    Unbound { tensor: String, shape: String },
    #[error("the model has a fixed {what} of {fixed} (no '{symbol}' dim to bind); {flag} must be {fixed}, not {given}")]
    FixedDim {
        what: &'static str,
        symbol: &'static str,
        flag: &'static str,
        fixed: usize,
        given: usize,
    },
    #[error("context parallelism needs attention as canonical Attention ops; node '{node}' computes attention scores with MatMul")]
    ContextNeedsAttention { node: String },
    #[error(transparent)]
    Graph(#[from] autopar_ir::GraphError),
    #[error(transparent)]
    Stats(#[from] autopar_ir::StatsError),
}

/// Which unit a node belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Pre,
    Layer,
    /// A later repeat of the layer: priced through the first.
    Repeat,
    Post,
}

impl Workload {
    /// Builds the workload of `graph` (canonical ops; layers in `graph.blocks`).
    pub fn build(graph: &Graph, opts: &WorkloadOptions) -> Result<Workload, WorkloadError> {
        let bindings = bind(graph, opts)?;
        let topo = graph.topo_order()?;
        let places = place_nodes(graph, &topo);
        let mut b = Builder::new(graph, &bindings, opts, &places)?;
        for &idx in &topo {
            b.visit(idx)?;
        }
        let output_bytes = graph.outputs.iter().map(|&t| b.rank_bytes(t)).sum();
        let boundary_bytes = b.boundary_bytes(&places);
        let model_cost = autopar_ir::graph_cost(graph, &bindings)?;
        let [pre, layer, post] = b.units;
        Ok(Workload {
            pre,
            layer,
            layers: graph.blocks.len(),
            post,
            boundary_bytes,
            output_bytes,
            compute_dtype: b.compute_dtype.unwrap_or(DType::F32),
            model_flops: (model_cost.forward_flops, model_cost.backward_flops),
            micro_batch: bindings
                .get("batch")
                .copied()
                .unwrap_or(b.fixed_batch.unwrap_or(1)),
            seq: bindings.get("seq").copied(),
            heads: b.heads,
        })
    }

    /// Parameter elements on one rank of the whole model (pre, every
    /// layer, post; tied weights once).
    pub fn param_elements(&self) -> f64 {
        let layer: f64 = self.layer.params.values().map(|p| p.elements).sum();
        let mut ends = self.pre.params.clone();
        ends.extend(self.post.params.clone());
        ends.values().map(|p| p.elements).sum::<f64>() + layer * self.layers as f64
    }
}

/// The graph's default bindings with the micro-batch and sequence applied;
/// a fixed dim must match what is asked.
fn bind(graph: &Graph, opts: &WorkloadOptions) -> Result<Bindings, WorkloadError> {
    let symbols: HashSet<&str> = graph
        .tensors()
        .flat_map(|(_, t)| t.ty.shape.0.iter())
        .filter_map(|d| match d {
            Dim::Sym(s) => Some(s.as_str()),
            Dim::Fixed(_) => None,
        })
        .collect();
    let main_input = graph.inputs.first().map(|&t| &graph.tensor(t).ty.shape.0);
    let fixed_dim = |i: usize| main_input.and_then(|dims| dims.get(i)).and_then(Dim::fixed);
    let mut bindings = graph.bindings.clone();
    let asks = [
        (opts.micro_batch, "batch", "micro-batch", "--micro-batch", 0),
        (opts.seq, "seq", "sequence length", "--seq", 1),
    ];
    for (given, symbol, what, flag, axis) in asks {
        let Some(given) = given else { continue };
        if symbols.contains(symbol) {
            bindings.insert(symbol.into(), given);
        } else if let Some(fixed) = fixed_dim(axis).filter(|&f| f != given) {
            return Err(WorkloadError::FixedDim {
                what,
                symbol,
                flag,
                fixed,
                given,
            });
        }
    }
    Ok(bindings)
}

/// Pre, layer (first block), repeat (other blocks) or post for every node:
/// nodes outside the blocks that depend on a block come after the layers.
fn place_nodes(graph: &Graph, topo: &[NodeIndex]) -> HashMap<NodeIndex, Place> {
    let mut by_name: HashMap<&str, Place> = HashMap::new();
    for (i, block) in graph.blocks.iter().enumerate() {
        let place = if i == 0 { Place::Layer } else { Place::Repeat };
        by_name.extend(block.nodes.iter().map(|n| (n.as_str(), place)));
    }
    let mut places = HashMap::new();
    for &idx in topo {
        let node = graph.node(idx);
        let place = by_name.get(node.name.as_str()).copied().unwrap_or_else(|| {
            let after_layers = node
                .inputs
                .iter()
                .flatten()
                .filter_map(|&t| graph.producer(t))
                .any(|p| places.get(&p) != Some(&Place::Pre));
            if after_layers {
                Place::Post
            } else {
                Place::Pre
            }
        });
        places.insert(idx, place);
    }
    places
}

/// Walks the graph once, tracking layouts and filling the units.
struct Builder<'g> {
    graph: &'g Graph,
    opts: &'g WorkloadOptions,
    places: &'g HashMap<NodeIndex, Place>,
    /// Resolved dims of every tensor.
    dims: Vec<Vec<usize>>,
    layouts: Vec<Layout>,
    /// Tensors whose backward all-reduce (column-parallel input) is counted.
    column_inputs: HashSet<TensorId>,
    /// Storage already counted as saved for backward.
    saved: HashSet<TensorId>,
    units: [Unit; 3],
    compute_dtype: Option<DType>,
    fixed_batch: Option<usize>,
    heads: Vec<(usize, usize)>,
}

impl<'g> Builder<'g> {
    fn new(
        graph: &'g Graph,
        bindings: &Bindings,
        opts: &'g WorkloadOptions,
        places: &'g HashMap<NodeIndex, Place>,
    ) -> Result<Builder<'g>, WorkloadError> {
        let mut dims = Vec::new();
        let mut layouts = Vec::new();
        for (_, t) in graph.tensors() {
            dims.push(
                t.ty.shape
                    .resolve(bindings)
                    .ok_or_else(|| WorkloadError::Unbound {
                        tensor: t.name.clone(),
                        shape: t.ty.shape.to_string(),
                    })?,
            );
            layouts.push(match t.role {
                Role::Parameter | Role::Constant => Layout::Weight,
                Role::Input | Role::Activation => Layout::Replicated,
            });
        }
        let fixed_batch = graph
            .inputs
            .first()
            .and_then(|&t| graph.tensor(t).ty.shape.0.first())
            .and_then(Dim::fixed);
        Ok(Builder {
            graph,
            opts,
            places,
            dims,
            layouts,
            column_inputs: HashSet::new(),
            saved: HashSet::new(),
            units: Default::default(),
            compute_dtype: None,
            fixed_batch,
            heads: Vec::new(),
        })
    }

    fn unit_of(&self, idx: NodeIndex) -> Option<usize> {
        match self.places[&idx] {
            Place::Pre => Some(0),
            Place::Layer => Some(1),
            Place::Repeat => None,
            Place::Post => Some(2),
        }
    }

    fn numel(&self, t: TensorId) -> f64 {
        self.dims[t.index()].iter().map(|&d| d as f64).product()
    }

    fn full_bytes(&self, t: TensorId) -> f64 {
        self.numel(t) * self.graph.tensor(t).ty.dtype.size_bits() as f64 / 8.0
    }

    /// How many ways a tensor with `layout` is divided on one rank.
    fn divisor(&self, layout: Layout) -> f64 {
        let s = self.opts.sharding;
        let tp = if layout.is_sharded() || (s.sp && layout == Layout::Replicated) {
            s.tp
        } else {
            1
        };
        (tp * s.cp) as f64
    }

    /// Bytes of `t` on one rank, as laid out now.
    fn rank_bytes(&self, t: TensorId) -> f64 {
        let layout = self.layouts[t.index()];
        if layout == Layout::Weight {
            return 0.0;
        }
        self.full_bytes(t) / self.divisor(layout)
    }

    fn visit(&mut self, idx: NodeIndex) -> Result<(), WorkloadError> {
        let graph = self.graph;
        let node = graph.node(idx);
        let in_layouts: Vec<Option<Layout>> = node
            .inputs
            .iter()
            .map(|t| t.map(|t| self.layouts[t.index()]))
            .collect();
        let d = decide(&node.op, &in_layouts);
        let unit = self.unit_of(idx);
        let sp = self.opts.sharding.sp;
        for &slot in &d.reduce {
            let Some(t) = node.inputs[slot] else { continue };
            // Attributed to the unit that produced the pending sum.
            let home = graph.producer(t).and_then(|p| self.unit_of(p));
            let bytes = self.full_bytes(t) / self.opts.sharding.cp as f64;
            if let Some(home) = home {
                let (fwd, bwd) = if sp {
                    (Collective::ReduceScatter, Some(Collective::AllGather))
                } else {
                    (Collective::AllReduce, None)
                };
                self.units[home].comms.push(tensor_comm(Some(fwd), bwd, bytes));
            }
            self.layouts[t.index()] = Layout::Replicated;
        }
        for &slot in &d.gather {
            let Some(t) = node.inputs[slot] else { continue };
            if let Some(u) = unit {
                let bytes = self.full_bytes(t) / self.opts.sharding.cp as f64;
                self.units[u]
                    .comms
                    .push(tensor_comm(Some(Collective::AllGather), None, bytes));
            }
            self.layouts[t.index()] = Layout::Replicated;
        }
        for &slot in &d.column_input {
            let Some(t) = node.inputs[slot] else { continue };
            if let Some(u) = unit.filter(|_| self.column_inputs.insert(t)) {
                let bytes = self.full_bytes(t) / self.opts.sharding.cp as f64;
                let (fwd, bwd) = if sp {
                    (Some(Collective::AllGather), Collective::ReduceScatter)
                } else {
                    (None, Collective::AllReduce)
                };
                self.units[u].comms.push(tensor_comm(fwd, Some(bwd), bytes));
            }
        }
        for &t in &node.outputs {
            self.layouts[t.index()] = d.output;
        }
        let Some(u) = unit else { return Ok(()) };
        if d.output == Layout::Weight {
            return Ok(());
        }
        self.price(idx, u, &d)
    }

    /// Kernels, saved activations, parameters and extra collectives of a
    /// node in unit `u`.
    fn price(&mut self, idx: NodeIndex, u: usize, d: &layout::Decision) -> Result<(), WorkloadError> {
        let graph = self.graph;
        let node = graph.node(idx);
        let s = self.opts.sharding;
        let work_div = if d.weight_sharded {
            (s.tp * s.cp) as f64
        } else {
            self.divisor(d.output)
        };
        let head_div = if d.output.is_sharded() { s.tp } else { 1 };
        let resolved = |t: TensorId| TensorType {
            dtype: graph.tensor(t).ty.dtype,
            shape: Shape::fixed(&self.dims[t.index()]),
        };
        let input_types: Vec<Option<TensorType>> = node.inputs.iter().map(|t| t.map(resolved)).collect();
        let output_types: Vec<TensorType> = node.outputs.iter().map(|&t| resolved(t)).collect();
        let dtype = output_types.first().map_or(DType::F32, |t| t.dtype);
        let split = match (d.weight_sharded, d.output) {
            (true, Layout::Partial) => ProductSplit::Rows,
            (true, _) => ProductSplit::Columns,
            (false, _) => ProductSplit::Whole,
        };
        let ctx = kernels::Context {
            op: &node.op,
            name: &node.name,
            input_types: &input_types,
            output_types: &output_types,
            dtype,
            work_div,
            head_div: head_div as f64,
            seq_div: s.cp as f64,
            tp: s.tp as f64,
            split,
            attention: self.opts.attention,
            dropout: self.opts.dropout,
            residual_add: is_residual_add(graph, node),
        };
        if matches!(node.op, Op::MatMul) && is_attention_scores(graph, node) && s.cp > 1 {
            return Err(WorkloadError::ContextNeedsAttention {
                node: node.name.clone(),
            });
        }
        let priced = kernels::price(&ctx);
        if priced.iter().any(|w| matches!(w.kernel, Kernel::Matmul { .. })) && self.compute_dtype.is_none() {
            self.compute_dtype = Some(dtype);
        }
        self.units[u].ops.extend(priced);
        self.save_activations(idx, u, &ctx);
        self.add_params(idx, u, d);
        self.extra_comms(idx, u, d);
        Ok(())
    }

    /// Activations this op keeps for its backward pass.
    fn save_activations(&mut self, idx: NodeIndex, u: usize, ctx: &kernels::Context) {
        let node = self.graph.node(idx);
        let kept = kernels::saved_tensors(&node.op, &node.inputs, &node.outputs, |t| {
            self.layouts[t.index()] != Layout::Weight && self.graph.tensor(t).ty.dtype.is_float()
        });
        for t in kept {
            let root = self.storage_root(t);
            if self.saved.insert(root) {
                self.units[u].saved_bytes += self.rank_bytes(root);
            }
        }
        let (extra, selective) = kernels::saved_extra_bytes(ctx);
        self.units[u].saved_bytes += extra;
        self.units[u].selective_bytes += selective;
    }

    /// Follows views (reshapes, splits) back to the tensor that owns the memory.
    fn storage_root(&self, mut t: TensorId) -> TensorId {
        while let Some(p) = self.graph.producer(t) {
            let node = self.graph.node(p);
            let is_view = matches!(
                node.op,
                Op::Reshape { .. }
                    | Op::Squeeze { .. }
                    | Op::Unsqueeze { .. }
                    | Op::Flatten { .. }
                    | Op::Split { .. }
            );
            match node.inputs.first().copied().flatten() {
                Some(src) if is_view && self.layouts[src.index()] != Layout::Weight => t = src,
                _ => break,
            }
        }
        t
    }

    /// The parameters this op reads (through weight preparation such as a
    /// transposed tied embedding), with their shard on one rank.
    fn add_params(&mut self, idx: NodeIndex, u: usize, d: &layout::Decision) {
        let graph = self.graph;
        let node = graph.node(idx);
        let s = self.opts.sharding;
        let is_experts = matches!(node.op, Op::MoeExperts { .. });
        for (slot, t) in node.inputs.iter().enumerate() {
            let Some(t) = *t else { continue };
            for p in self.parameter_sources(t) {
                let expert = is_experts && slot >= 3;
                let mut div = if d.weight_sharded { s.tp } else { 1 } as f64;
                if expert {
                    div *= s.ep as f64;
                }
                let shard = ParamShard {
                    elements: self.numel(p) / div,
                    dtype: graph.tensor(p).ty.dtype,
                    expert,
                };
                self.units[u].params.entry(p.index()).or_insert(shard);
            }
        }
    }

    /// Parameter tensors `t` is computed from, if it is a weight.
    fn parameter_sources(&self, t: TensorId) -> Vec<TensorId> {
        let mut found = Vec::new();
        let mut stack = vec![t];
        let mut seen = HashSet::new();
        while let Some(t) = stack.pop() {
            if !seen.insert(t) || self.layouts[t.index()] != Layout::Weight {
                continue;
            }
            if self.graph.tensor(t).role == Role::Parameter {
                found.push(t);
            } else if let Some(p) = self.graph.producer(t) {
                stack.extend(self.graph.node(p).inputs.iter().flatten());
            }
        }
        found
    }

    /// Context-parallel key/value exchange and expert-parallel token moves.
    fn extra_comms(&mut self, idx: NodeIndex, u: usize, d: &layout::Decision) {
        let graph = self.graph;
        let node = graph.node(idx);
        let s = self.opts.sharding;
        match node.op {
            Op::Attention { .. } => {
                let (Some(q), Some(k), Some(v)) = (
                    node.inputs.first().copied().flatten(),
                    node.inputs.get(1).copied().flatten(),
                    node.inputs.get(2).copied().flatten(),
                ) else {
                    return;
                };
                let (hq, hk) = (self.dims[q.index()][1], self.dims[k.index()][1]);
                self.heads.push((hq, hk));
                if s.cp > 1 {
                    let heads_div = if d.output.is_sharded() { s.tp } else { 1 } as f64;
                    let bytes = (self.full_bytes(k) + self.full_bytes(v)) / heads_div;
                    self.units[u].comms.push(CommWork {
                        group: Group::Context,
                        forward: Some(Collective::AllGather),
                        backward: Some(Collective::ReduceScatter),
                        bytes,
                        overlaps_attention: true,
                    });
                }
            }
            Op::MoeExperts { .. } if s.ep > 1 => {
                let (Some(x), Some(w)) = (
                    node.inputs.first().copied().flatten(),
                    node.inputs.get(1).copied().flatten(),
                ) else {
                    return;
                };
                let top_k = self.dims[w.index()].last().copied().unwrap_or(1) as f64;
                let per_rank_tokens = self.rank_bytes(x) * top_k;
                for _ in 0..2 {
                    // Dispatch to the experts' ranks, then combine back.
                    self.units[u].comms.push(CommWork {
                        group: Group::Expert,
                        forward: Some(Collective::AllToAll),
                        backward: Some(Collective::AllToAll),
                        bytes: per_rank_tokens,
                        overlaps_attention: false,
                    });
                }
            }
            _ => {}
        }
    }

    /// Bytes on one rank of what the second layer reads from the first.
    fn boundary_bytes(&self, places: &HashMap<NodeIndex, Place>) -> f64 {
        let graph = self.graph;
        let Some(second) = graph.blocks.get(1) else {
            return 0.0;
        };
        let names: HashSet<&str> = second.nodes.iter().map(String::as_str).collect();
        let mut crossing = HashSet::new();
        for idx in graph.node_indices() {
            let node = graph.node(idx);
            if !names.contains(node.name.as_str()) {
                continue;
            }
            for &t in node.inputs.iter().flatten() {
                if graph.producer(t).is_some_and(|p| places[&p] == Place::Layer) {
                    crossing.insert(t);
                }
            }
        }
        let cp = self.opts.sharding.cp as f64;
        crossing.iter().map(|&t| self.full_bytes(t) / cp).sum()
    }
}

fn tensor_comm(forward: Option<Collective>, backward: Option<Collective>, bytes: f64) -> CommWork {
    CommWork {
        group: Group::Tensor,
        forward,
        backward,
        bytes,
        overlaps_attention: false,
    }
}

/// An `Add` of two computed tensors of the output's shape: a residual
/// connection (where training applies dropout to the branch).
fn is_residual_add(graph: &Graph, node: &autopar_ir::Node) -> bool {
    if !matches!(
        node.op,
        Op::Binary {
            func: autopar_ir::BinaryOp::Add
        }
    ) {
        return false;
    }
    let Some(&out) = node.outputs.first() else {
        return false;
    };
    let out_shape = &graph.tensor(out).ty.shape;
    node.inputs.iter().flatten().count() == 2
        && node.inputs.iter().flatten().all(|&t| {
            let tensor = graph.tensor(t);
            tensor.role == Role::Activation && &tensor.ty.shape == out_shape
        })
}

/// A `MatMul` of two computed tensors (attention scores in exported graphs
/// whose attention was not recognised).
fn is_attention_scores(graph: &Graph, node: &autopar_ir::Node) -> bool {
    node.inputs
        .iter()
        .flatten()
        .all(|&t| graph.tensor(t).role == Role::Activation)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(spec: &str, tp: usize, sp: bool, ep: usize) -> Workload {
        let spec: autopar_ir::ModelSpec = spec.parse().unwrap();
        let opts = WorkloadOptions {
            micro_batch: Some(2),
            seq: None,
            sharding: Sharding { tp, sp, cp: 1, ep },
            attention: AttentionKernel::Fused,
            dropout: false,
        };
        Workload::build(&spec.build().unwrap(), &opts).unwrap()
    }

    fn collectives(u: &Unit, group: Group) -> Vec<(Option<Collective>, Option<Collective>)> {
        u.comms
            .iter()
            .filter(|c| c.group == group)
            .map(|c| (c.forward, c.backward))
            .collect()
    }

    const GPT: &str = "gpt:layers=3,hidden=64,heads=4,vocab=100,seq=16,dtype=bf16";
    const LLAMA: &str = "llama:layers=3,hidden=64,ffn=160,heads=4,kv_heads=2,vocab=100,seq=16,dtype=bf16";

    #[test]
    fn a_megatron_layer_all_reduces_twice_forward_and_twice_backward() {
        use Collective::*;
        for spec in [GPT, LLAMA] {
            let w = build(spec, 2, false, 1);
            let layer = collectives(&w.layer, Group::Tensor);
            let forward = layer.iter().filter(|c| c.0 == Some(AllReduce)).count();
            let backward = layer.iter().filter(|c| c.1 == Some(AllReduce)).count();
            assert_eq!((forward, backward, layer.len()), (2, 2, 4), "{spec}: {layer:?}");
            // Every all-reduce moves one [batch, seq, hidden] activation.
            assert!(
                w.layer.comms.iter().all(|c| c.bytes == 2.0 * 16.0 * 64.0 * 2.0),
                "{spec}"
            );
            // The vocabulary-parallel embedding reduces its output once.
            assert_eq!(
                collectives(&w.pre, Group::Tensor),
                vec![(Some(AllReduce), None)],
                "{spec}"
            );
            assert_eq!(w.layers, 3);
            assert_eq!(w.heads, vec![(4, if spec == GPT { 4 } else { 2 })]);
        }
    }

    #[test]
    fn sequence_parallelism_swaps_all_reduces_for_gathers_and_scatters() {
        use Collective::*;
        let w = build(GPT, 2, true, 1);
        let mut layer = collectives(&w.layer, Group::Tensor);
        layer.sort_by_key(|c| format!("{c:?}"));
        assert_eq!(
            layer,
            vec![
                (Some(AllGather), Some(ReduceScatter)),
                (Some(AllGather), Some(ReduceScatter)),
                (Some(ReduceScatter), Some(AllGather)),
                (Some(ReduceScatter), Some(AllGather)),
            ]
        );
    }

    #[test]
    fn tensor_parallelism_divides_weights_and_products() {
        let one = build(LLAMA, 1, false, 1);
        let two = build(LLAMA, 2, false, 1);
        let weights = |w: &Workload| w.layer.params.values().map(|p| p.elements).sum::<f64>();
        // Only the two RMSNorm scales (2 × 64) stay whole.
        assert_eq!(weights(&two), (weights(&one) - 128.0) / 2.0 + 128.0);
        let gemm_flops = |w: &Workload| -> f64 {
            w.layer
                .ops
                .iter()
                .filter(|o| matches!(o.kernel, Kernel::Matmul { .. }))
                .map(|o| o.forward_flops)
                .sum()
        };
        assert_eq!(gemm_flops(&two), gemm_flops(&one) / 2.0);
        assert_eq!(one.param_elements(), {
            let g: autopar_ir::ModelSpec = LLAMA.parse().unwrap();
            g.build().unwrap().float_parameter_elements(&Default::default()) as f64
        });
    }

    #[test]
    fn expert_parallelism_moves_tokens_and_spreads_experts() {
        let spec = "moe:layers=2,hidden=64,ffn=128,heads=4,experts=8,top_k=2,vocab=100,seq=16,dtype=bf16";
        let dense = build(spec, 1, false, 1);
        let spread = build(spec, 1, false, 4);
        assert!(collectives(&dense.layer, Group::Expert).is_empty());
        let a2a = collectives(&spread.layer, Group::Expert);
        assert_eq!(a2a.len(), 2, "dispatch and combine");
        let experts = |w: &Workload| -> f64 {
            w.layer
                .params
                .values()
                .filter(|p| p.expert)
                .map(|p| p.elements)
                .sum()
        };
        assert_eq!(experts(&spread), experts(&dense) / 4.0);
        assert_eq!(experts(&dense), 8.0 * 3.0 * 64.0 * 128.0);
    }

    #[test]
    fn a_fixed_batch_must_match() {
        let mut g = Graph::new("fixed");
        let x = g.add_tensor(
            "x",
            TensorType {
                dtype: DType::F32,
                shape: Shape::fixed(&[4, 8]),
            },
            Role::Input,
            None,
        );
        g.inputs.push(x);
        let opts = |mb| WorkloadOptions {
            micro_batch: Some(mb),
            seq: None,
            sharding: Sharding {
                tp: 1,
                sp: false,
                cp: 1,
                ep: 1,
            },
            attention: AttentionKernel::Fused,
            dropout: false,
        };
        assert!(Workload::build(&g, &opts(4)).is_ok());
        let err = Workload::build(&g, &opts(2)).unwrap_err();
        assert!(
            err.to_string().contains("--micro-batch must be 4, not 2"),
            "{err}"
        );
    }
}
