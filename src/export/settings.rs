//! Reading another tool's configuration back as the degrees and knobs an
//! estimate prices (`autopar estimate MODEL --from TOOL FILE`): what the
//! export writes, and what people write by hand in the same keys.

use super::Tool;
use anyhow::{bail, Context, Result};
use autopar_cost_models::{AttentionKernel, MeshOrder, Recompute, Schedule};
use std::collections::BTreeMap;
use std::path::Path;

/// A configuration's parallel settings; `None` where the file is silent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    pub tp: Option<usize>,
    pub pp: Option<usize>,
    pub dp: Option<usize>,
    pub cp: Option<usize>,
    pub ep: Option<usize>,
    pub sp: Option<bool>,
    pub zero: Option<u8>,
    pub micro_batch: Option<usize>,
    pub global_batch: Option<usize>,
    pub seq: Option<usize>,
    pub recompute: Option<Recompute>,
    pub schedule: Option<Schedule>,
    /// Layers per virtual pipeline stage (interleaved chunks).
    pub layers_per_chunk: Option<usize>,
    pub dropout: Option<bool>,
    pub moe_capacity_factor: Option<f64>,
    pub overlap_grad_reduce: Option<bool>,
    pub grad_bucket_mib: Option<u32>,
    pub tp_comm_overlap: Option<bool>,
    pub mesh_order: Option<MeshOrder>,
    pub attention: Option<AttentionKernel>,
    /// ZeRO-1/2's weight gathers beside the next forward pass.
    pub overlap_param_gather: Option<bool>,
    /// Gradients accumulated and reduced in f32.
    pub f32_main_grads: Option<bool>,
}

/// Reads `file` as `tool`'s configuration.
pub fn read(tool: Tool, file: &Path) -> Result<Settings> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("{}: cannot read it", file.display()))?;
    let parsed = match tool {
        Tool::Megatron => megatron(&text),
        Tool::Torchtitan => torchtitan(&text),
        Tool::Deepspeed => deepspeed(&text),
    };
    parsed.with_context(|| format!("{}: as a {} configuration", file.display(), tool.name()))
}

fn number<T: std::str::FromStr>(key: &str, v: &str) -> Result<T> {
    v.trim_matches(|c| c == '"' || c == '\'')
        .parse()
        .map_err(|_| anyhow::anyhow!("{key} {v}: not a number"))
}

/// Megatron-LM arguments: a file of `--flag [value]` (comments, a bash
/// array, line continuations and other arguments allowed).
fn megatron(text: &str) -> Result<Settings> {
    let words: Vec<&str> = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(str::split_whitespace)
        .map(|w| w.trim_start_matches("MEGATRON_ARGS=(").trim_end_matches(')'))
        .filter(|w| !w.is_empty() && *w != "\\")
        .collect();
    let mut flags: BTreeMap<&str, Option<&str>> = BTreeMap::new();
    for (i, w) in words.iter().enumerate() {
        if w.starts_with("--") {
            let value = words.get(i + 1).filter(|v| !v.starts_with("--")).copied();
            flags.insert(w, value);
        }
    }
    if flags.is_empty() {
        bail!("no --flags in it");
    }
    let get = |k: &str| -> Result<Option<usize>> {
        match flags.get(k) {
            Some(Some(v)) => Ok(Some(number(k, v)?)),
            Some(None) => bail!("{k} has no value"),
            None => Ok(None),
        }
    };
    let on = |k: &str| flags.contains_key(k);
    let chunk = get("--num-layers-per-virtual-pipeline-stage")?;
    let granularity = flags.get("--recompute-granularity").copied().flatten();
    let recompute = match granularity {
        Some("full") => Recompute::Full,
        Some("selective") => Recompute::Selective,
        Some(other) => bail!("--recompute-granularity {other}: expected full or selective"),
        None if on("--recompute-activations") => Recompute::Selective,
        None => Recompute::None,
    };
    let dropout = ["--attention-dropout", "--hidden-dropout"]
        .iter()
        .any(|k| !matches!(flags.get(k), Some(Some(v)) if v.parse::<f64>() == Ok(0.0)));
    Ok(Settings {
        tp: Some(get("--tensor-model-parallel-size")?.unwrap_or(1)),
        pp: Some(get("--pipeline-model-parallel-size")?.unwrap_or(1)),
        dp: None,
        cp: Some(get("--context-parallel-size")?.unwrap_or(1)),
        ep: Some(get("--expert-model-parallel-size")?.unwrap_or(1)),
        sp: Some(on("--sequence-parallel")),
        zero: Some(u8::from(on("--use-distributed-optimizer"))),
        micro_batch: get("--micro-batch-size")?,
        global_batch: get("--global-batch-size")?,
        seq: get("--seq-length")?,
        recompute: Some(recompute),
        schedule: Some(if chunk.is_some() {
            Schedule::Interleaved
        } else {
            Schedule::OneFOneB
        }),
        layers_per_chunk: chunk,
        dropout: Some(dropout),
        moe_capacity_factor: match flags.get("--moe-expert-capacity-factor") {
            Some(Some(v)) => Some(number("--moe-expert-capacity-factor", v)?),
            _ => None,
        },
        overlap_grad_reduce: Some(on("--overlap-grad-reduce")),
        grad_bucket_mib: get("--ddp-bucket-size")?.map(|b| (b >> 20) as u32),
        tp_comm_overlap: Some(on("--tp-comm-overlap")),
        mesh_order: Some(if on("--use-tp-pp-dp-mapping") {
            MeshOrder::PipelineInner
        } else {
            MeshOrder::DataInner
        }),
        attention: match flags.get("--attention-backend").copied().flatten() {
            Some("flash" | "fused") => Some(AttentionKernel::Fused),
            Some("unfused" | "local") => Some(AttentionKernel::Unfused),
            Some("auto") | None if on("--use-flash-attn") => Some(AttentionKernel::Fused),
            Some(other) if other != "auto" => {
                bail!("--attention-backend {other}: expected flash, fused, unfused, local or auto")
            }
            _ => None,
        },
        overlap_param_gather: Some(on("--overlap-param-gather")),
        f32_main_grads: Some(on("--accumulate-allreduce-grads-in-fp32")),
    })
}

