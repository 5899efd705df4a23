"""The plan object: a plan file in memory, with ``autopar explain``,
``export`` and ``report`` on it."""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, Dict, List, Optional, Union

from . import _native
from ._model import ModelFile

PathArg = Union[str, "os.PathLike[str]"]


class ExportWarning(UserWarning):
    """Something of a plan the target tool cannot express (``autopar
    export``'s notes); the closest configuration the tool has is written."""


class Plan:
    """A parallel plan: the contents of the plan file ``autopar plan``
    writes. Made by :func:`autopar.plan`, :func:`autopar.load_plan` or
    :meth:`Plan.from_json`."""

    def __init__(self, native: _native.Plan, model: Optional[ModelFile] = None) -> None:
        self._native = native
        # Keeps a torch module's ONNX export alive as long as the plan.
        self._model = model

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        """Reads a plan file's text."""
        return cls(_native.Plan.from_json(text))

    @property
    def onnx_path(self) -> Optional[str]:
        """Where the ONNX export of a ``torch.nn.Module`` model is (the
        plan's ``inputs.model``); ``None`` for path and spec models. A
        temporary file lives as long as this object: pass ``onnx_path=`` to
        :func:`autopar.plan` to keep it for later (``autopar run``)."""
        return self._model.onnx_path if self._model else None

    def to_json(self) -> str:
        """The plan file's text, exactly as ``autopar plan -o`` writes it."""
        return self._native.to_json()

    def to_dict(self) -> Dict[str, Any]:
        """The plan file as a new dict."""
        parsed: Dict[str, Any] = json.loads(self.to_json())
        return parsed

    @property
    def parallel(self) -> Dict[str, Any]:
        """The parallel degrees and knobs (``dp``, ``tp``, ``pp``, ``zero``, ...)."""
        parallel: Dict[str, Any] = self.to_dict()["parallel"]
        return parallel

    @property
    def predicted(self) -> Dict[str, Any]:
        """The plan's predicted estimate: ``step_time_s``, ``mfu``,
        ``memory_per_gpu_bytes``, breakdowns, ..."""
        predicted: Dict[str, Any] = self.to_dict()["predicted"]
        return predicted

    def explain(self) -> str:
        """The plan for people, as ``autopar explain`` prints it."""
        return self._native.explain()

    def export(self, tool: str, path: Optional[PathArg] = None) -> str:
        """The plan as ``tool``'s configuration (``megatron``: Megatron-LM
        arguments, ``torchtitan``: a job TOML, ``deepspeed``: a
        ``ds_config.json``); also written to ``path`` when given. What the
        tool cannot express comes as an :class:`ExportWarning` each (see
        :meth:`caveats`)."""
        text, caveats = self._native.export(tool, path)
        for caveat in caveats:
            warnings.warn(f"not expressible: {caveat}", ExportWarning, stacklevel=2)
        return text

    def caveats(self, tool: str) -> List[str]:
        """What ``tool`` cannot express of the plan, each with what its
        export writes instead."""
        return self._native.export(tool, None)[1]

    def report(self, path: PathArg) -> List[str]:
        """Writes the plan as one self-contained HTML page, as ``autopar
        report`` does: the mesh, stage map, memory, where a step's time goes,
        the simulated timeline and the ranking. Returns what the page could
        not show, and why (the simulation needs the plan's model: a file
        that has gone leaves it out); empty when the page is complete."""
        return self._native.report(path)

    def save(self, path: PathArg) -> None:
        """Writes the plan file (what :meth:`to_json` returns)."""
        self._native.save(path)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Plan) and self._native == other._native

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        plan = self.to_dict()
        p = plan["parallel"]
        return (
            f"<autopar.Plan {plan['inputs']['model']!r} on {len(plan['mesh']['ranks'])} GPUs of "
            f"{plan['inputs']['cluster']['name']}: dp {p['dp']} tp {p['tp']} pp {p['pp']} cp {p['cp']} "
            f"ep {p['ep']}, step {plan['predicted']['step_time_s']:.4g} s>"
        )


def load_plan(path: PathArg) -> Plan:
    """Reads a plan file (written by ``autopar plan`` or :meth:`Plan.save`)."""
    return Plan(_native.load_plan(path))
