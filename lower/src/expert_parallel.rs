//! Expert parallelism as a graph rewrite: each rank of an expert-parallel
//! group (runs of `ep` data-parallel ranks) stores `1/ep` of every MoE
//! layer's experts. At each `MoeExperts` node the group's tokens (with their
//! routing weights and expert indices) are gathered, each rank applies its
//! own experts to the tokens routed to them, and the partial outputs are
//! reduce-scattered back to the ranks that own the tokens; autodiff derives
//! the backward exchange from the conjugate comm ops.
//!
//! The exchange is dense — every token travels to every rank of the group,
//! an all-gather and a reduce-scatter — where Megatron-style dispatch sends
//! each token only to the ranks of its chosen experts with an all-to-all of
//! data-dependent size. Results are identical; bytes are higher by the
//! routing sparsity.

use super::tensor_parallel::{TpError, WeightSlice};
use autopar_ir::{
    BinaryOp, CommGroup, CommKind, DType, Graph, NodeIndex, Op, Role, Shape, TensorId, TensorType, Value,
};
use std::collections::BTreeMap;

/// Splits every `MoeExperts` node of `g` over an `ep`-way group, in place;
/// returns the expert weights now stored as slices.
pub fn shard_experts(g: &mut Graph, ep: usize) -> Result<BTreeMap<String, WeightSlice>, TpError> {
    let nodes: Vec<NodeIndex> = g
        .node_indices()
        .filter(|&i| matches!(g.node(i).op, Op::MoeExperts { .. }))
        .collect();
    if nodes.is_empty() {
        return Err(TpError::Node {
            node: g.name.clone(),
            message: format!(
                "expert parallelism (ep = {ep}) needs fused MoeExperts ops, and this graph has none (its experts were not fused by the rewrites)"
            ),
        });
    }
    let mut slices = BTreeMap::new();
    for idx in nodes {
        split_node(g, idx, ep, &mut slices)?;
    }
    g.validate()?;
    Ok(slices)
}

struct Adder<'g> {
    g: &'g mut Graph,
    prefix: String,
    block: Option<usize>,
    count: usize,
}

impl Adder<'_> {
    fn add(&mut self, op: Op, inputs: &[TensorId], ty: TensorType) -> Result<TensorId, TpError> {
        self.count += 1;
        let name = format!("{}/ep{}", self.prefix, self.count);
        let out = self.g.add_tensor(name.clone(), ty, Role::Activation, None);
        self.g.add_node(
            name.clone(),
            op,
            inputs.iter().copied().map(Some).collect(),
            vec![out],
        )?;
        if let Some(b) = self.block {
            self.g.blocks[b].nodes.push(name);
        }
        Ok(out)
    }

    fn comm(&mut self, x: TensorId, kind: CommKind, parts: usize) -> Result<TensorId, TpError> {
        let mut ty = self.g.tensor(x).ty.clone();
        let d = ty.shape.0[0].fixed().unwrap_or(0);
        let d = match kind {
            CommKind::AllGather | CommKind::GatherForCompute => d * parts,
            _ => d / parts,
        };
        ty.shape.0[0] = autopar_ir::Dim::Fixed(d);
        let op = Op::Comm {
            kind,
            axis: 0,
            parts,
            group: CommGroup::Expert,
        };
        self.add(op, &[x], ty)
    }

    fn binary(
        &mut self,
        func: BinaryOp,
        a: TensorId,
        b: TensorId,
        dtype: DType,
    ) -> Result<TensorId, TpError> {
        let shape = self.g.tensor(a).ty.shape.clone();
        self.add(Op::Binary { func }, &[a, b], TensorType { dtype, shape })
    }

    fn constant(&mut self, v: Value) -> TensorId {
        self.count += 1;
        self.g
            .add_constant(format!("{}/epc{}", self.prefix, self.count), v)
    }
}

