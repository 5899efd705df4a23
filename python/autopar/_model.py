"""The model argument: an ONNX path, a zoo spec, or a ``torch.nn.Module``
exported to ONNX for the library to read."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import weakref
from typing import Any, Dict, Optional, Tuple, Union

#: What ``plan`` and ``estimate`` take as the model: an ``.onnx`` file or an
#: autopar ``.json`` graph (a path), a zoo spec
#: (``'gpt:layers=24,hidden=2048,...'``), or a ``torch.nn.Module``.
Model = Union[str, "os.PathLike[str]", Any]


class ModelFile:
    """The model as the library takes it (a path or a spec) and, for a
    module, where its export is. A temporary export is deleted with this
    object, so whatever refers to the file (a plan records its path) keeps
    this object."""

    def __init__(self, arg: str, onnx_path: Optional[str] = None, folder: Optional[str] = None) -> None:
        self.arg = arg
        self.onnx_path = onnx_path
        if folder is not None:
            weakref.finalize(self, shutil.rmtree, folder, ignore_errors=True)


def resolve(
    model: Model,
    example_inputs: Any,
    onnx_path: Optional[Union[str, "os.PathLike[str]"]],
    onnx_export_options: Optional[Dict[str, Any]],
) -> ModelFile:
    """Turns ``model`` into the argument the library reads, exporting a
    ``torch.nn.Module`` to ``onnx_path`` (default: a temporary folder that
    lives as long as the returned object)."""
    if isinstance(model, (str, os.PathLike)):
        if example_inputs is not None:
            raise TypeError("example_inputs is for a torch.nn.Module model, not a path or spec")
        return ModelFile(os.fspath(model))
    # A module can only exist once torch is imported, so torch is not
    # imported here for path and spec models.
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"model must be an ONNX path, a zoo spec or a torch.nn.Module, not {type(model).__name__}"
        )
    if example_inputs is None:
        raise TypeError("a torch.nn.Module model needs example_inputs (the arguments of one forward call)")
    if onnx_path is not None:
        path = os.fspath(onnx_path)
        export_onnx(model, example_inputs, path, onnx_export_options or {})
        return ModelFile(path, path)
    folder = tempfile.mkdtemp(prefix="autopar-")
    path = os.path.join(folder, "model.onnx")
    try:
        export_onnx(model, example_inputs, path, onnx_export_options or {})
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return ModelFile(path, path, folder)


def export_onnx(module: Any, example_inputs: Any, path: str, options: Dict[str, Any]) -> None:
    """Exports ``module`` called on ``example_inputs`` with
    ``torch.onnx.export``, with its default exporter; where that is the
    dynamo exporter and its ``onnxscript`` is not installed, with the
    TorchScript exporter instead (autopar reads either's output)."""
    torch = importlib.import_module("torch")
    # Either exporter writes the file with the onnx package; torch does not require it.
    if importlib.util.find_spec("onnx") is None:
        raise ImportError(
            "exporting a torch.nn.Module needs the onnx package (pip install onnx; "
            "torch's default dynamo exporter also needs onnxscript)"
        )
    args: Tuple[Any, ...]
    if isinstance(example_inputs, tuple):
        args = example_inputs
    elif isinstance(example_inputs, list):
        args = tuple(example_inputs)
    else:
        args = (example_inputs,)
    try:
        torch.onnx.export(module, args, path, **options)
    except ImportError:
        if "dynamo" in options:
            raise
        torch.onnx.export(module, args, path, dynamo=False, **options)
