"""KDA on arrays ``[B, T, H, K]``, batch first: the forms, their contract and the entry point.

No Flax, no mesh. Only ``ops/tokamax/`` imports tokamax or private JAX.
"""

from kda_lib.ops.api import kda
from kda_lib.ops.chunked import kda_chunked
from kda_lib.ops.gating import GateForm, init_a_log, init_dt_bias, kda_gate
from kda_lib.ops.norms import l2_normalize
from kda_lib.ops.reference import kda_pool_step, kda_pool_verify, kda_recurrent, kda_step

__all__ = [
    "GateForm",
    "init_a_log",
    "init_dt_bias",
    "kda",
    "kda_chunked",
    "kda_gate",
    "kda_pool_step",
    "kda_pool_verify",
    "kda_recurrent",
    "kda_step",
    "l2_normalize",
]
