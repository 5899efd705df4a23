"""autopar from Python: plan the parallelism of a training job, explain it,
export it to Megatron-LM, torchtitan or DeepSpeed, and price one
configuration, with the same library (and the same messages) as the
``autopar`` command.

Arguments are the command's flags in Python spelling (``--global-batch`` is
``global_batch``) with the command's defaults; error messages are the
command's, so they name the flags (``--gpus must be at least 1``).
"""

from ._api import estimate, plan
from ._native import DEFAULT_BUCKET_MIB, DEFAULT_VERIFY, Error
from ._plan import ExportWarning, Plan, load_plan

__all__ = [
    "DEFAULT_BUCKET_MIB",
    "DEFAULT_VERIFY",
    "Error",
    "ExportWarning",
    "Plan",
    "estimate",
    "load_plan",
    "plan",
]
