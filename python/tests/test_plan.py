"""``autopar.plan`` and the plan object: the same plan, JSON and text as
the ``autopar plan`` and ``explain`` commands."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict

import pytest

import autopar
from conftest import GPT, REPO


def stable(plan: Dict[str, Any]) -> Dict[str, Any]:
    """The plan with the run-dependent search time zeroed, as the CLI's
    snapshots record it."""
    plan["search"]["seconds"] = 0.0
    return plan


def assert_close(ours: Any, theirs: Any, path: str = "") -> None:
    """Equal values, floats to 1e-12: the snapshots went through a JSON
    parse that may move a float's last digit."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and ours.keys() == theirs.keys(), path
        for key in theirs:
            assert_close(ours[key], theirs[key], f"{path}.{key}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), path
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_close(a, b, f"{path}[{i}]")
    elif isinstance(theirs, float):
        assert ours == pytest.approx(theirs, rel=1e-12), path
    else:
        assert ours == theirs, path


def snapshot(name: str) -> Dict[str, Any]:
    """A plan the CLI wrote (`tests/plan_cli.rs` keeps these current)."""
    text = (REPO / "snapshots" / f"plan_cli__plan__{name}.snap").read_text()
    body = text.split("\n---\n", 1)[1]
    parsed: Dict[str, Any] = json.loads(body)
    return parsed


def test_the_issue_example_uses_all_64_gpus(zoo_plan: autopar.Plan) -> None:
    p = zoo_plan.parallel
    assert p["dp"] * p["tp"] * p["pp"] * p["cp"] == 64
    assert p["global_batch"] == 512
    plan = json.loads(zoo_plan.to_json())
    assert plan["format"] == "autopar-plan"
    assert plan["inputs"]["model"] == GPT
    assert plan["inputs"]["cluster"]["name"] == "dgx-h100"
    assert plan["parallel"] == p
    assert zoo_plan.onnx_path is None


@pytest.mark.parametrize(
    "name, model, cluster, gpus",
    [
        ("gpt2_tiny_h100x8", "fixtures/models/gpt2-tiny.dynamo.onnx", "dgx-h100", 8),
        ("llama_tiny_a100x4", "fixtures/models/llama-tiny.ts.onnx", "dgx-a100-80g", 4),
    ],
)
def test_to_json_is_what_the_cli_writes(in_repo: Path, name: str, model: str, cluster: str, gpus: int) -> None:
    plan = autopar.plan(model, cluster=cluster, gpus=gpus, global_batch=16, top=3)
    assert_close(stable(json.loads(plan.to_json())), snapshot(name))


@pytest.mark.skipif(not os.environ.get("AUTOPAR_BIN"), reason="AUTOPAR_BIN (an autopar binary) not set")
def test_to_json_is_byte_for_byte_the_cli_plan_file(in_repo: Path, tmp_path: Path) -> None:
    binary = os.environ["AUTOPAR_BIN"]
    assert shutil.which(binary), binary
    args = ["fixtures/models/gpt2-tiny.ts.onnx", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "32"]
    out = tmp_path / "plan.json"
    subprocess.run([binary, "plan", *args, "-o", str(out)], check=True, capture_output=True)
    cli = out.read_text()
    ours = autopar.plan(args[0], cluster="dgx-h100", gpus=8, global_batch=32).to_json()
    seconds = json.loads(cli)["search"]["seconds"]
    ours_seconds = json.loads(ours)["search"]["seconds"]
    assert ours.replace(f'"seconds": {ours_seconds!r}', "SECONDS") == cli.replace(
        f'"seconds": {seconds!r}', "SECONDS"
    )
    explained = subprocess.run([binary, "explain", str(out)], check=True, capture_output=True, text=True)
    assert autopar.load_plan(out).explain() == explained.stdout


def test_an_onnx_fixture_plans(in_repo: Path) -> None:
    model = "fixtures/models/gpt2-tiny.ts.onnx"
    plan = autopar.plan(model, cluster="dgx-h100", gpus=8, global_batch=16)
    p = plan.parallel
    assert p["dp"] * p["tp"] * p["pp"] * p["cp"] == 8
    assert plan.to_dict()["inputs"]["model"] == model
    assert plan.predicted["fits"]
    assert plan.onnx_path is None


def test_a_path_object_is_a_model(tmp_path: Path) -> None:
    model = REPO / "fixtures/models/gpt2-tiny.ts.onnx"
    plan = autopar.plan(model, cluster="dgx-h100", gpus=8, global_batch=16)
    assert plan.to_dict()["inputs"]["model"] == str(model)


def test_predicted_has_the_estimate_keys(zoo_plan: autopar.Plan) -> None:
    predicted = zoo_plan.predicted
    for key in ["step_time_s", "mfu", "hfu", "memory_per_gpu_bytes", "fits", "breakdown", "memory"]:
        assert key in predicted, key
    assert predicted["step_time_s"] > 0
    assert 0 < predicted["mfu"] < 1
    assert predicted["fits"] is True
    assert predicted == zoo_plan.to_dict()["predicted"]


def test_explain_shows_the_mesh(zoo_plan: autopar.Plan) -> None:
    text = zoo_plan.explain()
    axes = " × ".join(f"{a['name']} {a['size']}" for a in zoo_plan.to_dict()["mesh"]["axes"])
    assert f"mesh      {axes}" in text
    assert text.startswith(f"plan for {GPT}")
    assert "why this plan" in text or "no other configuration fits" in text


def test_save_load_and_from_json_round_trip(zoo_plan: autopar.Plan, tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    zoo_plan.save(path)
    assert path.read_text() == zoo_plan.to_json()
    assert zoo_plan.to_json().endswith("}\n")
    loaded = autopar.load_plan(path)
    assert loaded == zoo_plan
    assert loaded.to_json() == zoo_plan.to_json()
    assert autopar.Plan.from_json(zoo_plan.to_json()) == zoo_plan
    assert loaded.explain() == zoo_plan.explain()
    assert "dgx-h100" in repr(loaded)


def test_options_reach_the_search() -> None:
    plan = autopar.plan(GPT, cluster="dgx-h100", gpus=64, global_batch=512, top=2, verify=0, dropout=True)
    d = plan.to_dict()
    assert len(d["search"]["top"]) <= 2
    assert d["parallel"]["dropout"] is True
    assert "simulated_step_time_s" not in d
