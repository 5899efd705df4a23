//! The training graph of one micro-batch: the model's forward pass, a token
//! cross-entropy loss on its logits, and the backward pass (autodiff). The
//! loss is added before tensor parallelism splits the graph, so a
//! vocabulary-split head feeds a vocabulary-parallel cross-entropy instead
//! of gathering its logits. Every
//! rank of every plan runs pieces of this one graph, which is why a parallel
//! run can be compared with a single-device run node for node.

use super::expert_parallel::shard_experts;
use super::tensor_parallel::{bind, shard, shard_context, shard_planned, TpError, WeightSlice};
use super::Strategy;
use autopar_ir::autodiff::{differentiate, AutodiffError};
use autopar_ir::{BinaryOp, DType, Dim, Graph, Op, ReduceKind, Role, Shape, TensorId, TensorType, Value};
use autopar_planner::spec::OpSharding;
use std::collections::{BTreeMap, HashMap};

/// What a data input of the training graph is fed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Feed {
    /// Token ids of the micro-batch's rows.
    Tokens,
    /// The next token of every position (the loss's targets).
    Targets,
    /// All ones (attention masks: training rows are never padded).
    Ones,
    /// All zeros (token-type ids).
    Zeros,
    /// `0..seq` on every row.
    Positions,
    /// The loss's cotangent: one.
    Seed,
}

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
    #[error("the model has no integer token input [batch, seq] to feed")]
    NoTokens,
    #[error("input '{0}': autopar does not know how to feed it in training (known: token ids, masks, position and token-type ids)")]
    UnknownInput(String),
    #[error(
        "the model must have exactly one float output of shape [batch, seq, vocab] (logits); it has {0}"
    )]
    Logits(String),
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

