"""tokamax's KDA kernels behind kda_lib's contract: the one importer of tokamax and jax._src."""
