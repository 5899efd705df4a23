//! torchtitan: a job TOML (`[parallelism]`, `[training]`,
//! `[activation_checkpoint]`). Data parallelism is FSDP's sharding degree
//! under ZeRO, DDP's replication degree without it.

use super::{Exported, Facts, Tool};
use autopar_cost_models::{Recompute, Schedule};
use autopar_ir::DType;
use std::fmt::Write;

pub(super) fn export(f: &Facts) -> Exported {
    let p = &f.plan.parallel;
    let mut caveats = f.common_caveats();
    let (replicate, shard) = if p.zero == 0 { (p.dp, 1) } else { (1, p.dp) };
    // FSDP keeps weights sharded between uses ("always") or gathered from
    // the forward pass to the backward ("never": ZeRO-2's memory).
    let reshard = if p.zero >= 3 { "always" } else { "never" };
    if p.zero == 1 {
        caveats.push("ZeRO-1: FSDP shards gradients too (ZeRO-2), which only saves memory".into());
    }
    if p.tp > 1 && !p.sp {
        caveats.push("tensor parallelism without sequence parallelism: torchtitan's always shards the sequence between regions".into());
    }
    if !f.even_stages() {
        caveats.push(format!(
            "uneven stages ({:?} layers): torchtitan splits layers evenly unless pipeline_parallel_split_points names the module boundaries",
            f.stage_layers
        ));
    }
    if p.mesh_order == autopar_cost_models::MeshOrder::PipelineInner {
        caveats.push("pipeline-inner rank order: torchtitan's mesh is (pp, dp, cp, tp), data parallelism inside pipelines".into());
    }
    let schedule = match p.schedule {
        Schedule::Gpipe => "GPipe",
        Schedule::OneFOneB => "1F1B",
        Schedule::Interleaved => "Interleaved1F1B",
    };
    let mode = match f.uniform_recompute.unwrap_or(p.recompute) {
        Recompute::None => "none",
        Recompute::Selective => "selective",
        Recompute::Full => "full",
    };
    let mut t = f.header(Tool::Torchtitan, "#");
    for c in &caveats {
        let _ = writeln!(t, "# Not expressible in torchtitan: {c}");
    }
    let _ = writeln!(
        t,
        "\n[job]\ndescription = \"{}\"",
        super::summary(p).replace('"', "'")
    );
    let _ = writeln!(t, "\n[training]");
    let _ = writeln!(t, "local_batch_size = {}", p.micro_batch * p.micro_batches);
    let _ = writeln!(t, "global_batch_size = {}", p.global_batch);
    if let Some(seq) = f.seq {
        let _ = writeln!(t, "seq_len = {seq}");
    }
    // torchtitan's default is bfloat16: say the type whatever it is.
    let param = match f.dtype {
        DType::Bf16 => "bfloat16",
        DType::F16 => "float16",
        _ => "float32",
    };
    let _ = writeln!(t, "mixed_precision_param = \"{param}\"");
    let _ = writeln!(t, "\n[parallelism]");
    let _ = writeln!(t, "data_parallel_replicate_degree = {replicate}");
    let _ = writeln!(t, "data_parallel_shard_degree = {shard}");
    let _ = writeln!(t, "fsdp_reshard_after_forward = \"{reshard}\"");
    let _ = writeln!(t, "tensor_parallel_degree = {}", p.tp);
    let _ = writeln!(t, "enable_async_tensor_parallel = {}", p.tp_comm_overlap);
    let _ = writeln!(t, "pipeline_parallel_degree = {}", p.pp);
    let _ = writeln!(t, "pipeline_parallel_schedule = \"{schedule}\"");
    let _ = writeln!(t, "pipeline_parallel_microbatch_size = {}", p.micro_batch);
    if p.virtual_stages > 1 {
        let _ = writeln!(t, "pipeline_parallel_layers_per_stage = {}", f.layers_per_chunk());
    }
    let _ = writeln!(t, "context_parallel_degree = {}", p.cp);
    let _ = writeln!(t, "expert_parallel_degree = {}", p.ep);
    let _ = writeln!(t, "\n[activation_checkpoint]\nmode = \"{mode}\"");
    Exported { text: t, caveats }
}
