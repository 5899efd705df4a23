//! From a graph and its node set to the integer program: one choice per node
//! (its strategies, priced by compute and parameter bytes), and for each
//! tensor the resharding between its producer and consumers. A tensor with
//! one use is one pair; one with several uses gets a forward fan-out choice
//! (the layout it is materialised in once for all readers) and a backward
//! one (the layout its gradient contributions are summed in), so three
//! column-parallel readers of one activation share one all-reduce.

use super::ilp::{Choice, Model, Pair};
use super::reshard::Pricer;
use super::{ShardingError, ShardingProblem};
use autopar_cost_models::memory::optimizer_bytes_per_param;
use autopar_ir::op::sharding::{self as rules, output_grad, Layout, Strategy};
use autopar_ir::{layers, Bindings, Graph, NodeIndex, Role, Shape, TensorId, TensorType};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// The program and what its node choices mean.
pub struct Built {
    pub model: Model,
    /// Strategies per node, in the problem's order; choice `i` is node `i`.
    pub strategies: Vec<Vec<Strategy>>,
    /// Compute seconds per node and strategy (also inside the choice costs).
    pub compute: Vec<Vec<f64>>,
}

/// Where a tensor read by the node set comes from.
#[derive(Clone, Copy)]
enum Source {
    /// Output `slot` of the node of choice `choice`.
    Node { choice: usize, slot: usize },
    /// An op outside the set: arrives replicated, its gradient goes back replicated.
    Outside,
}

/// Who else needs a tensor the node set produces.
#[derive(Clone, Copy, PartialEq)]
enum Exit {
    /// An op outside the set: needs it replicated and returns a replicated gradient.
    Outside,
    /// A graph output: any layout but a pending sum.
    Output,
}

/// A cost matrix between two choices (`None`: a fixed side outside the set).
type Link = (Option<usize>, Option<usize>, Vec<Vec<f64>>);

/// A tensor's traffic being priced: its full bytes and whether it carries a gradient.
struct Flow {
    bytes: f64,
    grad: bool,
}

struct Builder<'p> {
    graph: &'p Graph,
    bindings: Bindings,
    pricer: Pricer<'p>,
    tp: usize,
    /// Per tensor: carries a gradient (a float computed from parameters).
    requires_grad: Vec<bool>,
    /// Per tensor: computed (partly) from graph inputs, so not a prepared weight.
    dynamic: Vec<bool>,
    /// Activations cross the set's edge split along the sequence.
    sequence_parallel: bool,
    /// Context-parallel degree: the share of the tokens a rank holds is `1/cp`.
    cp: f64,
    model: Model,
    strategies: Vec<Vec<Strategy>>,
    /// Parameters read before the layers and after them, trained as two
    /// tied copies ([`layers::tied_parameters`]).
    tied: HashSet<TensorId>,
}

/// Builds the program for `p` with `pins` (node name → strategy name) applied.
pub fn build(p: &ShardingProblem, pins: &BTreeMap<String, String>) -> Result<Built, ShardingError> {
    if p.tp == 0 {
        return Err(ShardingError::NoRanks);
    }
    if p.tp > p.cluster.gpus() {
        return Err(ShardingError::TooFewGpus {
            tp: p.tp,
            gpus: p.cluster.gpus(),
        });
    }
    let graph = p.graph;
    let present: HashSet<NodeIndex> = graph.node_indices().collect();
    let mut index = HashMap::new();
    for (i, &idx) in p.nodes.iter().enumerate() {
        if !present.contains(&idx) {
            return Err(ShardingError::MissingNode { index: idx.index() });
        }
        if index.insert(idx, i).is_some() {
            return Err(ShardingError::DuplicateNode {
                node: graph.node(idx).name.clone(),
            });
        }
    }
    check_pins(graph, p.nodes, pins)?;
    let topo = graph.topo_order()?;
    let mut bindings = graph.bindings.clone();
    bindings.extend(p.bindings.iter().map(|(k, v)| (k.clone(), *v)));
    let mut b = Builder {
        graph,
        bindings,
        pricer: Pricer::new(p.cluster, p.calibration, p.tp).map_err(ShardingError::Pricing)?,
        tp: p.tp,
        requires_grad: layers::flow_flags(
            graph,
            &topo,
            |t| t.role == Role::Parameter && t.ty.dtype.is_float(),
            true,
        ),
        dynamic: layers::flow_flags(graph, &topo, |t| t.role == Role::Input, false),
        sequence_parallel: p.sequence_parallel,
        cp: p.context_parallel.max(1) as f64,
        model: Model::default(),
        strategies: Vec::new(),
        tied: layers::tied_parameters(graph, &layers::outside_layers(graph))
            .into_iter()
            .collect(),
    };
    let mut compute = Vec::new();
    let mut owned = HashSet::new();
    for &idx in p.nodes {
        compute.push(b.add_node(idx, pins, &mut owned)?);
    }
    b.add_tensors(p.nodes, &index)?;
    Ok(Built {
        model: b.model,
        strategies: b.strategies,
        compute,
    })
}

