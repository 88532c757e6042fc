"""tokamax's KDA kernels behind kda_lib's contract, and the TPU emulation that runs the Mosaic
kernel on CPU: the only folder that imports tokamax or ``jax._src``."""
