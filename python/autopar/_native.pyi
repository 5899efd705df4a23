"""Types of the native module (the Rust side of the package)."""

import os
from typing import List, Optional, Tuple, Union

_Path = Union[str, "os.PathLike[str]"]

DEFAULT_VERIFY: int
DEFAULT_BUCKET_MIB: int

class Error(ValueError): ...

class Plan:
    @staticmethod
    def from_json(text: str) -> Plan: ...
    def to_json(self) -> str: ...
    def explain(self) -> str: ...
    def export(self, tool: str, path: Optional[_Path]) -> Tuple[str, List[str]]: ...
    def report(self, path: _Path) -> List[str]: ...
    def save(self, path: _Path) -> None: ...

def load_plan(path: _Path) -> Plan: ...
def plan(
    model: str,
    *,
    cluster: str,
    gpus: int,
    global_batch: int,
    seq: Optional[int],
    max_memory_fraction: float,
    top: int,
    attention: str,
    dropout: bool,
    moe_capacity_factor: Optional[float],
    objective: Optional[str],
    calibration: Optional[_Path],
    tp_comm_overlap: bool,
    allow_lossy_compression: bool,
    verify: int,
) -> Plan: ...
def estimate(
    model: str,
    *,
    cluster: str,
    gpus: int,
    tp: int,
    pp: int,
    dp: Optional[int],
    virtual_stages: Optional[int],
    sp: bool,
    cp: int,
    ep: int,
    zero: int,
    global_batch: Optional[int],
    from_: Optional[Tuple[str, _Path]],
    micro_batch: Optional[int],
    seq: Optional[int],
    recompute: str,
    schedule: str,
    attention: str,
    dropout: bool,
    moe_capacity_factor: Optional[float],
    objective: Optional[str],
    overlap_grad_reduce: bool,
    grad_bucket_mib: int,
    tp_comm_overlap: bool,
    overlap_param_gather: bool,
    f32_main_grads: bool,
    f32_cross_entropy: bool,
    grad_compression: Optional[str],
    mesh_order: str,
    calibration: Optional[_Path],
) -> str: ...
