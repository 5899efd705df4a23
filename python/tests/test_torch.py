"""A ``torch.nn.Module`` model: exported with ``torch.onnx.export`` (its
default exporter, or TorchScript's where the dynamo exporter's onnxscript
is missing; either writes with the onnx package) and planned from the
file, which lives as long as the plan."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import pytest

import autopar

torch = pytest.importorskip("torch")
# Both of torch's exporters write the file with the onnx package.
pytest.importorskip("onnx")


def mlp() -> Any:
    """A small MLP: two linear layers around a GELU."""
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))


def test_a_module_is_exported_and_planned(tmp_path: Path) -> None:
    x = torch.randn(8, 64)
    plan = autopar.plan(mlp(), example_inputs=(x,), cluster="dgx-h100", gpus=8, global_batch=64)
    path = plan.onnx_path
    assert path is not None and path.endswith(".onnx") and os.path.isfile(path)
    assert plan.to_dict()["inputs"]["model"] == path
    p = plan.parallel
    assert p["dp"] * p["tp"] * p["pp"] * p["cp"] == 8
    assert "mesh" in plan.explain()
    # The report simulates the plan, reading the export: it is all there.
    assert plan.report(tmp_path / "report.html") == []
    # The temporary export goes with the plan.
    del plan
    gc.collect()
    assert not os.path.exists(path)


def test_a_module_exports_where_asked_and_estimates(tmp_path: Path) -> None:
    x = torch.randn(8, 64)
    target = tmp_path / "mlp.onnx"
    plan = autopar.plan(mlp(), example_inputs=x, onnx_path=target, cluster="cpu", gpus=2, global_batch=16)
    assert plan.onnx_path == str(target) and target.is_file()
    report = autopar.estimate(mlp(), example_inputs=(x,), cluster="cpu", gpus=2, global_batch=16)
    assert report["step_time_s"] > 0


def test_a_module_needs_example_inputs() -> None:
    with pytest.raises(TypeError, match="example_inputs"):
        autopar.plan(mlp(), cluster="dgx-h100", gpus=8, global_batch=64)
