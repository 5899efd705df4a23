//! What one rank computes for one micro-batch: the model split into the
//! units a pipeline places (the part before the repeated layers, one
//! representative layer, the part after), each op's kernels with their
//! FLOPs and bytes on that rank, the activations it keeps for the backward
//! pass, its parameter shards, and the collectives tensor, context and
//! expert parallelism add (with tensor parallelism, those of the
//! vocabulary-parallel cross-entropy on the split logits too).
//!
//! Tensor-parallel layouts follow [`layout`]; sequence parallelism splits
//! the replicated activations along the sequence; context parallelism splits
//! every activation along the sequence and gathers keys and values for
//! attention; expert parallelism spreads each MoE layer's experts and moves
//! tokens with all-to-all.

mod builder;
pub mod kernels;
pub mod layout;

use crate::comm::Collective;
use autopar_ir::{Bindings, DType, Dim, Graph, Loss, NodeIndex, TensorId};
pub use builder::is_residual_add;
use builder::{Builder, Planned};
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

/// Rows each expert keeps of one rank's `assignments` under capacity
/// factor `cf` (Switch Transformer's, over one rank's tokens as
/// Megatron-Core's drop and pad): `⌈cf · assignments / experts⌉`, at least
/// one. Lowering sizes the experts' blocks by it and the cost model prices them.
pub fn expert_capacity(cf: f64, assignments: usize, experts: usize) -> usize {
    ((cf * assignments as f64 / experts.max(1) as f64).ceil() as usize).max(1)
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
    /// MoE experts keep at most `⌈cf · assignments / experts⌉` of a rank's
    /// token assignments each, in blocks of that many rows (drop and pad);
    /// `None`: no token is dropped.
    pub moe_capacity_factor: Option<f64>,
    /// The loss training appends on the output (the objective's).
    pub loss: Loss,
}

impl Default for WorkloadOptions {
    /// One rank with nothing split, the model's own batch and sequence,
    /// fused attention, no dropout or token dropping, a cross-entropy.
    fn default() -> Self {
        WorkloadOptions {
            micro_batch: None,
            seq: None,
            sharding: Sharding {
                tp: 1,
                sp: false,
                cp: 1,
                ep: 1,
            },
            attention: AttentionKernel::Fused,
            dropout: false,
            moe_capacity_factor: None,
            loss: Loss::CrossEntropy,
        }
    }
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
    /// The backward pass runs the forward collective again rather than
    /// keeping its output (an activation gathered along the sequence for a
    /// product, as lowering does); full recomputation reruns it anyway.
    pub regathered: bool,
}

/// A parameter's share on one rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParamShard {
    pub elements: f64,
    /// The parameter's first dim (whole): PowerSGD views a gradient as
    /// this many rows by the rest.
    pub rows: f64,
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
    /// Bytes of the inputs its backward pass gathers again
    /// ([`CommWork::regathered`]): held while that backward pass runs.
    pub regathered_bytes: f64,
    /// Forward and backward FLOPs of this part of the model, undivided
    /// (weight preparation excluded): what MFU counts.
    pub model_flops: (f64, f64),
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
    /// Bytes on one rank of the graph outputs (logits) as the loss reads
    /// them (gathered whole where a plan's sharding leaves them split along
    /// another dim than the vocabulary), held with their gradient while the
    /// loss is computed.
    pub output_bytes: f64,
    /// The loss's kernels as lowering runs them (also in the unit that
    /// produces the logits), and the logit elements they read on one rank:
    /// what another loss implementation is priced against.
    pub loss: Vec<OpWork>,
    pub loss_elements: f64,
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
    #[error("expert parallelism (ep {ep}) needs a mixture-of-experts model; this one has no experts, so ep must be 1")]
    NoExperts { ep: usize },
    #[error("context parallelism needs attention as canonical Attention ops; node '{node}' computes attention scores with MatMul")]
    ContextNeedsAttention { node: String },
    #[error("plan sharding of node '{node}': {message}")]
    Plan { node: String, message: String },
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
    /// The second layer: walked (its reads reduce the first layer's
    /// outputs) but not priced.
    Second,
    /// A later repeat: neither walked nor priced; its tensors take the
    /// layouts of the second layer's.
    Repeat,
    Post,
}

