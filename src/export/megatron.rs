//! Megatron-LM: the arguments of `pretrain_gpt.py`, as a bash array a
//! launch script expands (`torchrun … pretrain_gpt.py "${MEGATRON_ARGS[@]}"`).

use super::{Exported, Facts, Tool};
use autopar_cost_models::{AttentionKernel, MeshOrder, Recompute, Schedule};
use autopar_import::zoo::ModelSpec;
use autopar_ir::DType;

pub(super) fn export(f: &Facts) -> Exported {
    let p = &f.plan.parallel;
    let mut caveats = f.common_caveats();
    let mut args: Vec<String> = Vec::new();
    let mut arg = |a: &str, v: Option<String>| {
        args.push(match v {
            Some(v) => format!("{a} {v}"),
            None => a.to_string(),
        })
    };
    arg("--tensor-model-parallel-size", Some(p.tp.to_string()));
    arg("--pipeline-model-parallel-size", Some(p.pp.to_string()));
    if p.virtual_stages > 1 {
        arg(
            "--num-layers-per-virtual-pipeline-stage",
            Some(f.layers_per_chunk().to_string()),
        );
    }
    if p.sp {
        arg("--sequence-parallel", None);
    }
    arg("--context-parallel-size", Some(p.cp.to_string()));
    arg("--expert-model-parallel-size", Some(p.ep.to_string()));
    arg("--micro-batch-size", Some(p.micro_batch.to_string()));
    arg("--global-batch-size", Some(p.global_batch.to_string()));
    match p.recompute {
        Recompute::None => {}
        Recompute::Selective => arg("--recompute-granularity", Some("selective".into())),
        Recompute::Full => {
            arg("--recompute-granularity", Some("full".into()));
            arg("--recompute-method", Some("uniform".into()));
            arg("--recompute-num-layers", Some("1".into()));
        }
    }
    if p.zero >= 1 {
        arg("--use-distributed-optimizer", None);
    }
    if p.zero >= 2 {
        caveats.push(format!(
            "ZeRO-{}: Megatron-LM's distributed optimizer shards optimizer state and gradients' reduction (ZeRO-1/2); weights stay whole (--use-torch-fsdp2 would shard them)",
            p.zero
        ));
    }
    if p.grad_bucket_mib > 0 {
        arg("--overlap-grad-reduce", None);
        arg(
            "--ddp-bucket-size",
            Some((u64::from(p.grad_bucket_mib) << 20).to_string()),
        );
    }
    if p.tp_comm_overlap {
        arg("--tp-comm-overlap", None);
    }
    if p.mesh_order == MeshOrder::PipelineInner {
        arg("--use-tp-pp-dp-mapping", None);
    }
    if let Some(cf) = p.moe_capacity_factor {
        arg("--moe-expert-capacity-factor", Some(cf.to_string()));
        arg("--moe-pad-expert-input-to-capacity", None);
    }
    if p.schedule == Schedule::Gpipe {
        caveats
            .push("GPipe schedule: Megatron-LM runs 1F1B (the same bubble, less activation memory)".into());
    }
    if !f.even_stages() {
        let (first, last) = (f.stage_layers[0], f.stage_layers[f.stage_layers.len() - 1]);
        let middle = &f.stage_layers[1..f.stage_layers.len() - 1];
        if p.virtual_stages == 1 && middle.windows(2).all(|w| w[0] == w[1]) {
            arg("--decoder-first-pipeline-num-layers", Some(first.to_string()));
            arg("--decoder-last-pipeline-num-layers", Some(last.to_string()));
        } else {
            caveats.push(format!(
                "uneven stages ({:?} layers): Megatron-LM sets only the first and last stage's; its even split is emitted",
                f.stage_layers
            ));
        }
    }
    if !p.dropout {
        arg("--attention-dropout", Some("0.0".into()));
        arg("--hidden-dropout", Some("0.0".into()));
    }
    let backend = match p.attention {
        AttentionKernel::Fused => "flash",
        AttentionKernel::Unfused => "unfused",
    };
    arg("--attention-backend", Some(backend.into()));
    match f.dtype {
        DType::Bf16 => arg("--bf16", None),
        DType::F16 => arg("--fp16", None),
        _ => {}
    }
    if let Some(seq) = f.seq {
        arg("--seq-length", Some(seq.to_string()));
        arg("--max-position-embeddings", Some(seq.to_string()));
    }
    model_args(f, &mut arg, &mut caveats);
    let mut text = f.header(Tool::Megatron, "#");
    for c in &caveats {
        text.push_str(&format!("# Not expressible in Megatron-LM: {c}\n"));
    }
    text.push_str("MEGATRON_ARGS=(\n");
    for a in &args {
        text.push_str(&format!("  {a}\n"));
    }
    text.push_str(")\n");
    Exported { text, caveats }
}

/// The model's shape arguments, for a zoo spec; a note otherwise.
fn model_args(f: &Facts, arg: &mut impl FnMut(&str, Option<String>), caveats: &mut Vec<String>) {
    let shape = |arg: &mut dyn FnMut(&str, Option<String>),
                 layers: usize,
                 hidden: usize,
                 ffn: usize,
                 heads: usize,
                 vocab: usize| {
        arg("--num-layers", Some(layers.to_string()));
        arg("--hidden-size", Some(hidden.to_string()));
        arg("--ffn-hidden-size", Some(ffn.to_string()));
        arg("--num-attention-heads", Some(heads.to_string()));
        arg("--tokenizer-type", Some("NullTokenizer".into()));
        arg("--vocab-size", Some(vocab.to_string()));
    };
    match &f.spec {
        Some(ModelSpec::Gpt(c)) => {
            shape(arg, c.layers, c.hidden, c.ffn, c.heads, c.vocab);
            if !c.tied {
                arg("--untie-embeddings-and-output-weights", None);
            }
        }
        Some(ModelSpec::Llama(c)) => {
            shape(arg, c.layers, c.hidden, c.ffn, c.heads, c.vocab);
            arg("--normalization", Some("RMSNorm".into()));
            arg("--swiglu", None);
            arg("--position-embedding-type", Some("rope".into()));
            arg("--disable-bias-linear", None);
            if c.kv_heads < c.heads {
                arg("--group-query-attention", None);
                arg("--num-query-groups", Some(c.kv_heads.to_string()));
            }
            if !c.tied {
                arg("--untie-embeddings-and-output-weights", None);
            }
            if let Some(moe) = &c.moe {
                arg("--num-experts", Some(moe.experts.to_string()));
                arg("--moe-router-topk", Some(moe.top_k.to_string()));
            }
        }
        Some(ModelSpec::Bert(_)) => caveats.push(
            "a BERT encoder: its shape arguments belong to pretrain_bert.py, not pretrain_gpt.py; give them there".into(),
        ),
        None => caveats.push(format!(
            "the model ({}) is not a zoo spec: add its shape arguments (--num-layers, --hidden-size, …)",
            f.plan.inputs.model
        )),
    }
}