/// The training graph one rank of strategy `s` runs: split for its
/// tensor-parallel group when `s.tp > 1`, with the loss normalised by the
/// global batch's tokens.
pub fn for_strategy(model: &Graph, s: &Strategy, seq: usize) -> Result<TrainingGraph, TrainingError> {
    // Without pipeline or tensor parallelism a tied weight's two readers
    // run on one rank and read it whole: one parameter, whose gradient
    // autodiff sums over both, is reduced and stepped once.
    let copies = s.pp > 1 || s.tp > 1;
    build(
        model,
        s.micro_batch,
        seq,
        s.global_batch() * seq,
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

/// Builds the training graph of `model` for micro-batches of `micro_batch`
/// rows of `seq` tokens. The loss of a micro-batch is its summed token
/// cross-entropy divided by `global_tokens`, so the losses of all
/// micro-batches of all ranks add up to the mean over the global batch.
pub fn training_graph(
    model: &Graph,
    micro_batch: usize,
    seq: usize,
    global_tokens: usize,
) -> Result<TrainingGraph, TrainingError> {
    build(
        model,
        micro_batch,
        seq,
        global_tokens,
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

fn build(
    model: &Graph,
    micro_batch: usize,
    seq: usize,
    global_tokens: usize,
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
    let mut feeds = classify_inputs(&g)?;
    let tokens = feeds
        .iter()
        .find(|(_, f)| *f == Feed::Tokens)
        .map(|(n, _)| n.clone())
        .ok_or(TrainingError::NoTokens)?;
    let tokens_id = tensor_id(&g, &tokens).ok_or(TrainingError::NoTokens)?;
    check_dims(&g, tokens_id, micro_batch, seq)?;
    let logits = logits_of(&g)?;
    let token_ty = g.tensor(tokens_id).ty.clone();
    let targets = g.add_tensor("targets", token_ty, Role::Input, None);
    g.inputs.push(targets);
    feeds.push(("targets".into(), Feed::Targets));
    let loss = add_loss(&mut g, logits, targets, global_tokens)?;
    let loss_name = g.tensor(loss).name.clone();
    g.outputs = vec![loss];
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
            .filter(|(_, f)| matches!(f, Feed::Tokens | Feed::Targets | Feed::Positions | Feed::Zeros))
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

fn tensor_id(g: &Graph, name: &str) -> Option<TensorId> {
    g.tensors().find(|(_, t)| t.name == name).map(|(id, _)| id)
}

/// How each of the model's inputs is fed, by name and type.
fn classify_inputs(g: &Graph) -> Result<Vec<(String, Feed)>, TrainingError> {
    let mut feeds = Vec::new();
    let mut have_tokens = false;
    for &t in &g.inputs {
        let tensor = g.tensor(t);
        let name = tensor.name.to_ascii_lowercase();
        let integer = !tensor.ty.dtype.is_float();
        let feed = if name.contains("mask") {
            Feed::Ones
        } else if name.contains("position") {
            Feed::Positions
        } else if name.contains("type") {
            Feed::Zeros
        } else if integer && tensor.ty.shape.rank() == 2 && !have_tokens {
            have_tokens = true;
            Feed::Tokens
        } else {
            return Err(TrainingError::UnknownInput(tensor.name.clone()));
        };
        feeds.push((tensor.name.clone(), feed));
    }
    Ok(feeds)
}

/// Fixed batch or sequence dims must equal what the plan runs.
fn check_dims(g: &Graph, tokens: TensorId, micro_batch: usize, seq: usize) -> Result<(), TrainingError> {
    let dims = &g.tensor(tokens).ty.shape.0;
    for (dim, what, want) in [
        (&dims[0], "batch", micro_batch),
        (&dims[1], "sequence length", seq),
    ] {
        if let Dim::Fixed(fixed) = dim {
            if *fixed != want {
                return Err(TrainingError::FixedDim {
                    what,
                    fixed: *fixed,
                    want,
                });
            }
        }
    }
    Ok(())
}

fn logits_of(g: &Graph) -> Result<TensorId, TrainingError> {
    let floats: Vec<TensorId> = g
        .outputs
        .iter()
        .copied()
        .filter(|&t| g.tensor(t).ty.dtype.is_float())
        .collect();
    match floats.as_slice() {
        [one] if g.tensor(*one).ty.shape.rank() == 3 => Ok(*one),
        _ => Err(TrainingError::Logits(
            floats
                .iter()
                .map(|&t| format!("'{}' {}", g.tensor(t).name, g.tensor(t).ty.shape))
                .collect::<Vec<_>>()
                .join(", "),
        )),
    }
}

/// `loss = −Σ log_softmax(logits)[target] / global_tokens`.
fn add_loss(
    g: &mut Graph,
    logits: TensorId,
    targets: TensorId,
    global_tokens: usize,
) -> Result<TensorId, TrainingError> {
    let lt = g.tensor(logits).ty.clone();
    let dtype = lt.dtype;
    let dims: Vec<Dim> = lt.shape.0.clone();
    let node = |g: &mut Graph, name: &str, op: Op, inputs: Vec<TensorId>, ty: TensorType| {
        let out = g.add_tensor(format!("loss/{name}"), ty, Role::Activation, None);
        g.add_node(
            format!("loss/{name}"),
            op,
            inputs.into_iter().map(Some).collect(),
            vec![out],
        )
        .map(|_| out)
    };
    let log_probs = node(
        g,
        "log_softmax",
        Op::LogSoftmax { axis: -1 },
        vec![logits],
        lt.clone(),
    )?;
    let index_shape = Shape(vec![dims[0].clone(), dims[1].clone(), Dim::Fixed(1)]);
    let shape_const = g.add_constant(
        "loss/index_shape",
        Value::i64(vec![3], vec![0, 0, 1]).expect("3 ints"),
    );
    let index = node(
        g,
        "targets",
        Op::Reshape { allowzero: false },
        vec![targets, shape_const],
        TensorType {
            dtype: DType::I64,
            shape: index_shape.clone(),
        },
    )?;
    let picked = node(
        g,
        "picked",
        Op::GatherElements { axis: -1 },
        vec![log_probs, index],
        TensorType {
            dtype,
            shape: index_shape,
        },
    )?;
    let scalar = TensorType {
        dtype,
        shape: Shape(vec![]),
    };
    let total = node(
        g,
        "sum",
        Op::Reduce {
            kind: ReduceKind::Sum,
            axes: None,
            keepdims: false,
            noop_with_empty_axes: false,
        },
        vec![picked],
        scalar.clone(),
    )?;
    let denominator = g.add_constant(
        "loss/tokens",
        Value::f32(vec![], vec![-(global_tokens as f32)]).expect("scalar"),
    );
    let denominator = if dtype == DType::F32 {
        denominator
    } else {
        node(
            g,
            "tokens_cast",
            Op::cast(dtype),
            vec![denominator],
            scalar.clone(),
        )?
    };
    let loss = node(
        g,
        "mean",
        Op::Binary { func: BinaryOp::Div },
        vec![total, denominator],
        scalar,
    )?;
    Ok(loss)
}
