//! Whole-graph totals at bound dimensions: FLOPs and bytes of one training
//! step, summed from each op's cost.

use crate::{Bindings, Cost, Graph, GraphError, Shape, TensorType};

/// Why totals could not be computed.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum StatsError {
    #[error("tensor '{tensor}' has shape {shape} with an unbound symbol; bind it (e.g. --batch/--seq)")]
    Unbound { tensor: String, shape: String },
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// Sum of every node's [`Cost`] with symbolic dims resolved by `bindings`.
pub fn graph_cost(graph: &Graph, bindings: &Bindings) -> Result<Cost, StatsError> {
    let resolve = |t: crate::TensorId| -> Result<TensorType, StatsError> {
        let tensor = graph.tensor(t);
        let dims = tensor
            .ty
            .shape
            .resolve(bindings)
            .ok_or_else(|| StatsError::Unbound {
                tensor: tensor.name.clone(),
                shape: tensor.ty.shape.to_string(),
            })?;
        Ok(TensorType {
            dtype: tensor.ty.dtype,
            shape: Shape::fixed(&dims),
        })
    };
    let mut total = Cost::default();
    for idx in graph.topo_order()? {
        let node = graph.node(idx);
        let inputs = node
            .inputs
            .iter()
            .map(|t| t.map(resolve).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let outputs = node
            .outputs
            .iter()
            .map(|&t| resolve(t))
            .collect::<Result<Vec<_>, _>>()?;
        let c = node.op.cost(
            &inputs.iter().map(Option::as_ref).collect::<Vec<_>>(),
            &outputs.iter().collect::<Vec<_>>(),
        );
        total.forward_flops += c.forward_flops;
        total.backward_flops += c.backward_flops;
        total.bytes_read += c.bytes_read;
        total.bytes_written += c.bytes_written;
    }
    Ok(total)
}
