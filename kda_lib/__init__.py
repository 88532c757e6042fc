"""kda_lib: Kimi Delta Attention in JAX."""

import importlib

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


def __getattr__(name: str):
    # `import kda_lib` then `kda_lib.notebook.setup()`: the notebook helpers load on first use
    # (they are not imported eagerly: the core stays free of plotting packages)
    if name == "notebook":
        return importlib.import_module("kda_lib.notebook")
    raise AttributeError(f"module 'kda_lib' has no attribute {name!r}")
