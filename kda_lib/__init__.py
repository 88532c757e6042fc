"""kda_lib: Kimi Delta Attention in JAX."""

from kda_lib.chunked import kda_chunked
from kda_lib.emulation import emulate_tpu
from kda_lib.gating import init_a_log, init_dt_bias, kda_gate
from kda_lib.kernel import kda
from kda_lib.layer import KDAConfig, KimiDeltaAttention
from kda_lib.reference import kda_recurrent, kda_step

__all__ = [
    "KDAConfig",
    "KimiDeltaAttention",
    "emulate_tpu",
    "init_a_log",
    "kda",
    "init_dt_bias",
    "kda_chunked",
    "kda_gate",
    "kda_recurrent",
    "kda_step",
]
