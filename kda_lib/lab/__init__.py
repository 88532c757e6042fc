"""Experiments: tasks and corpus, training and generation, benchmarks, records, statistics, the
at-scale cost model, the TPU emulation (``kda_lib.emulate_tpu``) and the command lines
(``kda-bench``, ``kda-train``). Nothing in ops, parallel, layers or models imports this folder."""