impl Workload {
    /// Every parameter shard with how many times it repeats (a layer's
    /// once per layer).
    pub fn params_counted(&self) -> impl Iterator<Item = (&ParamShard, usize)> {
        let units = [(&self.pre, 1), (&self.layer, self.layers), (&self.post, 1)];
        units
            .into_iter()
            .flat_map(|(u, times)| u.params.values().map(move |p| (p, times)))
    }
}

impl Workload {
    /// Builds the workload of `graph` (canonical ops; layers in `graph.blocks`).
    pub fn build(graph: &Graph, opts: &WorkloadOptions) -> Result<Workload, WorkloadError> {
        Workload::from_layered(&Layered::new(graph)?, opts)
    }

    /// The workload when the tensor-parallel group runs a plan's per-op
    /// sharding (`planned`: node name → strategy name, as a plan's
    /// `sharding` names them; a node of the first layer stands for its
    /// place in every layer): its collectives are priced from the sharding
    /// rules lowering executes, not from [`layout`]'s propagation.
    pub fn build_planned(
        graph: &Graph,
        opts: &WorkloadOptions,
        planned: &BTreeMap<String, String>,
    ) -> Result<Workload, WorkloadError> {
        Workload::walk(&Layered::new(graph)?, opts, Some(planned))
    }

    /// Builds the workload from a graph already arranged by [`Layered::new`]
    /// (the planner arranges a model once and builds many workloads).
    pub fn from_layered(l: &Layered, opts: &WorkloadOptions) -> Result<Workload, WorkloadError> {
        Workload::walk(l, opts, None)
    }

