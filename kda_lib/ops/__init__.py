"""KDA on arrays ``[B, T, H, K]``: the forms, their contract and the entry point (public names:
``kda_lib``'s). No Flax, no mesh; only ``ops/tokamax/`` imports tokamax or private JAX."""
