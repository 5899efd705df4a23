"""A refused request raises ``autopar.Error`` with the message the
``autopar`` command prints after ``error: `` (checked against the binary)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict

import pytest

import autopar
from conftest import GPT

PLAN: Dict[str, Any] = {"cluster": "dgx-h100", "gpus": 64, "global_batch": 512}


def raises(message: str) -> Any:
    """Expects ``autopar.Error`` with exactly ``message``."""
    return pytest.raises(autopar.Error, match=f"^{re.escape(message)}$")


def test_error_is_a_value_error_named_in_the_package() -> None:
    assert issubclass(autopar.Error, ValueError)
    assert autopar.Error.__module__ == "autopar"
    assert autopar.Error.__name__ == "Error"


def test_an_unknown_cluster() -> None:
    with raises(
        "unknown cluster preset 'dgx-h200' (presets: dgx-a100-80g, dgx-h100, hgx-h200, p3-v100, cpu; or give a .toml file)"
    ):
        autopar.plan(GPT, **{**PLAN, "cluster": "dgx-h200"})


def test_bad_specs() -> None:
    with raises("model spec 'gpx:layers=2': unknown model family 'gpx' (expected gpt, llama, moe or bert)"):
        autopar.plan("gpx:layers=2", **PLAN)
    with raises("model spec 'gpt:layers=2,hidden=7': gpt: missing required key 'heads'"):
        autopar.plan("gpt:layers=2,hidden=7", **PLAN)


def test_sizes_name_the_flag() -> None:
    with raises("--gpus must be at least 1"):
        autopar.plan(GPT, **{**PLAN, "gpus": 0})
    with raises("--global-batch must be at least 1"):
        autopar.plan(GPT, **{**PLAN, "global_batch": 0})
    with raises("--max-memory-fraction 1.5 must be in (0, 1]"):
        autopar.plan(GPT, **PLAN, max_memory_fraction=1.5)
    with raises("--gpus must be at least 1"):
        autopar.estimate(GPT, cluster="dgx-h100", gpus=0, global_batch=8)
    with raises("--gpus 8 is not divisible by tp·pp·cp = 3·1·1 = 3"):
        autopar.estimate(GPT, cluster="dgx-h100", gpus=8, global_batch=8, tp=3)


def test_keywords_say_what_is_allowed() -> None:
    with raises("unknown attention kernel 'slow' (expected fused, unfused)"):
        autopar.plan(GPT, **PLAN, attention="slow")
    with raises("unknown schedule 'zigzag' (expected gpipe, 1f1b, interleaved)"):
        autopar.estimate(GPT, cluster="dgx-h100", gpus=8, global_batch=8, schedule="zigzag")
    with pytest.raises(autopar.Error, match="^unknown gradient compression 'foo'"):
        autopar.estimate(GPT, cluster="dgx-h100", gpus=8, global_batch=8, grad_compression="foo")
    with raises("'-1' is not a capacity factor (a positive number, such as 1.25)"):
        autopar.plan(GPT, **PLAN, moe_capacity_factor=-1.0)


def test_estimate_needs_a_global_batch() -> None:
    with raises("--global-batch is required (or a --from file that gives it)"):
        autopar.estimate(GPT, cluster="dgx-h100", gpus=8)
    with raises("--from: unknown tool 'nemo' (expected megatron, torchtitan or deepspeed)"):
        autopar.estimate(GPT, cluster="dgx-h100", gpus=8, from_=("nemo", "x.yaml"))


def test_missing_files(tmp_path: Path) -> None:
    missing = tmp_path / "no.onnx"
    with raises(f"{missing}: No such file or directory (os error 2)"):
        autopar.plan(missing, **PLAN)
    plan_file = tmp_path / "plan.json"
    with raises(f"{plan_file}: cannot read: No such file or directory (os error 2)"):
        autopar.load_plan(plan_file)


def test_a_bad_plan_file_is_refused() -> None:
    with raises("'format' is 'x', expected 'autopar-plan'"):
        autopar.Plan.from_json('{"format": "x"}')


def test_python_type_mistakes_are_type_errors() -> None:
    with pytest.raises(TypeError, match="not int"):
        autopar.plan(3, **PLAN)
    with pytest.raises(TypeError, match="example_inputs"):
        autopar.plan(GPT, **PLAN, example_inputs=(1,))