/// Stores the expert weights of `MoeExperts` node `idx` as slices of
/// `local` experts: each weight input is a parameter, or is computed from
/// one by weight-only ops that keep the expert dim first (slices of other
/// dims, transposes that leave dim 0 — an exported fused gate/up matrix),
/// which are re-typed. Every use of those parameters must lead here.
fn slice_expert_weights(
    g: &mut Graph,
    idx: NodeIndex,
    local: usize,
    slices: &mut BTreeMap<String, WeightSlice>,
) -> Result<(), String> {
    let mut chain_nodes = vec![idx];
    let mut params = Vec::new();
    for &w in g.node(idx).inputs[3..].iter().flatten() {
        let (param, chain) = expert_param(g, w)?;
        chain_nodes.extend(chain);
        params.push(param);
    }
    for &p in &params {
        if let Some(c) = g.consumers(p).into_iter().find(|c| !chain_nodes.contains(c)) {
            let t = &g.tensor(p).name;
            return Err(format!(
                "expert weight '{t}' is also used by '{}'",
                g.node(c).name
            ));
        }
    }
    params.sort();
    params.dedup();
    for p in params {
        let mut dims: Vec<usize> = g
            .tensor(p)
            .ty
            .shape
            .0
            .iter()
            .map(|d| d.fixed().unwrap_or(0))
            .collect();
        dims[0] = local;
        slices.insert(g.tensor(p).name.clone(), WeightSlice { axis: 0, blocks: 1 });
        g.tensor_mut(p).ty.shape = Shape::fixed(&dims);
    }
    // Re-type the weight-only nodes, in order, for the sliced parameters.
    let order = g.topo_order().map_err(|e| e.to_string())?;
    for n in order.into_iter().filter(|n| *n != idx && chain_nodes.contains(n)) {
        let types = g.infer_node(n).map_err(|e| e.to_string())?;
        for (o, ty) in g.node(n).outputs.clone().into_iter().zip(types) {
            g.tensor_mut(o).ty = ty;
        }
    }
    Ok(())
}

/// The parameter an expert weight comes from, and the weight-only nodes in
/// between (each keeps the expert dim first).
fn expert_param(g: &Graph, w: TensorId) -> Result<(TensorId, Vec<NodeIndex>), String> {
    let mut t = w;
    let mut chain = Vec::new();
    loop {
        let tensor = g.tensor(t);
        if tensor.role == Role::Parameter {
            return Ok((t, chain));
        }
        let keeps_experts = |p: NodeIndex| match &g.node(p).op {
            Op::Transpose { perm: Some(perm) } => perm.first() == Some(&0),
            // Slice(x, starts, ends, axes, steps): axes given and never 0.
            Op::Slice => g.node(p).inputs.get(3).copied().flatten().is_some_and(|axes| {
                let rank = g.tensor(t).ty.shape.rank() as i64;
                g.tensor(axes)
                    .data
                    .as_deref()
                    .and_then(|v| v.as_i64())
                    .is_some_and(|a| a.iter().all(|&x| x != 0 && x != -rank))
            }),
            _ => false,
        };
        match g.producer(t) {
            Some(p) if keeps_experts(p) => {
                chain.push(p);
                t = g.node(p).inputs[0].ok_or("a weight-only node without input")?;
            }
            _ => {
                return Err(format!(
                    "expert weight '{}' is not a parameter (or a slice or transpose of one)",
                    tensor.name
                ))
            }
        }
    }
}

