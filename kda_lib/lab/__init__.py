"""Experiments: tasks and corpus, training and generation, benchmarks, records, statistics, the
at-scale cost model, and the command lines (``kda-bench``, ``kda-train``). Nothing in ops,
parallel, layers or models imports this folder."""
