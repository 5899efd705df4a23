"""Loads what `autopar export` wrote with each target project's own code and
checks that the values it reads are the plan's.

    python scripts/check_exports.py PLAN.json DIR

DIR holds `megatron_args.sh`, `torchtitan.toml` and `ds_config.json` for
PLAN.json. Run by scripts/check-exports.sh, which installs the projects.

- torchtitan: its own `ConfigManager` (the TOML job-file loader
  `torchtitan/train.py` uses; it refuses unknown keys), torchtitan 0.2.
- DeepSpeed: its own `DeepSpeedConfig` (batch arithmetic, ZeRO and bf16
  sections), given the plan's data-parallel size through DeepSpeed's `mpu`
  interface as a launcher would.
- Megatron: megatron-core's own config classes (`TransformerConfig`,
  `DistributedDataParallelConfig`, `OptimizerConfig`, whose checks run on
  construction) and micro-batch calculator, filled from the arguments as
  Megatron-LM's `core_transformer_config_from_args` fills them (by field
  name). Megatron-LM's argparse parser itself is not on PyPI.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

# Megatron-LM arguments that configure training rather than a megatron-core
# config class (its argparse parser reads them; megatron-core never sees
# them).
MEGATRON_TRAINING_ARGS = {
    "micro_batch_size",
    "global_batch_size",
    "seq_length",
    "max_position_embeddings",
    "tokenizer_type",
    "vocab_size",
    "num_layers_per_virtual_pipeline_stage",
    "ddp_bucket_size",
    "group_query_attention",
    "swiglu",
    "num_experts",
    "position_embedding_type",
    "untie_embeddings_and_output_weights",
    "accumulate_allreduce_grads_in_fp32",
    "disable_bias_linear",
    "moe_grouped_gemm",
    "recompute_activations",
    "fp16_lm_cross_entropy",
    "use_tp_pp_dp_mapping",
}


def shell_array(path: Path, name: str) -> list[str]:
    """The bash array `name` as bash itself reads the file."""
    script = f'source "$1"; printf "%s\\n" "${{{name}[@]}}"'
    out = subprocess.run(["bash", "-c", script, "bash", str(path)], check=True, capture_output=True, text=True)
    return out.stdout.splitlines()


def megatron_namespace(argv: list[str]) -> dict[str, Any]:
    """`--flag value` / `--switch` as argparse would store them."""
    ns: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        flag = argv[i]
        assert flag.startswith("--"), f"not a flag: {flag}"
        key = flag[2:].replace("-", "_")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            raw = argv[i + 1]
            value: Any = raw
            for cast in (int, float):
                try:
                    value = cast(raw)
                    break
                except ValueError:
                    pass
            ns[key] = value
            i += 2
        else:
            ns[key] = True
            i += 1
    return ns


def check_megatron(path: Path, plan: dict, expect: Callable[[str, Any, Any], None]) -> None:
    import torch
    from megatron.core import num_microbatches_calculator as microbatches
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    ns = megatron_namespace(shell_array(path, "MEGATRON_ARGS"))
    classes = (TransformerConfig, DistributedDataParallelConfig, OptimizerConfig)
    fields = {c: {f.name for f in dataclasses.fields(c)} for c in classes}
    claimed = set().union(*fields.values()) | MEGATRON_TRAINING_ARGS
    unknown = sorted(k for k in ns if k not in claimed)
    expect("every argument is Megatron's", unknown, [])

    p = plan["parallel"]
    # What Megatron-LM derives from the arguments before building configs.
    derived: dict[str, Any] = {}
    dtype = torch.bfloat16 if ns.get("bf16") else torch.float16 if ns.get("fp16") else torch.float32
    derived["params_dtype"] = dtype
    derived["pipeline_dtype"] = dtype
    if "num_layers_per_virtual_pipeline_stage" in ns:
        layers = ns.get("num_layers") or sum(s["layers"][1] - s["layers"][0] for s in plan["stages"])
        derived["virtual_pipeline_model_parallel_size"] = (
            layers // ns["pipeline_model_parallel_size"] // ns["num_layers_per_virtual_pipeline_stage"]
        )
    if "attention_backend" in ns:
        derived["attention_backend"] = AttnBackend[ns["attention_backend"]]
    if "ddp_bucket_size" in ns:
        derived["bucket_size"] = ns["ddp_bucket_size"]
    if "num_experts" in ns:
        derived["num_moe_experts"] = ns["num_experts"]
    values = {**ns, **derived}

    def build(cls: type) -> Any:
        return cls(**{k: v for k, v in values.items() if k in fields[cls]})

    shape = {"num_layers", "hidden_size", "num_attention_heads"}
    if shape <= ns.keys():
        tc = build(TransformerConfig)
    else:
        # No shape arguments (a model autopar does not recognise): check the
        # parallel part with placeholder shapes that every degree divides.
        tp = ns.get("tensor_model_parallel_size", 1)
        size = 64 * tp * ns.get("context_parallel_size", 1)
        values.update(num_layers=len(plan["stages"]) * max(p["virtual_stages"], 1), hidden_size=size, num_attention_heads=tp)
        tc = build(TransformerConfig)
    PRECISION["megatron"] = "bf16" if tc.bf16 else "fp16" if tc.fp16 else "fp32"
    ddp = build(DistributedDataParallelConfig)
    build(OptimizerConfig)
    expect("tensor parallel", tc.tensor_model_parallel_size, p["tp"])
    expect("pipeline parallel", tc.pipeline_model_parallel_size, p["pp"])
    expect("virtual stages", tc.virtual_pipeline_model_parallel_size or 1, p["virtual_stages"])
    expect("sequence parallel", tc.sequence_parallel, p["sp"] and p["tp"] > 1)
    expect("context parallel", tc.context_parallel_size, p["cp"])
    expect("expert parallel", tc.expert_model_parallel_size, p["ep"])
    expect("distributed optimizer (ZeRO-1)", ddp.use_distributed_optimizer, p["zero"] >= 1)
    microbatches.destroy_num_microbatches_calculator()
    microbatches.init_num_microbatches_calculator(
        rank=0,
        rampup_batch_size=None,
        global_batch_size=ns["global_batch_size"],
        micro_batch_size=ns["micro_batch_size"],
        data_parallel_size=p["dp"],
        decrease_batch_size_if_needed=False,
    )
    expect("micro-batches", microbatches.get_num_microbatches(), p["micro_batches"])
    expect("global batch", microbatches.get_current_global_batch_size(), p["global_batch"])


def check_torchtitan(path: Path, plan: dict, expect: Callable[[str, Any, Any], None]) -> None:
    from torchtitan.config import ConfigManager

    cfg = ConfigManager().parse_args(["--job.config_file", str(path)])
    p, t = plan["parallel"], cfg.parallelism
    fsdp = p["zero"] >= 1
    expect("replicate × shard degree", t.data_parallel_replicate_degree * t.data_parallel_shard_degree, p["dp"])
    expect("shard degree (FSDP)", t.data_parallel_shard_degree, p["dp"] if fsdp else 1)
    expect("tensor parallel", t.tensor_parallel_degree, p["tp"])
    expect("pipeline parallel", t.pipeline_parallel_degree, p["pp"])
    expect("context parallel", t.context_parallel_degree, p["cp"])
    expect("expert parallel", t.expert_parallel_degree, p["ep"])
    PRECISION["torchtitan"] = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(
        cfg.training.mixed_precision_param, cfg.training.mixed_precision_param
    )
    expect("global batch", cfg.training.global_batch_size, p["global_batch"])
    expect("local batch", cfg.training.local_batch_size, p["global_batch"] // p["dp"])
    if p["pp"] > 1:
        expect("pipeline micro-batch", t.pipeline_parallel_microbatch_size, p["micro_batch"])


def check_deepspeed(path: Path, plan: dict, expect: Callable[[str, Any, Any], None]) -> None:
    import deepspeed.runtime.config as ds

    p = plan["parallel"]

    class Mpu:
        """What DeepSpeed asks a launcher's model-parallel unit."""

        def get_data_parallel_world_size(self) -> int:
            return p["dp"]

        def get_model_parallel_world_size(self) -> int:
            return p["tp"] * p["pp"]

    # This process stands for rank 0 of the job; no process group is needed
    # to read a configuration.
    ds.dist.get_rank = lambda *args, **kwargs: 0
    cfg = ds.DeepSpeedConfig(str(path), mpu=Mpu())
    expect("train batch", cfg.train_batch_size, p["global_batch"])
    expect("micro-batch per GPU", cfg.train_micro_batch_size_per_gpu, p["micro_batch"])
    expect("gradient accumulation", cfg.gradient_accumulation_steps, p["micro_batches"])
    expect("ZeRO stage", cfg.zero_optimization_stage, p["zero"])
    PRECISION["deepspeed"] = (
        "bf16" if cfg.bfloat16_config.enabled else "fp16" if cfg.float16_config.enabled else "fp32"
    )
    if p["tp"] > 1:
        expect("tensor parallel (AutoTP)", cfg.tensor_parallel_config.autotp_size, p["tp"])


# The precision each tool reads its file as training in: the three must agree.
PRECISION: dict[str, str] = {}

CHECKS = {
    "megatron": ("megatron_args.sh", check_megatron),
    "torchtitan": ("torchtitan.toml", check_torchtitan),
    "deepspeed": ("ds_config.json", check_deepspeed),
}


def main() -> int:
    plan_path, folder = Path(sys.argv[1]), Path(sys.argv[2])
    plan = json.loads(plan_path.read_text())
    passed = failed = 0
    for tool, (name, check) in CHECKS.items():
        problems: list[str] = []

        def expect(what: str, got: Any, want: Any) -> None:
            if got != want:
                problems.append(f"{what}: read {got!r}, plan says {want!r}")

        try:
            check(folder / name, plan, expect)
        except Exception as e:  # the project's parser refused the file
            problems.append(f"{type(e).__name__}: {e}")
        if problems:
            failed += 1
            print(f"FAIL {plan_path.name} → {tool}: " + "; ".join(problems))
        else:
            passed += 1
            print(f"ok   {plan_path.name} → {tool}")
    if len(set(PRECISION.values())) > 1:
        failed += 1
        print(f"FAIL {plan_path.name}: the tools disagree on precision: {PRECISION}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
