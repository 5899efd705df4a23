//! Times the sharding ILP on GPT-2 (124M) with tp = 8 on a DGX H100: the
//! representative layer and the parts before and after the layers, for both
//! exporters' graphs. Run with `cargo bench -p autopar-planner --bench sharding`.
//! Target: the whole model's sharding well under a second (at most 5 s).

use autopar_cost_models::{Calibration, Cluster};
use autopar_import::onnx;
use autopar_planner::layer_sharding::node_sets;
use autopar_planner::sharding::{solve, ShardingProblem};
use autopar_rewrite::{canonicalize, detect_blocks};
use std::error::Error;
use std::time::Instant;

fn main() -> Result<(), Box<dyn Error>> {
    let cluster = Cluster::preset("dgx-h100")?.with_gpus(8)?;
    let calibration = Calibration::default();
    for file in ["gpt2-full.ts.weightless.onnx", "gpt2-full.dynamo.weightless.onnx"] {
        let path = format!("{}/../fixtures/models/{file}", env!("CARGO_MANIFEST_DIR"));
        let mut g = canonicalize(&onnx::load_model(std::path::Path::new(&path))?)?.0;
        g.blocks = detect_blocks(&g)?;
        let bindings = g.bindings.clone();
        let start = Instant::now();
        for (name, nodes) in ["ends", "layer"].iter().zip(node_sets(&g)?) {
            let p = ShardingProblem {
                graph: &g,
                bindings: &bindings,
                nodes: &nodes,
                tp: 8,
                cluster: &cluster,
                calibration: &calibration,
                memory_limit_bytes: None,
                sequence_parallel: false,
                context_parallel: 1,
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
