//! The training graph of one micro-batch: the model's forward pass, the
//! objective's loss on its output ([`crate::objective`]), and the backward
//! pass (autodiff). The loss is added before tensor parallelism splits the
//! graph, so a vocabulary-split head feeds a vocabulary-parallel
//! cross-entropy instead of gathering its logits. Every rank of every plan
//! runs pieces of this one graph, which is why a parallel run can be
//! compared with a single-device run node for node.

use super::expert_parallel::shard_experts;
use super::objective::{attach, Feed, Objective, Task};
use super::tensor_parallel::{bind, shard, shard_context, shard_planned, TpError, WeightSlice};
use super::Strategy;
use autopar_ir::autodiff::{differentiate, AutodiffError};
use autopar_ir::{Graph, Role, TensorId};
use autopar_planner::spec::OpSharding;
use std::collections::{BTreeMap, HashMap};

/// The training graph with what lowering needs to know about it.
#[derive(Debug, Clone)]
pub struct TrainingGraph {
    /// Forward, loss and backward nodes; dims bound to the micro-batch.
    pub graph: Graph,
    /// Names of the forward nodes (the model's and the loss's).
    pub forward: Vec<String>,
    /// Backward node → the forward node it belongs to.
    pub origins: HashMap<String, String>,
    /// `(parameter, gradient tensor)` for every parameter the loss reaches.
    pub gradients: Vec<(String, String)>,
    /// The scalar loss tensor.
    pub loss: String,
    /// Each data input and how it is fed.
    pub feeds: Vec<(String, Feed)>,
    /// What one row of data holds for the objective the loss trains.
    pub task: Task,
    /// Rows per micro-batch and tokens per row.
    pub micro_batch: usize,
    pub seq: usize,
    /// Tensor-parallel degree the graph was split for (1: whole).
    pub tp: usize,
    /// Context-parallel degree the sequences were split for (1: whole).
    pub cp: usize,
    /// Expert-parallel degree the experts were split for (1: whole).
    pub ep: usize,
    /// Expert weights stored as expert-parallel slices.
    pub expert_slices: BTreeMap<String, WeightSlice>,
    /// `(parameter, copy)`: weights read both before the layers and after
    /// them (tied embeddings); see [`tie_copies`].
    pub tied: Vec<(String, String)>,
    /// Weights stored as tensor-parallel slices (their data in the graph is
    /// the whole weight; each rank keeps its slice).
    pub slices: BTreeMap<String, WeightSlice>,
}

