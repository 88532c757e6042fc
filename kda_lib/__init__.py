"""kda_lib: Kimi Delta Attention in JAX.

The tree shows the architecture (docs/DESIGN.md): ``ops`` < ``parallel`` < ``layers`` <
``models`` are the library; ``lab`` (experiments) and ``teaching`` (notebook helpers) sit on top
and load on first use.
"""

import importlib
import os

from kda_lib.layers.kda_layer import KDAConfig, KimiDeltaAttention
from kda_lib.ops.api import kda, kda_chunked, kda_recurrent
from kda_lib.ops.gating import GateForm, init_a_log, init_dt_bias, kda_gate
from kda_lib.ops.reference import kda_pool_step, kda_pool_verify, kda_step

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
    # `kda_lib.emulate_tpu` and `kda_lib.teaching` load lab/ and teaching/ on first use
    if name == "emulate_tpu":
        return importlib.import_module("kda_lib.lab.emulation").emulate_tpu
    if name == "teaching":
        return importlib.import_module(f"kda_lib.{name}")
    raise AttributeError(f"module 'kda_lib' has no attribute {name!r}")


def __dir__():  # the lazy names too (tab completion)
    return sorted({*globals(), *__all__})


if os.environ.get("KDA_EMULATE_TPU"):  # the process-wide emulation (kda_lib/lab/emulation.py)
    importlib.import_module("kda_lib.lab.emulation")
