"""KDA on arrays ``[B, T, H, K]``, batch first: the forms, their contract and the entry point.
Their public names are ``kda_lib``'s (``kda_lib/__init__.py``).

No Flax, no mesh. Only ``ops/tokamax/`` imports tokamax or private JAX.
"""
