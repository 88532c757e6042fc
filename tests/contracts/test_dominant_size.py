"""A memory refusal names the size behind most of the bytes, not the largest number (round-6
review: a 1,024-layer model of width 1,024 was refused naming vocab_size=2000, about 0.04% of
its parameters; kda-train blamed --vocab-size for 4% of them)."""

import pytest
from flax import nnx

from kda_lib import KDAConfig, checks
from kda_lib.lab import train_cli
from kda_lib.models.tiny_lm import ModelConfig, TinyLM

GIB = 2**30


@pytest.fixture
def eight_gib(monkeypatch):
    """Every memory check against 8 GiB, whatever this machine has."""
    monkeypatch.setattr(checks, "memory_limit", lambda: 8 * GIB)


def test_dominant_size_is_the_factor_whose_removal_saves_most():
    nbytes = lambda s: 4 * s["vocab"] * s["hidden"] + s["layers"] * s["hidden"] ** 2  # noqa: E731
    assert checks.dominant_size(dict(vocab=2000, hidden=1024, layers=1024), nbytes) == "hidden"
    assert checks.dominant_size(dict(vocab=10**9, hidden=8, layers=2), nbytes) == "vocab"

    def no_one_layer(s):
        if s["layers"] == 1:
            raise ValueError("layers must be even")
        return nbytes(s)

    assert checks.dominant_size(dict(vocab=8, hidden=2, layers=10**9), no_one_layer) == "hidden"


def test_tiny_lm_and_kda_train_name_a_size_that_drives_the_bytes(eight_gib, capsys):
    mixer = KDAConfig(hidden_size=1024, num_heads=8, head_dim=128)
    with pytest.raises(ValueError, match=r"^ModelConfig\.num_layers=1024: the parameters"):
        TinyLM(ModelConfig(vocab_size=2000, num_layers=1024, mixer_config=mixer),
               rngs=nnx.Rngs(0))  # fmt: skip
    with pytest.raises(ValueError, match=r"^ModelConfig\.vocab_size=50000000: the parameters"):
        TinyLM(ModelConfig(vocab_size=50_000_000, num_layers=2, mixer_config=mixer),
               rngs=nnx.Rngs(0))  # fmt: skip
    with pytest.raises(SystemExit):
        train_cli.main(["mqar", "--vocab-size", "100000", "--num-layers", "1024",
                        "--hidden-size", "1024"])  # fmt: skip
    assert "error: --hidden-size 1024 (with --vocab-size 100000" in capsys.readouterr().err
