"""tokamax's KDA kernels behind kda_lib's contract: the only folder of the library that imports
tokamax or ``jax._src`` (the TPU emulation, kda_lib/lab/emulation.py, does too)."""
