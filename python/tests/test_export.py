"""``Plan.export``: the three tools' configurations, as ``autopar export``
writes them, with what a tool cannot express as warnings."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import autopar


@pytest.mark.parametrize("tool", ["megatron", "torchtitan", "deepspeed"])
def test_each_tool_gets_the_plan_and_the_file_is_the_text(
    zoo_plan: autopar.Plan, tool: str, tmp_path: Path
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", autopar.ExportWarning)
        text = zoo_plan.export(tool)
        path = tmp_path / "exported"
        assert zoo_plan.export(tool, path) == text
    assert path.read_text() == text
    assert "written by `autopar export`" in text
    p = zoo_plan.parallel
    if tool == "megatron":
        assert f"--tensor-model-parallel-size {p['tp']}" in text
        assert f"--global-batch-size {p['global_batch']}" in text
    elif tool == "torchtitan":
        assert f"tensor_parallel_degree = {p['tp']}" in text
    else:
        assert json.loads(text)["train_batch_size"] == p["global_batch"]


def test_what_a_tool_cannot_express_is_warned(zoo_plan: autopar.Plan) -> None:
    caveats = zoo_plan.caveats("megatron")
    # The plan shards weights (ZeRO-3), which Megatron-LM's distributed optimizer does not.
    assert zoo_plan.parallel["zero"] == 3 and caveats
    with pytest.warns(autopar.ExportWarning) as record:
        zoo_plan.export("megatron")
    assert [str(w.message) for w in record] == [f"not expressible: {c}" for c in caveats]


def test_an_unknown_tool_is_an_error(zoo_plan: autopar.Plan) -> None:
    with pytest.raises(autopar.Error, match=r"^unknown tool 'nemo' \(expected megatron, torchtitan or deepspeed\)$"):
        zoo_plan.export("nemo")


def test_a_missing_folder_is_the_cli_error(zoo_plan: autopar.Plan, tmp_path: Path) -> None:
    path = tmp_path / "no" / "ds_config.json"
    with pytest.raises(autopar.Error) as e:
        zoo_plan.export("deepspeed", path)
    assert str(e.value) == f"{path}: folder {path.parent} does not exist"
