//! Expert parallelism as a graph rewrite, as Megatron-Core and DeepSpeed-MoE
//! dispatch tokens: each rank of an expert-parallel group (runs of `ep`
//! data-parallel ranks) stores `1/ep` of every MoE layer's experts. At each
//! `MoeExperts` node a rank sorts its tokens' assignments by expert
//! (`MoeSort`), tells every rank how many it sends to each of its experts
//! (an all-to-all of the counts), sends each token row only to the rank of
//! its chosen expert (`Dispatch`), runs its own experts on the rows it
//! received (`MoeSlots` numbers them; the rest of each padded block is −1),
//! sends the results back (`Combine`), and puts them back in token order,
//! weighted and summed over the token's experts. Nothing is dropped, so the
//! losses are one rank's. Autodiff derives the backward exchange from the
//! conjugate comm ops (the counts swapped).
//!
//! Shapes are static, so a rank's received rows live in blocks padded to
//! what one rank could send (`n·k` rows each); only the routed rows
//! travel, and the cost model counts only those (`MoeExperts::sources`).
//!
//! With a capacity factor (`parallel.moe_capacity_factor`) each expert keeps
//! at most `C` of a rank's assignments in a block of `C` rows
//! ([`autopar_cost_models::workload::expert_capacity`]), the blocks travel
//! whole in an all-to-all of equal parts (Megatron-Core's drop and pad), and
//! a dropped assignment weighs nothing: the token keeps its residual. The
//! same rewrite runs without expert parallelism, so every strategy drops
//! the same assignments.

use super::tensor_parallel::{TpError, WeightSlice};
use autopar_ir::{
    BinaryOp, CommGroup, CommKind, DType, Graph, InferInput, NodeIndex, Op, ReduceKind, Role, Shape,
    TensorId, TensorType, Value,
};
use std::collections::BTreeMap;

/// Splits every `MoeExperts` node of `g` over an `ep`-way group, in place;
/// returns the expert weights now stored as slices.
pub fn shard_experts(
    g: &mut Graph,
    ep: usize,
    capacity_factor: Option<f64>,
) -> Result<BTreeMap<String, WeightSlice>, TpError> {
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
        split_node(g, idx, ep, capacity_factor, &mut slices)?;
    }
    g.validate()?;
    Ok(slices)
}