    fn walk(
        l: &Layered,
        opts: &WorkloadOptions,
        planned: Option<&BTreeMap<String, String>>,
    ) -> Result<Workload, WorkloadError> {
        let graph = l.graph;
        let ep = opts.sharding.ep;
        if ep > 1
            && !graph
                .node_indices()
                .any(|i| matches!(graph.node(i).op, autopar_ir::Op::MoeExperts { .. }))
        {
            return Err(WorkloadError::NoExperts { ep });
        }
        let bindings = bind(l, opts)?;
        let planned = planned
            .map(|names| Planned::new(l, &bindings, opts.sharding.tp, names))
            .transpose()?;
        let mut b = Builder::new(l, &bindings, opts, planned)?;
        for &idx in &l.order {
            b.visit(idx)?;
        }
        b.store_tied_alike();
        b.add_loss_comms();
        let (loss, loss_elements) = b.add_loss_kernels();
        b.add_sequence_parallel_grad_comms();
        let output_bytes = b.loss_outputs().iter().map(|&(t, _)| b.loss_input_bytes(t)).sum();
        let boundary_bytes = b.boundary_bytes();
        let [pre, layer, post] = b.units;
        let layers = graph.blocks.len();
        let flops = |pick: fn(&(f64, f64)) -> f64| {
            pick(&pre.model_flops) + layers as f64 * pick(&layer.model_flops) + pick(&post.model_flops)
        };
        let model_flops = (flops(|f| f.0), flops(|f| f.1));
        Ok(Workload {
            pre,
            layer,
            layers,
            post,
            boundary_bytes,
            output_bytes,
            loss,
            loss_elements,
            compute_dtype: b.compute_dtype.unwrap_or(DType::F32),
            model_flops,
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
fn bind(l: &Layered, opts: &WorkloadOptions) -> Result<Bindings, WorkloadError> {
    let graph = l.graph;
    let symbols = &l.symbols;
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

/// A graph arranged for pricing: which part each node belongs to, the nodes
/// to walk (the part before the layers, the first two layers, the part
/// after), and for nodes of later layers their counterpart in the second.
/// Building it orders the whole graph once; workloads built from it walk
/// only a few layers whatever the depth.
pub struct Layered<'g> {
    pub graph: &'g Graph,
    order: Vec<NodeIndex>,
    places: HashMap<NodeIndex, Place>,
    counterpart: HashMap<NodeIndex, NodeIndex>,
    symbols: HashSet<String>,
    /// Parameters read before and after the layers, trained as two tied
    /// copies ([`autopar_ir::layers::tied_parameters`]).
    tied: HashSet<TensorId>,
}

impl<'g> Layered<'g> {
    /// Arranges `graph`; nodes outside the layers go before them when the
    /// first layer depends on them ([`autopar_ir::layers::outside_layers`],
    /// as pipeline stages place them), else after.
    pub fn new(graph: &'g Graph) -> Result<Layered<'g>, WorkloadError> {
        let topo = graph.topo_order()?;
        let ends = autopar_ir::layers::outside_layers(graph);
        let tied = autopar_ir::layers::tied_parameters(graph, &ends)
            .into_iter()
            .collect();
        let (pre, _) = ends;
        let mut by_name: HashMap<&str, (Place, usize)> = HashMap::new();
        for (i, block) in graph.blocks.iter().enumerate() {
            let place = match i {
                0 => Place::Layer,
                1 => Place::Second,
                _ => Place::Repeat,
            };
            by_name.extend(
                block
                    .nodes
                    .iter()
                    .enumerate()
                    .map(|(k, n)| (n.as_str(), (place, k))),
            );
        }
        let second: HashMap<usize, NodeIndex> = graph
            .blocks
            .get(1)
            .map(|b| {
                let names: HashMap<&str, usize> =
                    b.nodes.iter().enumerate().map(|(k, n)| (n.as_str(), k)).collect();
                topo.iter()
                    .filter_map(|&idx| names.get(graph.node(idx).name.as_str()).map(|&k| (k, idx)))
                    .collect()
            })
            .unwrap_or_default();
        let mut places = HashMap::new();
        let mut counterpart = HashMap::new();
        let mut order = Vec::new();
        for &idx in &topo {
            let node = graph.node(idx);
            let place = match by_name.get(node.name.as_str()) {
                Some(&(place, k)) => {
                    if place == Place::Repeat {
                        if let Some(&twin) = second.get(&k) {
                            counterpart.insert(idx, twin);
                        }
                    }
                    place
                }
                None if pre.contains(&idx) => Place::Pre,
                None => Place::Post,
            };
            places.insert(idx, place);
            if place != Place::Repeat {
                order.push(idx);
            }
        }
        let symbols = graph
            .tensors()
            .flat_map(|(_, t)| t.ty.shape.0.iter())
            .filter_map(|d| match d {
                Dim::Sym(s) => Some(s.clone()),
                Dim::Fixed(_) => None,
            })
            .collect();
        Ok(Layered {
            graph,
            order,
            places,
            counterpart,
            symbols,
            tied,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_ir::{Role, Shape, TensorType};

    fn build(spec: &str, tp: usize, sp: bool, ep: usize) -> Workload {
        let spec: autopar_import::ModelSpec = spec.parse().unwrap();
        let opts = WorkloadOptions {
            micro_batch: Some(2),
            seq: None,
            sharding: Sharding { tp, sp, cp: 1, ep },
            attention: AttentionKernel::Fused,
            dropout: false,
            moe_capacity_factor: None,
            loss: Default::default(),
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
    fn a_tied_embedding_is_stored_as_its_vocabulary_slice() {
        // Megatron's layouts read the table by vocabulary rows before the
        // layers (the vocabulary-parallel embedding) and after them (the
        // column-parallel output layer): both copies hold the rank's rows.
        let table = 100.0 * 64.0;
        let w = build(GPT, 2, false, 1);
        let held = |u: &Unit| u.params.values().map(|p| p.elements).fold(0.0, f64::max);
        assert_eq!((held(&w.pre), held(&w.post)), (table / 2.0, table / 2.0));
        let one = build(GPT, 1, false, 1);
        assert_eq!((held(&one.pre), held(&one.post)), (table, table));
    }

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
    fn the_loss_on_split_logits_moves_one_value_per_token() {
        use Collective::*;
        let w = build(GPT, 2, false, 1);
        // Two rows of 16 tokens, bf16 logits.
        let per_token = 2.0 * 16.0 * 2.0;
        let loss: Vec<_> = w
            .post
            .comms
            .iter()
            .filter(|c| c.bytes <= 2.0 * per_token)
            .map(|c| (c.forward, c.backward, c.bytes))
            .collect();
        assert_eq!(
            loss,
            vec![
                (Some(AllGather), None, 2.0 * per_token),
                (Some(AllReduce), None, per_token),
                (Some(AllReduce), None, per_token),
                (None, Some(AllReduce), per_token),
            ]
        );
        assert!(build(GPT, 1, false, 1)
            .post
            .comms
            .iter()
            .all(|c| c.bytes > 2.0 * per_token));
    }

    /// The loss's kernels read the rank's share of the logits: two rows of
    /// 16 tokens over 100 words, half the words a rank at tp 2; Megatron-LM's
    /// f32 cross-entropy moves 38 bytes a bf16 logit forward, 14 back.
    #[test]
    fn the_loss_reads_the_ranks_logits() {
        let whole = build(GPT, 1, false, 1);
        assert_eq!(whole.loss_elements, 2.0 * 16.0 * 100.0);
        let names: Vec<&str> = whole.loss.iter().map(|k| k.node.as_str()).collect();
        assert_eq!(names[..2], ["loss/log_softmax", "loss/picked"]);
        assert!(whole.loss.iter().all(|k| whole.post.ops.contains(k)));
        assert_eq!(build(GPT, 2, false, 1).loss_elements, 2.0 * 16.0 * 50.0);
        let megatron = kernels::megatron_cross_entropy(100.0, DType::Bf16);
        assert_eq!(
            (megatron.forward_bytes, megatron.backward_bytes),
            (3800.0, 1400.0)
        );
        let f32_logits = kernels::megatron_cross_entropy(100.0, DType::F32);
        assert_eq!(
            (f32_logits.forward_bytes, f32_logits.backward_bytes),
            (3200.0, 800.0)
        );
    }

    #[test]
    fn sequence_parallelism_swaps_all_reduces_for_gathers_and_scatters() {
        use Collective::*;
        let w = build(GPT, 2, true, 1);
        let mut layer = collectives(&w.layer, Group::Tensor);
        layer.sort_by_key(|c| format!("{c:?}"));
        // The weights read on sequence slices (two norms' scales and
        // shifts, two row-parallel biases) all-reduce their gradients at once.
        let (weights, activations) = layer.split_at(1);
        assert_eq!(weights, [(None, Some(AllReduce))]);
        let grads: Vec<f64> = w
            .layer
            .comms
            .iter()
            .filter(|c| c.forward.is_none())
            .map(|c| c.bytes)
            .collect();
        assert_eq!(grads, [6.0 * 64.0 * 2.0]);
        assert_eq!(
            activations,
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
            let g: autopar_import::ModelSpec = LLAMA.parse().unwrap();
            g.build().unwrap().float_parameter_elements(&Default::default()) as f64
        });
    }

    /// As lowering runs it: the counts and then each routed row exchanged
    /// all-to-all (dispatch and combine, each with its backward), every
    /// rank's experts on the rows routed to them: one rank's expert work.
    #[test]
    fn expert_parallelism_dispatches_tokens_and_spreads_experts() {
        use Collective::*;
        let spec = "moe:layers=2,hidden=64,ffn=128,heads=4,experts=8,top_k=2,vocab=100,seq=16,dtype=bf16";
        let dense = build(spec, 1, false, 1);
        let spread = build(spec, 1, false, 4);
        assert!(collectives(&dense.layer, Group::Expert).is_empty());
        assert_eq!(
            collectives(&spread.layer, Group::Expert),
            vec![
                (Some(AllToAll), None),
                (Some(AllToAll), Some(AllToAll)),
                (Some(AllToAll), Some(AllToAll)),
            ]
        );
        let expert_flops = |w: &Workload| -> f64 {
            w.layer
                .ops
                .iter()
                .filter(|o| o.node.ends_with("experts"))
                .map(|o| o.forward_flops)
                .sum()
        };
        assert!(expert_flops(&dense) > 0.0);
        assert_eq!(expert_flops(&spread), expert_flops(&dense));
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
            ..WorkloadOptions::default()
        };
        assert!(Workload::build(&g, &opts(4)).is_ok());
        let err = Workload::build(&g, &opts(2)).unwrap_err();
        assert!(
            err.to_string().contains("--micro-batch must be 4, not 2"),
            "{err}"
        );
    }
}
