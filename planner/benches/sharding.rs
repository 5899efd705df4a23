//! Times the sharding ILP on GPT-2 (124M) with tp = 8 on a DGX H100: the
//! representative layer and the parts before and after the layers, for both
//! exporters' graphs. Run with `cargo bench -p autopar-planner --bench sharding`.
//! Target: the whole model's sharding well under a second (at most 5 s).

use autopar_cost_models::{Calibration, Cluster};
use autopar_import::onnx;
use autopar_ir::{Graph, NodeIndex};
use autopar_planner::sharding::{solve, ShardingProblem};
use autopar_rewrite::{canonicalize, detect_blocks};
use std::collections::HashSet;
use std::error::Error;
use std::time::Instant;

/// The first layer's nodes, and the nodes outside every layer split into
/// those before the layers and those after (as the cost model places them).
fn parts(g: &Graph) -> Result<[Vec<NodeIndex>; 3], Box<dyn Error>> {
    let in_blocks: HashSet<&str> = g
        .blocks
        .iter()
        .flat_map(|b| b.nodes.iter().map(String::as_str))
        .collect();
    let first: HashSet<&str> = g
        .blocks
        .first()
        .map(|b| b.nodes.iter().map(String::as_str).collect())
        .unwrap_or_default();
    let (mut pre, mut layer, mut post) = (Vec::new(), Vec::new(), Vec::new());
    let mut before: HashSet<NodeIndex> = HashSet::new();
    for idx in g.topo_order()? {
        let node = g.node(idx);
        if first.contains(node.name.as_str()) {
            layer.push(idx);
        } else if !in_blocks.contains(node.name.as_str()) {
            let after = node
                .inputs
                .iter()
                .flatten()
                .filter_map(|&t| g.producer(t))
                .any(|p| !before.contains(&p));
            if after {
                post.push(idx);
            } else {
                before.insert(idx);
                pre.push(idx);
            }
        }
    }
    Ok([pre, layer, post])
}

fn main() -> Result<(), Box<dyn Error>> {
    let cluster = Cluster::preset("dgx-h100")?.with_gpus(8)?;
    let calibration = Calibration::default();
    for file in ["gpt2-full.ts.weightless.onnx", "gpt2-full.dynamo.weightless.onnx"] {
        let path = format!("{}/../fixtures/models/{file}", env!("CARGO_MANIFEST_DIR"));
        let mut g = canonicalize(&onnx::load_model(std::path::Path::new(&path))?)?.0;
        g.blocks = detect_blocks(&g)?;
        let bindings = g.bindings.clone();
        let start = Instant::now();
        for (name, nodes) in ["pre", "layer", "post"].iter().zip(parts(&g)?) {
            let p = ShardingProblem {
                graph: &g,
                bindings: &bindings,
                nodes: &nodes,
                tp: 8,
                cluster: &cluster,
                calibration: &calibration,
                memory_limit_bytes: None,
            };
            let t = Instant::now();
            let s = solve(&p)?;
            println!(
                "{file} {name:5}: {:4} nodes, {:6} ILP variables, {:8.2} ms (compute {:.1} us, comm {:.1} us)",
                nodes.len(),
                s.variables,
                t.elapsed().as_secs_f64() * 1e3,
                s.compute_s * 1e6,
                s.comm_s * 1e6
            );
            let products: Vec<String> = s
                .ops
                .iter()
                .filter(|o| matches!(o.op.as_str(), "Linear" | "MatMul" | "Attention" | "Embedding"))
                .map(|o| format!("{} {}", o.op, o.strategy))
                .collect();
            println!("    {}", products.join(", "));
        }
        println!("{file} total: {:.2} ms", start.elapsed().as_secs_f64() * 1e3);
    }
    Ok(())
}
