"""``autopar.estimate``: the dict ``autopar estimate --json`` prints."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import autopar
from conftest import REPO

#: The model and configuration of the CLI's estimate snapshot.
GPT = "gpt:layers=8,hidden=1024,heads=16,vocab=50304,seq=1024,dtype=bf16"


def test_the_cli_snapshot_configuration_gives_the_cli_numbers() -> None:
    report = autopar.estimate(
        GPT,
        cluster="dgx-a100-80g",
        gpus=16,
        tp=2,
        pp=2,
        global_batch=64,
        recompute="selective",
        schedule="interleaved",
        zero=1,
        sp=True,
    )
    snap = (REPO / "snapshots" / "estimate_cli__estimate__gpt_16_gpus.snap").read_text()
    step_ms = float(re.search(r"^step time  ([0-9.]+) ms$", snap, re.M).group(1))  # type: ignore[union-attr]
    assert round(report["step_time_s"] * 1e3, 3) == step_ms
    mfu = float(re.search(r"\(MFU ([0-9.]+) %\)", snap).group(1))  # type: ignore[union-attr]
    assert round(report["mfu"] * 100, 1) == mfu
    assert report["model"] == GPT
    assert report["cluster"] == "dgx-a100-80g"
    assert report["gpus"] == 16
    c = report["config"]
    assert (c["dp"], c["tp"], c["pp"], c["virtual_stages"], c["zero"]) == (4, 2, 2, 2, 1)
    assert (c["schedule"], c["recompute"], c["attention"], c["sp"]) == ("interleaved", "selective", "fused", True)
    assert (c["micro_batch"], c["micro_batches"], c["seq"]) == (1, 16, 1024)
    for key in ["parameters", "memory_per_gpu_bytes", "fits", "breakdown", "memory"]:
        assert key in report, key


def test_defaults_are_the_cli_defaults() -> None:
    report = autopar.estimate(GPT, cluster="dgx-h100", gpus=8, global_batch=8)
    c = report["config"]
    assert (c["dp"], c["tp"], c["pp"], c["cp"], c["ep"], c["zero"]) == (8, 1, 1, 1, 1, 0)
    assert (c["schedule"], c["recompute"], c["attention"], c["dropout"]) == ("1f1b", "none", "fused", False)


def test_from_a_tool_configuration(tmp_path: Path) -> None:
    plan = autopar.plan(GPT, cluster="dgx-a100-80g", gpus=16, global_batch=64)
    args = tmp_path / "megatron_args.sh"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", autopar.ExportWarning)
        plan.export("megatron", args)
    report = autopar.estimate(GPT, cluster="dgx-a100-80g", gpus=16, from_=("megatron", args))
    p = plan.parallel
    c = report["config"]
    assert (c["dp"], c["tp"], c["pp"], c["zero"], c["global_batch"]) == (p["dp"], p["tp"], p["pp"], min(p["zero"], 1), 64)