/// Why a model cannot be trained as given.
#[derive(Debug, thiserror::Error)]
pub enum TrainingError {
    #[error("autopar cannot tell what to train this model for (inputs: {inputs}; outputs: {outputs}); choose with --objective lm|seq2seq|mlm|classify|regress")]
    NoObjective { inputs: String, outputs: String },
    #[error(
        "--objective {objective} needs an integer token input [batch, seq]; the model's inputs: {inputs}"
    )]
    NoTokens { objective: Objective, inputs: String },
    #[error("--objective seq2seq needs a decoder input (an integer [batch, seq] input named like 'decoder_input_ids'); the model's inputs: {inputs}")]
    NoDecoder { inputs: String },
    #[error(
        "input '{input}' ({ty}): autopar does not know how to feed it under --objective {objective}; {hint}"
    )]
    UnknownInput {
        input: String,
        ty: String,
        objective: Objective,
        hint: String,
    },
    #[error(
        "--objective {objective} trains one float output of shape {want}; the model's outputs: {outputs}"
    )]
    Output {
        objective: Objective,
        want: &'static str,
        outputs: String,
    },
    #[error("'{tensor}' {shape}: autopar cannot size its symbolic dims (it binds batch and seq)")]
    Unbound { tensor: String, shape: String },
    #[error("context parallelism is lowered for --objective lm and mlm only, not {0}")]
    ContextParallel(Objective),
    #[error("the model's {what} is fixed at {fixed}, but the plan needs {want}")]
    FixedDim {
        what: &'static str,
        fixed: usize,
        want: usize,
    },
    #[error("building the loss: {0}")]
    Graph(#[from] autopar_ir::GraphError),
    #[error(transparent)]
    Autodiff(#[from] AutodiffError),
    #[error("tensor parallelism: {0}")]
    TensorParallel(#[from] TpError),
    #[error("tensor parallelism stores the tied weights '{original}' and '{copy}' differently ({detail})")]
    TiedSlices {
        original: String,
        copy: String,
        detail: String,
    },
}

/// The training graph for `objective` one rank of strategy `s` runs: split
/// for its tensor-parallel group when `s.tp > 1`, with the loss normalised
/// by the global batch's terms.
pub fn for_strategy(
    model: &Graph,
    s: &Strategy,
    seq: usize,
    objective: Objective,
) -> Result<TrainingGraph, TrainingError> {
    // Without pipeline or tensor parallelism a tied weight's two readers
    // run on one rank and read it whole: one parameter, whose gradient
    // autodiff sums over both, is reduced and stepped once.
    let copies = s.pp > 1 || s.tp > 1;
    build(
        model,
        s.micro_batch,
        seq,
        s.global_batch(),
        objective,
        Split {
            tp: s.tp,
            sp: s.sp,
            cp: s.cp,
            ep: s.ep,
            capacity_factor: s.capacity_factor,
        },
        &s.sharding,
        copies,
    )
}

/// Builds the training graph of `model` for `objective` on micro-batches
/// of `micro_batch` rows (of `seq` tokens, for token objectives). The loss
/// of a micro-batch is its summed loss terms divided by those of
/// `global_rows` rows, so the losses of all micro-batches of all ranks add
/// up to the mean over the global batch.
pub fn training_graph(
    model: &Graph,
    micro_batch: usize,
    seq: usize,
    global_rows: usize,
    objective: Objective,
) -> Result<TrainingGraph, TrainingError> {
    build(
        model,
        micro_batch,
        seq,
        global_rows,
        objective,
        Split {
            tp: 1,
            sp: false,
            cp: 1,
            ep: 1,
            capacity_factor: None,
        },
        &[],
        true,
    )
}

/// How [`build`] splits the model: the degrees, and the experts' capacity.
struct Split {
    tp: usize,
    sp: bool,
    cp: usize,
    ep: usize,
    capacity_factor: Option<f64>,
}

#[allow(clippy::too_many_arguments)]
fn build(
    model: &Graph,
    micro_batch: usize,
    seq: usize,
    global_rows: usize,
    objective: Objective,
    split: Split,
    sharding: &[OpSharding],
    copies: bool,
) -> Result<TrainingGraph, TrainingError> {
    let Split {
        tp,
        sp,
        cp,
        ep,
        capacity_factor,
    } = split;
    let mut g = model.clone();
    g.bindings.insert("batch".into(), micro_batch);
    g.bindings.insert("seq".into(), seq);
    let tied = match copies {
        true => tie_copies(&mut g),
        false => Vec::new(),
    };
    if cp > 1 && !matches!(objective, Objective::Lm | Objective::Mlm) {
        return Err(TrainingError::ContextParallel(objective));
    }
    let head = attach(&mut g, objective, micro_batch, seq, global_rows)?;
    let mut feeds = head.feeds;
    let loss_name = g.tensor(head.loss).name.clone();
    g.outputs = vec![head.loss];
    // The loss is split with the model: a column-parallel head's logits
    // stay split along the vocabulary and the cross-entropy runs on them.
    let mut slices = BTreeMap::new();
    if tp > 1 {
        let split = match sharding.is_empty() {
            true => shard(&g, tp, sp)?,
            false => {
                // A tied weight's copies are stored as the slice their
                // readers share; where the plan reads them differently,
                // both are stored whole and each read slices its part.
                let first = shard_planned(&g, tp, sp, sharding, &[])?;
                let whole: Vec<String> = tied
                    .iter()
                    .filter(|(a, b)| first.slices.get(a) != first.slices.get(b))
                    .flat_map(|(a, b)| [a.clone(), b.clone()])
                    .collect();
                match whole.is_empty() {
                    true => first,
                    false => shard_planned(&g, tp, sp, sharding, &whole)?,
                }
            }
        };
        g = split.graph;
        slices = split.slices;
        check_tied_slices(&tied, &slices)?;
    }
    if cp > 1 {
        let per_token: Vec<String> = feeds
            .iter()
            .filter(|(_, f)| f.per_token())
            .map(|(n, _)| n.clone())
            .collect();
        g = shard_context(&g, cp, &per_token)?;
    }
    // After context parallelism: the experts' dispatch runs on the rank's
    // own tokens (its routing is token by token).
    let mut expert_slices = BTreeMap::new();
    if ep > 1 || capacity_factor.is_some() {
        bind(&mut g)?;
        expert_slices = shard_experts(&mut g, ep, capacity_factor)?;
    }
    let forward: Vec<String> = g.node_indices().map(|i| g.node(i).name.clone()).collect();
    let d = differentiate(&g)?;
    for (_, cotangent) in &d.cotangents {
        feeds.push((cotangent.clone(), Feed::Seed));
    }
    let gradients = d
        .gradients
        .iter()
        .map(|(p, grad)| (p.clone(), grad.clone()))
        .collect();
    Ok(TrainingGraph {
        loss: loss_name,
        graph: d.graph,
        forward,
        origins: d.origins,
        gradients,
        feeds,
        task: head.task,
        micro_batch,
        seq,
        tp,
        cp,
        ep,
        expert_slices,
        slices,
        tied,
    })
}

/// Both copies of a tied weight must be stored alike, or the summed
/// gradient of their slices would add different rows.
fn check_tied_slices(
    tied: &[(String, String)],
    slices: &BTreeMap<String, WeightSlice>,
) -> Result<(), TrainingError> {
    for (original, copy) in tied {
        let (a, b) = (slices.get(original), slices.get(copy));
        if a != b {
            return Err(TrainingError::TiedSlices {
                original: original.clone(),
                copy: copy.clone(),
                detail: format!("{a:?} vs {b:?}"),
            });
        }
    }
    Ok(())
}

/// Parameters read both before the first layer and after the last (tied
/// input and output embeddings) get an identical copy for the uses after the
/// layers. Each end of a pipeline then accumulates its own gradient over the
/// micro-batches, the two are summed once per step
/// ([`super::Instr::SumTiedGrads`]) and both copies step identically —
/// instead of one end sending its gradient to the other every micro-batch.
fn tie_copies(g: &mut Graph) -> Vec<(String, String)> {
    let ends = autopar_ir::layers::outside_layers(g);
    let (_, post) = &ends;
    let mut tied = Vec::new();
    for p in autopar_ir::layers::tied_parameters(g, &ends) {
        let late: Vec<_> = g.consumers(p).into_iter().filter(|u| post.contains(u)).collect();
        let t = g.tensor(p).clone();
        let name = format!("{}.tied", t.name);
        let copy = g.add_tensor(name.clone(), t.ty, Role::Parameter, t.data);
        for u in late {
            let slots: Vec<usize> = (0..g.node(u).inputs.len())
                .filter(|&i| g.node(u).inputs[i] == Some(p))
                .collect();
            for slot in slots {
                g.set_input(u, slot, Some(copy));
            }
        }
        tied.push((t.name, name));
    }
    tied
}

pub(crate) fn tensor_id(g: &Graph, name: &str) -> Option<TensorId> {
    g.tensors().find(|(_, t)| t.name == name).map(|(id, _)| id)
}
