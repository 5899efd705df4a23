//! DeepSpeed: `ds_config.json`. Batch sizes, ZeRO, bf16 and automatic
//! tensor parallelism live in the config; pipeline stages, context and
//! expert parallelism are set up in the training script, so the config says
//! them in its `comment`, as JSON has no comments.

use super::{Exported, Facts, Tool};
use autopar_cost_models::Recompute;
use autopar_ir::DType;
use serde_json::json;

pub(super) fn export(f: &Facts) -> Exported {
    let p = &f.plan.parallel;
    let mut caveats = f.common_caveats();
    if p.pp > 1 {
        caveats.push(format!(
            "pipeline parallelism: build the model as PipelineModule(num_stages={}, partition_method=\"uniform\"); stages hold {:?} layers",
            p.pp, f.stage_layers
        ));
    }
    if p.virtual_stages > 1 {
        caveats.push("interleaved pipeline chunks: DeepSpeed's pipeline runs one chunk per stage".into());
    }
    if p.cp > 1 {
        caveats.push(format!(
            "context parallelism ({}): DeepSpeed's is Ulysses sequence parallelism, set up in the script",
            p.cp
        ));
    }
    if p.ep > 1 {
        caveats.push(format!(
            "expert parallelism ({}): deepspeed.moe.layer.MoE(ep_size={}) in the model",
            p.ep, p.ep
        ));
    }
    if p.sp {
        caveats.push("sequence parallelism between tensor-parallel regions: DeepSpeed's automatic tensor parallelism has none".into());
    }
    if p.recompute != Recompute::None {
        caveats.push(format!(
            "recomputation ({}): wrap each layer in deepspeed.checkpointing.checkpoint in the model",
            p.recompute
        ));
    }
    let mut config = json!({
        "train_batch_size": p.global_batch,
        "train_micro_batch_size_per_gpu": p.micro_batch,
        "gradient_accumulation_steps": p.micro_batches,
        "zero_optimization": {
            "stage": p.zero,
            "overlap_comm": true,
            "contiguous_gradients": true,
            "reduce_bucket_size": u64::from(p.grad_bucket_mib.max(1)) << 20,
        },
        "bf16": { "enabled": f.dtype == DType::Bf16 },
        "fp16": { "enabled": f.dtype == DType::F16 },
    });
    if p.tp > 1 {
        config["tensor_parallel"] = json!({ "autotp_size": p.tp });
    }
    if p.recompute != Recompute::None {
        config["activation_checkpointing"] = json!({ "partition_activations": p.tp > 1 });
    }
    let header = f.header(Tool::Deepspeed, "");
    let mut comment: Vec<String> = header.lines().map(|l| l.trim().to_string()).collect();
    comment.extend(
        caveats
            .iter()
            .map(|c| format!("Not expressible in ds_config.json: {c}")),
    );
    config["comment"] = json!(comment);
    let text = serde_json::to_string_pretty(&config).unwrap_or_default() + "\n";
    Exported { text, caveats }
}