struct Adder<'g> {
    g: &'g mut Graph,
    prefix: String,
    block: Option<usize>,
    count: usize,
    /// The expert-parallel degree.
    parts: usize,
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

    /// A node with `outputs` outputs typed by the op's own inference.
    fn add_many(&mut self, op: Op, inputs: &[TensorId], outputs: usize) -> Result<Vec<TensorId>, TpError> {
        self.count += 1;
        let name = format!("{}/ep{}", self.prefix, self.count);
        let types = {
            let tys: Vec<Option<InferInput>> = inputs
                .iter()
                .map(|&t| {
                    let tensor = self.g.tensor(t);
                    Some(InferInput {
                        ty: &tensor.ty,
                        value: tensor.data.as_deref(),
                    })
                })
                .collect();
            op.infer(&tys).map_err(|e| TpError::Node {
                node: name.clone(),
                message: e.to_string(),
            })?
        };
        let outs: Vec<TensorId> = (0..outputs)
            .map(|i| {
                let ty = types.get(i).cloned().unwrap_or_else(|| types[0].clone());
                self.g
                    .add_tensor(format!("{name}.{i}"), ty, Role::Activation, None)
            })
            .collect();
        self.g.add_node(
            name.clone(),
            op,
            inputs.iter().copied().map(Some).collect(),
            outs.clone(),
        )?;
        if let Some(b) = self.block {
            self.g.blocks[b].nodes.push(name);
        }
        Ok(outs)
    }

    fn dims(&self, t: TensorId) -> Vec<usize> {
        self.g
            .tensor(t)
            .ty
            .shape
            .0
            .iter()
            .map(|d| d.fixed().unwrap_or(0))
            .collect()
    }

    fn reshape(&mut self, x: TensorId, dims: &[usize]) -> Result<TensorId, TpError> {
        let target = self
            .constant(Value::i64(vec![dims.len()], dims.iter().map(|&d| d as i64).collect()).expect("shape"));
        let ty = TensorType {
            dtype: self.g.tensor(x).ty.dtype,
            shape: Shape::fixed(dims),
        };
        self.add(Op::Reshape { allowzero: false }, &[x, target], ty)
    }

    /// Rows `index` of `x` (dim 0).
    fn gather(&mut self, x: TensorId, index: TensorId) -> Result<TensorId, TpError> {
        let mut dims = self.dims(x);
        dims[0] = self.dims(index)[0];
        let ty = TensorType {
            dtype: self.g.tensor(x).ty.dtype,
            shape: Shape::fixed(&dims),
        };
        self.add(Op::Gather { axis: 0 }, &[x, index], ty)
    }

    /// A counted exchange (`Dispatch` or `Combine`) of `x`'s rows, `rows` out.
    fn counted(
        &mut self,
        kind: CommKind,
        x: TensorId,
        sent: TensorId,
        received: TensorId,
        rows: usize,
    ) -> Result<TensorId, TpError> {
        let mut dims = self.dims(x);
        dims[0] = rows;
        let ty = TensorType {
            dtype: self.g.tensor(x).ty.dtype,
            shape: Shape::fixed(&dims),
        };
        let op = Op::Comm {
            kind,
            axis: 0,
            parts: self.parts,
            group: CommGroup::Expert,
        };
        self.add(op, &[x, sent, received], ty)
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

/// The experts' rows of one `MoeExperts` node as a rank lays them out: what
/// the node runs on, each row's local expert (−1: none) and the route back.
struct Rows {
    /// The rows the rank's experts run on, and how many they hold.
    x: TensorId,
    count: usize,
    /// Each row's local expert.
    slots: TensorId,
    /// How often a row in the padded blocks is routed (`MoeExperts::sources`).
    sources: usize,
}

/// How the experts' results go back to the tokens' ranks.
enum Route {
    /// Only the routed rows, as counted going out.
    Counted { sent: TensorId, received: TensorId },
    /// Every expert's block whole (drop and pad).
    Blocks,
}

fn split_node(
    g: &mut Graph,
    idx: NodeIndex,
    ep: usize,
    capacity_factor: Option<f64>,
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
    let Op::MoeExperts { activation, .. } = node.op else {
        return Err(fail("not an experts node".into()));
    };
    let experts = g.tensor(w_in).ty.shape.0[0].fixed().unwrap_or(0);
    if experts % ep != 0 {
        return Err(fail(format!("{experts} experts do not split {ep}-way")));
    }
    let local = experts / ep;
    if ep > 1 {
        slice_expert_weights(g, idx, local, slices).map_err(fail)?;
    }
    let out = node.outputs[0];
    let block = g.blocks.iter().position(|b| b.nodes.contains(&node.name));
    g.remove_node(idx);
    let mut a = Adder {
        g,
        prefix: node.name.clone(),
        block,
        count: 0,
        parts: ep,
    };
    let x_dims = a.dims(x);
    let h = *x_dims.last().unwrap_or(&1);
    let k = *a.dims(indices).last().unwrap_or(&1);
    let n = x_dims.iter().product::<usize>() / h.max(1);
    let assignments = n * k;
    let tokens = a.reshape(x, &[n, h])?;
    let capacity =
        capacity_factor.map(|cf| autopar_cost_models::workload::expert_capacity(cf, assignments, experts));
    let sorted = a.add_many(Op::MoeSort { experts, capacity }, &[indices], 3)?;
    let (order, position) = (sorted[0], sorted[1]);
    // Each token row, once per chosen expert, sorted by expert.
    let packed = a.gather(tokens, order)?;
    let exchange = |kind| Op::Comm {
        kind,
        axis: 0,
        parts: ep,
        group: CommGroup::Expert,
    };
    let mut weights = weights;
    let wdtype = a.g.tensor(weights).ty.dtype;
    let (rows, route) = match capacity {
        // Dropless: the counts exchanged, then only routed rows travel.
        None => {
            let sent = a.reshape(sorted[2], &[ep, local])?;
            let received = a.add(exchange(CommKind::AllToAll), &[sent], a.g.tensor(sent).ty.clone())?;
            let dispatched = a.counted(CommKind::Dispatch, packed, sent, received, assignments * ep)?;
            let slots = a.add_many(Op::MoeSlots { rows: assignments }, &[received], 1)?[0];
            let rows = Rows {
                x: dispatched,
                count: ep * assignments,
                slots,
                sources: ep,
            };
            (rows, Route::Counted { sent, received })
        }
        // Drop and pad: every expert's block of `c` rows travels whole (an
        // all-to-all of equal blocks), dropped assignments weigh nothing.
        Some(c) => {
            let count = experts * c;
            let dispatched = match ep > 1 {
                true => a.add(
                    exchange(CommKind::AllToAll),
                    &[packed],
                    a.g.tensor(packed).ty.clone(),
                )?,
                false => packed,
            };
            let ids = (0..count).map(|row| ((row / c) % local) as i64).collect();
            let slots = a.constant(Value::i64(vec![count], ids).expect("slots"));
            let zero = a.constant(Value::scalar_i64(0));
            let kept = a.binary(BinaryOp::GreaterOrEqual, position, zero, DType::Bool)?;
            let kept = a.add(
                Op::cast(wdtype),
                &[kept],
                TensorType {
                    dtype: wdtype,
                    shape: Shape::fixed(&[assignments]),
                },
            )?;
            let kept = a.reshape(kept, &a.dims(weights))?;
            weights = a.binary(BinaryOp::Mul, weights, kept, wdtype)?;
            let rows = Rows {
                x: dispatched,
                count,
                slots,
                sources: 1,
            };
            (rows, Route::Blocks)
        }
    };
    // This rank's experts on its rows; padding is routed nowhere.
    let slots = a.reshape(rows.slots, &[rows.count, 1])?;
    let ones = a.constant(Value::ones(wdtype, vec![rows.count, 1]));
    let mut inputs = vec![Some(rows.x), Some(ones), Some(slots)];
    inputs.extend(node.inputs[3..].iter().copied());
    let share_ty = a.g.tensor(rows.x).ty.clone();
    let share =
        a.g.add_tensor(format!("{}.share", node.name), share_ty, Role::Activation, None);
    let experts_op = Op::MoeExperts {
        activation,
        sources: rows.sources,
    };
    a.g.add_node(node.name.clone(), experts_op, inputs, vec![share])?;
    // The results back to the tokens' ranks, in assignment order (a dropped
    // assignment reads row 0 and weighs nothing), weighted by the router
    // and summed over each token's experts.
    let returned = match route {
        Route::Counted { sent, received } => {
            a.counted(CommKind::Combine, share, received, sent, assignments)?
        }
        Route::Blocks if ep > 1 => {
            let ty = a.g.tensor(share).ty.clone();
            a.add(exchange(CommKind::AllToAll), &[share], ty)?
        }
        Route::Blocks => share,
    };
    let zero = a.constant(Value::scalar_i64(0));
    let position = match capacity {
        Some(_) => a.binary(BinaryOp::Max, position, zero, DType::I64)?,
        None => position,
    };
    let ordered = a.gather(returned, position)?;
    let mut lead = x_dims[..x_dims.len() - 1].to_vec();
    lead.extend([k, h]);
    let per_expert = a.reshape(ordered, &lead)?;
    let mut wshape = a.dims(weights);
    wshape.push(1);
    let wcol = a.reshape(weights, &wshape)?;
    let weighted = a.binary(BinaryOp::Mul, per_expert, wcol, wdtype)?;
    let sum = Op::Reduce {
        kind: ReduceKind::Sum,
        axes: Some(vec![-2]),
        keepdims: false,
        noop_with_empty_axes: false,
    };
    // The combined output takes the original's place (and name) in the graph.
    let out_name = a.g.tensor(out).name.clone();
    a.g.tensor_mut(out).name = format!("{out_name}.replaced");
    let out_ty = a.g.tensor(out).ty.clone();
    let combined = a.g.add_tensor(out_name, out_ty, Role::Activation, None);
    let name = format!("{}/combine", node.name);
    a.g.add_node(name.clone(), sum, vec![Some(weighted)], vec![combined])?;
    a.g.replace_uses(out, combined);
    if let Some(b) = block {
        a.g.blocks[b].nodes.push(name);
    }
    Ok(())
}
