"""What the notebooks use and nothing else does: the installer, setup, figures, explanations and
exercise checkers. Nothing in ops, parallel, layers, models or lab imports this folder.
``notebook`` is imported here, so ``import kda_lib`` then ``kda_lib.teaching.notebook.setup()``
works (the README's first cell)."""

from kda_lib.teaching import notebook as notebook