fn split_node(
    g: &mut Graph,
    idx: NodeIndex,
    ep: usize,
    slices: &mut BTreeMap<String, WeightSlice>,
) -> Result<(), TpError> {
    let node = g.node(idx).clone();
    let fail = |message: String| TpError::Node {
        node: node.name.clone(),
        message,
    };
    let [Some(x), Some(weights), Some(indices), Some(w_in), Some(_), ..] = node.inputs[..] else {
        return Err(fail(
            "expected (x, weights, indices, w_in, w_out, w_gate?)".into(),
        ));
    };
    let experts = g.tensor(w_in).ty.shape.0[0].fixed().unwrap_or(0);
    if experts % ep != 0 {
        return Err(fail(format!("{experts} experts do not split {ep}-way")));
    }
    let local = experts / ep;
    slice_expert_weights(g, idx, local, slices).map_err(fail)?;
    let out = node.outputs[0];
    let block = g.blocks.iter().position(|b| b.nodes.contains(&node.name));
    g.remove_node(idx);
    let mut a = Adder {
        g,
        prefix: node.name.clone(),
        block,
        count: 0,
    };
    // Everyone's tokens, routing weights and chosen experts.
    let xs = a.comm(x, CommKind::GatherForCompute, ep)?;
    let ws = a.comm(weights, CommKind::GatherForCompute, ep)?;
    let is = a.comm(indices, CommKind::AllGather, ep)?;
    // This rank's experts are [first, first + local): `first` is its slice of 0..experts.
    let all_ids = a.constant(Value::i64(vec![experts], (0..experts as i64).collect()).expect("ids"));
    let ids_ty = TensorType {
        dtype: DType::I64,
        shape: Shape::fixed(&[local]),
    };
    let mine = a.add(
        Op::Comm {
            kind: CommKind::Slice,
            axis: 0,
            parts: ep,
            group: CommGroup::Expert,
        },
        &[all_ids],
        ids_ty,
    )?;
    let zero = a.constant(Value::i64(vec![1], vec![0]).expect("index"));
    let first_ty = TensorType {
        dtype: DType::I64,
        shape: Shape::fixed(&[1]),
    };
    let first = a.add(Op::Gather { axis: 0 }, &[mine, zero], first_ty)?;
    let shifted = a.binary(BinaryOp::Sub, is, first, DType::I64)?;
    let lo = a.constant(Value::scalar_i64(0));
    let hi = a.constant(Value::scalar_i64(local as i64));
    let above = a.binary(BinaryOp::GreaterOrEqual, shifted, lo, DType::Bool)?;
    let below = a.binary(BinaryOp::Less, shifted, hi, DType::Bool)?;
    let ours = a.binary(BinaryOp::And, above, below, DType::Bool)?;
    let wdtype = a.g.tensor(ws).ty.dtype;
    let wzero = a.constant(Value::zeros(wdtype, vec![]));
    let wshape = a.g.tensor(ws).ty.clone();
    let local_weights = a.add(Op::Where, &[ours, ws, wzero], wshape)?;
    let ishape = a.g.tensor(shifted).ty.clone();
    let local_indices = a.add(Op::Where, &[ours, shifted, lo], ishape)?;
    // This rank's experts on everyone's tokens: a share of each token's output.
    let mut inputs = vec![Some(xs), Some(local_weights), Some(local_indices)];
    inputs.extend(node.inputs[3..].iter().copied());
    let share_ty = a.g.tensor(xs).ty.clone();
    let share =
        a.g.add_tensor(format!("{}.share", node.name), share_ty, Role::Activation, None);
    a.g.add_node(node.name.clone(), node.op.clone(), inputs, vec![share])?;
    let summed = Op::Comm {
        kind: CommKind::ReduceScatter,
        axis: 0,
        parts: ep,
        group: CommGroup::Expert,
    };
    // The combined output takes the original's place (and name) in the graph.
    let out_name = a.g.tensor(out).name.clone();
    a.g.tensor_mut(out).name = format!("{out_name}.replaced");
    let out_ty = a.g.tensor(out).ty.clone();
    let combined = a.g.add_tensor(out_name, out_ty, Role::Activation, None);
    let name = format!("{}/combine", node.name);
    a.g.add_node(name.clone(), summed, vec![Some(share)], vec![combined])?;
    a.g.replace_uses(out, combined);
    if let Some(b) = block {
        a.g.blocks[b].nodes.push(name);
    }
    Ok(())
}
