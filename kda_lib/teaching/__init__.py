"""What the notebooks use and nothing else does: the installer, setup, figures, explanations and
exercise checkers. Nothing in ops, parallel, layers, models or lab imports this folder."""