/// A torchtitan job TOML.
fn torchtitan(text: &str) -> Result<Settings> {
    let t: toml::Table = text.parse()?;
    let section = |name: &str| t.get(name).and_then(toml::Value::as_table);
    let int = |sec: &str, k: &str| -> Result<Option<usize>> {
        match section(sec).and_then(|s| s.get(k)) {
            None => Ok(None),
            Some(v) => match v.as_integer() {
                Some(n) if n >= 0 => Ok(Some(n as usize)),
                // -1: torchtitan fills the degree in from the world size.
                Some(-1) => Ok(None),
                _ => bail!("[{sec}] {k} = {v}: expected a count"),
            },
        }
    };
    let text_of = |sec: &str, k: &str| section(sec).and_then(|s| s.get(k)).and_then(toml::Value::as_str);
    let replicate = int("parallelism", "data_parallel_replicate_degree")?.unwrap_or(1);
    let shard = int("parallelism", "data_parallel_shard_degree")?;
    let zero = match (shard, text_of("parallelism", "fsdp_reshard_after_forward")) {
        (Some(s), Some("never")) if s > 1 => 2,
        (Some(s), _) if s > 1 => 3,
        _ => 0,
    };
    let schedule = match text_of("parallelism", "pipeline_parallel_schedule") {
        None | Some("1F1B") => Schedule::OneFOneB,
        Some("GPipe") => Schedule::Gpipe,
        Some("Interleaved1F1B") => Schedule::Interleaved,
        Some(other) => {
            bail!("pipeline_parallel_schedule \"{other}\": expected 1F1B, GPipe or Interleaved1F1B")
        }
    };
    let recompute = match text_of("activation_checkpoint", "mode") {
        None | Some("none") => Recompute::None,
        Some("selective") => Recompute::Selective,
        Some("full") => Recompute::Full,
        Some(other) => bail!("[activation_checkpoint] mode \"{other}\": expected none, selective or full"),
    };
    let tp = int("parallelism", "tensor_parallel_degree")?.unwrap_or(1);
    let micro_batch = int("parallelism", "pipeline_parallel_microbatch_size")?;
    Ok(Settings {
        tp: Some(tp),
        pp: Some(int("parallelism", "pipeline_parallel_degree")?.unwrap_or(1)),
        dp: shard.map(|s| s * replicate),
        cp: Some(int("parallelism", "context_parallel_degree")?.unwrap_or(1)),
        ep: Some(int("parallelism", "expert_parallel_degree")?.unwrap_or(1)),
        // torchtitan's tensor parallelism shards the sequence between regions.
        sp: Some(tp > 1),
        zero: Some(zero),
        micro_batch,
        global_batch: int("training", "global_batch_size")?,
        seq: int("training", "seq_len")?,
        recompute: Some(recompute),
        schedule: Some(schedule),
        layers_per_chunk: int("parallelism", "pipeline_parallel_layers_per_stage")?,
        dropout: None,
        moe_capacity_factor: None,
        overlap_grad_reduce: Some(true),
        grad_bucket_mib: None,
        tp_comm_overlap: section("parallelism")
            .and_then(|s| s.get("enable_async_tensor_parallel"))
            .and_then(toml::Value::as_bool),
        ..Settings::default()
    })
}

/// A DeepSpeed `ds_config.json`.
fn deepspeed(text: &str) -> Result<Settings> {
    let d: serde_json::Value = serde_json::from_str(text)?;
    let count = |v: &serde_json::Value, k: &str| -> Result<Option<usize>> {
        match v.get(k) {
            None => Ok(None),
            Some(x) => x
                .as_u64()
                .map(|n| Some(n as usize))
                .ok_or_else(|| anyhow::anyhow!("\"{k}\": {x}: expected a count")),
        }
    };
    let micro = count(&d, "train_micro_batch_size_per_gpu")?;
    let accumulation = count(&d, "gradient_accumulation_steps")?;
    let global = count(&d, "train_batch_size")?;
    let dp = match (global, micro, accumulation) {
        (Some(g), Some(m), Some(a)) if m * a > 0 => Some(g / (m * a)),
        _ => None,
    };
    let zero = count(&d["zero_optimization"], "stage")?.unwrap_or(0);
    if zero > 3 {
        bail!("\"zero_optimization\": stage {zero}: expected 0 to 3");
    }
    Ok(Settings {
        tp: Some(count(&d["tensor_parallel"], "autotp_size")?.unwrap_or(1)),
        dp,
        zero: Some(zero as u8),
        micro_batch: micro,
        global_batch: global,
        recompute: Some(if d.get("activation_checkpointing").is_some() {
            Recompute::Full
        } else {
            Recompute::None
        }),
        overlap_grad_reduce: Some(
            d["zero_optimization"]["overlap_comm"].as_bool().unwrap_or(false) || zero == 0,
        ),
        grad_bucket_mib: count(&d["zero_optimization"], "reduce_bucket_size")?.map(|b| (b >> 20) as u32),
        ..Settings::default()
    })
}