fn check_pins(
    graph: &Graph,
    nodes: &[NodeIndex],
    pins: &BTreeMap<String, String>,
) -> Result<(), ShardingError> {
    let names: HashSet<&str> = nodes.iter().map(|&n| graph.node(n).name.as_str()).collect();
    match pins.iter().find(|(node, _)| !names.contains(node.as_str())) {
        Some((node, strategy)) => Err(ShardingError::Pin {
            node: node.clone(),
            strategy: strategy.clone(),
            reason: "not among the nodes to shard".into(),
        }),
        None => Ok(()),
    }
}

/// Bytes per parameter held on a rank: weight, gradient and Adam state.
fn state_bytes_per_param(t: &TensorType) -> f64 {
    2.0 * t.dtype.size_bits() as f64 / 8.0 + optimizer_bytes_per_param(t.dtype)
}

impl Builder<'_> {
    /// Resolved dims of `t`, read by `node`.
    fn dims(&self, node: NodeIndex, t: TensorId) -> Result<Vec<usize>, ShardingError> {
        Ok(rules::resolved_dims(self.graph, &self.bindings, node, t)?)
    }

    /// `t`'s traffic on one rank: a tensor computed from the inputs holds
    /// the rank's share of the tokens, a weight is whole.
    fn flow(&self, t: TensorId, dims: &[usize]) -> Flow {
        let tensor = self.graph.tensor(t);
        let numel: f64 = dims.iter().map(|&d| d as f64).product();
        let share = if self.dynamic[t.index()] { self.cp } else { 1.0 };
        Flow {
            bytes: numel * tensor.ty.dtype.size_bits() as f64 / 8.0 / share,
            grad: self.requires_grad[t.index()],
        }
    }

    /// Adds node `idx`'s choice; returns the compute seconds of its strategies.
    fn add_node(
        &mut self,
        idx: NodeIndex,
        pins: &BTreeMap<String, String>,
        owned: &mut HashSet<TensorId>,
    ) -> Result<Vec<f64>, ShardingError> {
        let graph = self.graph;
        let node = graph.node(idx);
        let view = rules::node_view(graph, &self.bindings, idx, self.tp)?;
        let mut strategies = rules::strategies(&node.op, &view);
        if let Some(pin) = pins.get(&node.name) {
            let names: Vec<&str> = strategies.iter().map(|s| s.name.as_str()).collect();
            let Some(k) = names.iter().position(|n| n == pin) else {
                return Err(ShardingError::Pin {
                    node: node.name.clone(),
                    strategy: pin.clone(),
                    reason: format!("it has {}", names.join(", ")),
                });
            };
            strategies = vec![strategies.swap_remove(k)];
        }
        let typed = |t: TensorId, dims: &[usize]| TensorType {
            dtype: graph.tensor(t).ty.dtype,
            shape: Shape::fixed(dims),
        };
        let in_types: Vec<Option<TensorType>> = node
            .inputs
            .iter()
            .zip(&view.inputs)
            .map(|(t, d)| t.zip(d.as_deref()).map(|(t, d)| typed(t, d)))
            .collect();
        let out_types: Vec<TensorType> = node
            .outputs
            .iter()
            .zip(&view.outputs)
            .map(|(&t, d)| typed(t, d))
            .collect();
        let backward = node
            .inputs
            .iter()
            .flatten()
            .any(|t| self.requires_grad[t.index()]);
        // Preparing weights (a transposed tied embedding) happens once, not per micro-batch.
        let prepares_weights = !node.inputs.iter().flatten().any(|t| self.dynamic[t.index()]);
        let mut by_divisor = BTreeMap::new();
        let mut compute = Vec::new();
        for s in &strategies {
            let time = *by_divisor
                .entry(s.divisor)
                .or_insert_with(|| match prepares_weights {
                    true => 0.0,
                    false => {
                        self.pricer
                            .compute(&node.op, &in_types, &out_types, s.divisor, backward)
                            / self.cp
                    }
                });
            if !time.is_finite() {
                return Err(ShardingError::Pricing(format!(
                    "node '{}': kernel time {time} (check the device peaks and calibration)",
                    node.name
                )));
            }
            compute.push(time);
        }
        // Each parameter is stored once, as its first reader in the set reads it.
        let mut mem = vec![0.0; strategies.len()];
        for (slot, (t, ty)) in node.inputs.iter().zip(&in_types).enumerate() {
            let (Some(t), Some(ty)) = (t, ty) else { continue };
            let tensor = graph.tensor(*t);
            if tensor.role != Role::Parameter || !ty.dtype.is_float() || !owned.insert(*t) {
                continue;
            }
            let full = ty.shape.numel(&Bindings::new()).unwrap_or(0) as f64 * state_bytes_per_param(ty);
            for (m, s) in mem.iter_mut().zip(&strategies) {
                let sharded = matches!(s.inputs.get(slot), Some(Some(Layout::Shard(_))));
                *m += if sharded { full / self.tp as f64 } else { full };
            }
        }
        self.model.choices.push(Choice {
            cost: compute.clone(),
            mem,
        });
        self.strategies.push(strategies);
        Ok(compute)
    }

    /// Prices every tensor the node set reads or writes.
    fn add_tensors(
        &mut self,
        nodes: &[NodeIndex],
        index: &HashMap<NodeIndex, usize>,
    ) -> Result<(), ShardingError> {
        let graph = self.graph;
        let mut uses: BTreeMap<TensorId, Vec<(usize, usize)>> = BTreeMap::new();
        let mut made: BTreeMap<TensorId, (NodeIndex, usize, usize)> = BTreeMap::new();
        for (i, &idx) in nodes.iter().enumerate() {
            let node = graph.node(idx);
            for (slot, t) in node.inputs.iter().enumerate() {
                if let Some(t) = t {
                    uses.entry(*t).or_default().push((i, slot));
                }
            }
            for (slot, &t) in node.outputs.iter().enumerate() {
                made.insert(t, (idx, i, slot));
            }
        }
        let tensors: BTreeSet<TensorId> = uses.keys().chain(made.keys()).copied().collect();
        for t in tensors {
            let reads = uses.get(&t).map(Vec::as_slice).unwrap_or_default();
            let (source, exit, at) = match made.get(&t) {
                Some(&(idx, choice, slot)) => {
                    let outside = graph.consumers(t).iter().any(|c| !index.contains_key(c));
                    let exit = if outside {
                        Some(Exit::Outside)
                    } else {
                        graph.outputs.contains(&t).then_some(Exit::Output)
                    };
                    (Source::Node { choice, slot }, exit, idx)
                }
                None => match (graph.producer(t), reads.first()) {
                    (Some(_), Some(&(choice, _))) if self.dynamic[t.index()] => {
                        (Source::Outside, None, nodes[choice])
                    }
                    // Weights (and weights prepared outside) are stored as
                    // each reader reads them; only their gradients move.
                    (_, Some(&(choice, _))) => {
                        let dims = self.dims(nodes[choice], t)?;
                        let flow = self.flow(t, &dims);
                        self.reduce_weight_grads(reads, &flow)?;
                        if self.tied.contains(&t) {
                            self.tie_reads(reads, &flow)?;
                        }
                        continue;
                    }
                    (_, None) => continue,
                },
            };
            let dims = self.dims(at, t)?;
            self.add_tensor(source, reads, exit, &dims, t)?;
        }
        Ok(())
    }

    /// A tied weight's two copies are stored as the slice both readers
    /// read, or whole when they read it differently; then each read of a
    /// slice gathers its gradient to the whole table (as lowering and the
    /// cost model do): the pair pays those gathers.
    fn tie_reads(&mut self, reads: &[(usize, usize)], flow: &Flow) -> Result<(), ShardingError> {
        let [(a, sa), (b, sb)] = reads[..] else {
            return Ok(());
        };
        let gather = |l: Layout| match l {
            Layout::Shard(_) => self.backward(l, Layout::Replicate, flow),
            _ => Ok(0.0),
        };
        let mut cost = vec![vec![0.0; self.strategies[b].len()]; self.strategies[a].len()];
        for (k, x) in self.strategies[a].iter().enumerate() {
            for (l, y) in self.strategies[b].iter().enumerate() {
                let (x, y) = (x.reads(sa).0, y.reads(sb).0);
                if x != y {
                    cost[k][l] = gather(x)? + gather(y)?;
                }
            }
        }
        self.link(Some(a), Some(b), cost);
        Ok(())
    }

    /// A weight read replicated by divided work (a data split) has partial
    /// gradients on the ranks: their all-reduce is charged to the reader.
    fn reduce_weight_grads(&mut self, reads: &[(usize, usize)], flow: &Flow) -> Result<(), ShardingError> {
        for &(choice, slot) in reads {
            for k in 0..self.strategies[choice].len() {
                let (layout, grad) = self.strategies[choice][k].reads(slot);
                self.model.choices[choice].cost[k] += self.backward(grad, layout, flow)?;
            }
        }
        Ok(())
    }

    /// The layout tensor `t` (of `dims`) crosses the set's edge in (the
    /// rule lowering and the cost model cross layer boundaries by,
    /// [`layers::crosses_sequence_split`]).
    fn boundary(&self, t: TensorId, dims: &[usize]) -> Layout {
        let stream = self.requires_grad[t.index()] && self.dynamic[t.index()];
        match layers::crosses_sequence_split(stream, dims, self.tp, self.sequence_parallel) {
            true => Layout::Shard(1),
            false => Layout::Replicate,
        }
    }

    /// Layouts a tensor of `dims` may take on its own (fan-out choices).
    fn layouts(&self, t: TensorId, dims: &[usize]) -> Vec<Layout> {
        let mut all = vec![Layout::Replicate];
        if self.tp > 1 {
            all.extend(
                (0..dims.len())
                    .filter(|&d| dims[d] > 0 && dims[d] % self.tp == 0)
                    .map(Layout::Shard),
            );
            if self.graph.tensor(t).ty.dtype.is_float() {
                all.push(Layout::Partial);
            }
        }
        all
    }

    fn add_tensor(
        &mut self,
        source: Source,
        reads: &[(usize, usize)],
        exit: Option<Exit>,
        dims: &[usize],
        t: TensorId,
    ) -> Result<(), ShardingError> {
        let flow = self.flow(t, dims);
        let edge = self.boundary(t, dims);
        let from: Vec<Layout> = match source {
            Source::Node { choice, slot } => self.strategies[choice]
                .iter()
                .map(|s| s.outputs.get(slot).copied().unwrap_or(Layout::Replicate))
                .collect(),
            Source::Outside => vec![edge],
        };
        let uses: Vec<(usize, Vec<Layout>, Vec<Layout>)> = reads
            .iter()
            .map(|&(choice, slot)| {
                let (fwd, bwd) = self.strategies[choice].iter().map(|s| s.reads(slot)).unzip();
                (choice, fwd, bwd)
            })
            .collect();
        let source_choice = match source {
            Source::Node { choice, .. } => Some(choice),
            Source::Outside => None,
        };
        if uses.len() + usize::from(exit.is_some()) < 2 {
            // One reader: a single pair (or a linear cost at the boundary).
            let (target, to, grad_back): (Option<usize>, Vec<Layout>, Vec<Layout>) =
                match (uses.first(), exit) {
                    (Some((c, fwd, bwd)), _) => (Some(*c), fwd.clone(), bwd.clone()),
                    (None, Some(Exit::Outside)) => (None, vec![edge], vec![edge]),
                    (None, Some(Exit::Output)) => (None, vec![Layout::Replicate], vec![]),
                    (None, None) => return Ok(()),
                };
            let mut cost = vec![vec![0.0; to.len()]; from.len()];
            for (k, &a) in from.iter().enumerate() {
                for (l, &b) in to.iter().enumerate() {
                    let fwd = self.forward(a, b, &flow, exit == Some(Exit::Output) && target.is_none())?;
                    let bwd = match grad_back.get(l) {
                        Some(&g) => self.backward(g, output_grad(a), &flow)?,
                        None => 0.0,
                    };
                    cost[k][l] = fwd + bwd;
                }
            }
            self.link(source_choice, target, cost);
            return Ok(());
        }
        let options = self.layouts(t, dims);
        let fan = self.fan(options.len());
        let sum = flow.grad.then(|| self.fan(options.len()));
        let links = self.fan_links(
            &flow,
            source_choice,
            &from,
            &uses,
            (exit, edge),
            &options,
            (fan, sum),
        )?;
        for (a, b, cost) in links {
            self.link(a, b, cost);
        }
        Ok(())
    }

    /// The pairs of a tensor read several times: producer → forward fan →
    /// readers (and the boundary), and readers (and the boundary) →
    /// gradient-sum fan → producer.
    #[allow(clippy::too_many_arguments)]
    fn fan_links(
        &self,
        flow: &Flow,
        source: Option<usize>,
        from: &[Layout],
        uses: &[(usize, Vec<Layout>, Vec<Layout>)],
        (exit, edge): (Option<Exit>, Layout),
        options: &[Layout],
        (fan, sum): (usize, Option<usize>),
    ) -> Result<Vec<Link>, ShardingError> {
        let matrix =
            |rows: &[Layout], cols: &[Layout], f: &dyn Fn(Layout, Layout) -> Result<f64, ShardingError>| {
                rows.iter()
                    .map(|&r| cols.iter().map(|&c| f(r, c)).collect::<Result<Vec<_>, _>>())
                    .collect::<Result<Vec<_>, _>>()
            };
        let fwd = |a: Layout, b: Layout| self.forward(a, b, flow, false);
        let mut links = vec![(source, Some(fan), matrix(from, options, &fwd)?)];
        for (choice, to, _) in uses {
            links.push((Some(fan), Some(*choice), matrix(options, to, &fwd)?));
        }
        if let Some(exit) = exit {
            let out = |a: Layout, b: Layout| self.forward(a, b, flow, exit == Exit::Output);
            let to = match exit {
                Exit::Outside => edge,
                Exit::Output => Layout::Replicate,
            };
            links.push((Some(fan), None, matrix(options, &[to], &out)?));
        }
        let Some(sum) = sum else { return Ok(links) };
        let bwd = |a: Layout, b: Layout| self.backward(a, b, flow);
        for (choice, _, grads) in uses {
            links.push((Some(*choice), Some(sum), matrix(grads, options, &bwd)?));
        }
        if exit == Some(Exit::Outside) {
            links.push((None, Some(sum), matrix(&[edge], options, &bwd)?));
        }
        let needs: Vec<Layout> = from.iter().map(|&l| output_grad(l)).collect();
        links.push((Some(sum), source, matrix(options, &needs, &bwd)?));
        Ok(links)
    }

    /// A new choice among `n` layouts of a tensor, free in itself.
    fn fan(&mut self, n: usize) -> usize {
        self.model.choices.push(Choice {
            cost: vec![0.0; n],
            mem: vec![0.0; n],
        });
        self.model.choices.len() - 1
    }

    /// Adds `cost[k][l]` between choices `a` and `b`; a side outside the set
    /// (`None`) has a single fixed option, so the cost is linear.
    fn link(&mut self, a: Option<usize>, b: Option<usize>, cost: Vec<Vec<f64>>) {
        match (a, b) {
            (Some(a), Some(b)) => self.model.pairs.push(Pair { a, b, cost }),
            (Some(a), None) => {
                for (c, row) in self.model.choices[a].cost.iter_mut().zip(&cost) {
                    *c += row.first().copied().unwrap_or(0.0);
                }
            }
            (None, Some(b)) => {
                let row = cost.first().cloned().unwrap_or_default();
                for (c, v) in self.model.choices[b].cost.iter_mut().zip(row) {
                    *c += v;
                }
            }
            (None, None) => {}
        }
    }

    /// Forward resharding; a graph output (`to_output`) only settles pending sums.
    fn forward(&self, from: Layout, to: Layout, flow: &Flow, to_output: bool) -> Result<f64, ShardingError> {
        let to = if to_output && from != Layout::Partial {
            from
        } else {
            to
        };
        self.pricer
            .reshard(from, to, flow.bytes)
            .map_err(ShardingError::Pricing)
    }

    /// Backward resharding of the gradient, when there is one.
    fn backward(&self, from: Layout, to: Layout, flow: &Flow) -> Result<f64, ShardingError> {
        if !flow.grad {
            return Ok(0.0);
        }
        self.pricer
            .reshard(from, to, flow.bytes)
            .map_err(ShardingError::Pricing)
    }
}
