"""kda_lib: Kimi Delta Attention in JAX.

The tree shows the architecture (docs/DESIGN.md): ``ops`` < ``parallel`` < ``layers`` <
``models`` are the library; ``lab`` (experiments) and ``teaching`` (notebook helpers) sit on top.
"""

import importlib

from kda_lib.lab.emulation import emulate_tpu
from kda_lib.layers.kda_layer import KDAConfig, KimiDeltaAttention
from kda_lib.ops.api import kda
from kda_lib.ops.chunked import kda_chunked
from kda_lib.ops.gating import GateForm, init_a_log, init_dt_bias, kda_gate
from kda_lib.ops.reference import kda_pool_step, kda_pool_verify, kda_recurrent, kda_step

__all__ = [
    "GateForm",
    "KDAConfig",
    "KimiDeltaAttention",
    "emulate_tpu",
    "init_a_log",
    "init_dt_bias",
    "kda",
    "kda_chunked",
    "kda_gate",
    "kda_pool_step",
    "kda_pool_verify",
    "kda_recurrent",
    "kda_step",
]


def __getattr__(name: str):
    # `import kda_lib` then `kda_lib.teaching.notebook.setup()`: the teaching folder loads on
    # first use (the core stays free of plotting packages; lab/ is loaded for emulate_tpu)
    if name == "teaching":
        return importlib.import_module(f"kda_lib.{name}")
    raise AttributeError(f"module 'kda_lib' has no attribute {name!r}")
