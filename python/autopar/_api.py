"""``autopar.plan`` and ``autopar.estimate``: the ``autopar plan`` and
``autopar estimate --json`` commands, with their flags as keyword arguments
and their defaults."""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Tuple, Union

from . import _native
from ._model import Model, resolve
from ._plan import PathArg, Plan


def plan(
    model: Model,
    *,
    cluster: str,
    gpus: int,
    global_batch: int,
    seq: Optional[int] = None,
    max_memory_fraction: float = 0.9,
    top: int = 5,
    attention: str = "fused",
    dropout: bool = False,
    moe_capacity_factor: Optional[float] = None,
    objective: Optional[str] = None,
    calibration: Optional[PathArg] = None,
    tp_comm_overlap: bool = False,
    allow_lossy_compression: bool = False,
    verify: int = _native.DEFAULT_VERIFY,
    example_inputs: Any = None,
    onnx_path: Optional[PathArg] = None,
    onnx_export_options: Optional[Dict[str, Any]] = None,
) -> Plan:
    """Searches for the fastest parallel plan of ``model`` that fits
    ``gpus`` GPUs of ``cluster`` (a preset such as ``dgx-h100`` or a
    cluster ``.toml`` file), as ``autopar plan`` does.

    ``model`` is an ``.onnx`` file, an autopar ``.json`` graph, a zoo spec
    (``'gpt:layers=24,hidden=2048,heads=16,vocab=51200,seq=2048,dtype=bf16'``)
    or a ``torch.nn.Module``, which is exported with ``torch.onnx.export``
    on ``example_inputs`` (``onnx_export_options`` are passed to it) to
    ``onnx_path``, or to a temporary file that lives as long as the plan
    (:attr:`Plan.onnx_path`).

    The other arguments are ``autopar plan``'s flags, with its defaults.
    Raises :class:`autopar.Error` with the command's message when autopar
    refuses the request.
    """
    model_file = resolve(model, example_inputs, onnx_path, onnx_export_options)
    native = _native.plan(
        model_file.arg,
        cluster=cluster,
        gpus=gpus,
        global_batch=global_batch,
        seq=seq,
        max_memory_fraction=max_memory_fraction,
        top=top,
        attention=attention,
        dropout=dropout,
        moe_capacity_factor=moe_capacity_factor,
        objective=objective,
        calibration=calibration,
        tp_comm_overlap=tp_comm_overlap,
        allow_lossy_compression=allow_lossy_compression,
        verify=verify,
    )
    return Plan(native, model_file if model_file.onnx_path else None)


def estimate(
    model: Model,
    *,
    cluster: str,
    gpus: int,
    tp: int = 1,
    pp: int = 1,
    dp: Optional[int] = None,
    virtual_stages: Optional[int] = None,
    sp: bool = False,
    cp: int = 1,
    ep: int = 1,
    zero: int = 0,
    global_batch: Optional[int] = None,
    from_: Optional[Tuple[str, PathArg]] = None,
    micro_batch: Optional[int] = None,
    seq: Optional[int] = None,
    recompute: str = "none",
    schedule: str = "1f1b",
    attention: str = "fused",
    dropout: bool = False,
    moe_capacity_factor: Optional[float] = None,
    objective: Optional[str] = None,
    overlap_grad_reduce: bool = False,
    grad_bucket_mib: int = _native.DEFAULT_BUCKET_MIB,
    tp_comm_overlap: bool = False,
    overlap_param_gather: bool = False,
    f32_main_grads: bool = False,
    f32_cross_entropy: bool = False,
    grad_compression: Optional[str] = None,
    mesh_order: str = "dp-inner",
    calibration: Optional[PathArg] = None,
    example_inputs: Any = None,
    onnx_export_options: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Step time, MFU and per-GPU memory of one training configuration, as
    the dict ``autopar estimate --json`` prints.

    ``model`` is as for :func:`plan` (a module's export is deleted after
    pricing). ``from_=(tool, file)`` is ``--from TOOL FILE``: a Megatron-LM,
    torchtitan or DeepSpeed configuration whose settings replace the
    arguments'. The other arguments are ``autopar estimate``'s flags, with
    its defaults; ``global_batch`` is required unless ``from_`` gives it.
    Raises :class:`autopar.Error` with the command's message when autopar
    refuses the request.
    """
    model_file = resolve(model, example_inputs, None, onnx_export_options)
    report = _native.estimate(
        model_file.arg,
        cluster=cluster,
        gpus=gpus,
        tp=tp,
        pp=pp,
        dp=dp,
        virtual_stages=virtual_stages,
        sp=sp,
        cp=cp,
        ep=ep,
        zero=zero,
        global_batch=global_batch,
        from_=from_,
        micro_batch=micro_batch,
        seq=seq,
        recompute=recompute,
        schedule=schedule,
        attention=attention,
        dropout=dropout,
        moe_capacity_factor=moe_capacity_factor,
        objective=objective,
        overlap_grad_reduce=overlap_grad_reduce,
        grad_bucket_mib=grad_bucket_mib,
        tp_comm_overlap=tp_comm_overlap,
        overlap_param_gather=overlap_param_gather,
        f32_main_grads=f32_main_grads,
        f32_cross_entropy=f32_cross_entropy,
        grad_compression=grad_compression,
        mesh_order=mesh_order,
        calibration=calibration,
    )
    parsed: Dict[str, Any] = json.loads(report)
    return parsed
