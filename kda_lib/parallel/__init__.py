"""Context parallelism: the conv halo exchange, state passing between ranks, and ``shard_as``;
the one place with ``shard_map`` and ``ppermute``."""

from kda_lib.parallel.context_parallel import halo_exchange, kda_context_parallel, shard_as

__all__ = ["halo_exchange", "kda_context_parallel", "shard_as"]
