"""``import kda_lib`` loads the library only: ``lab`` (the TPU emulation) and ``teaching`` load
on first use, ``kda_lib.teaching.notebook.setup()`` is reachable after ``import kda_lib`` alone
(README; issue 55, finding 11)."""

import os
import subprocess
import sys

import pytest


def test_import_kda_lib_loads_no_lab_and_reaches_teaching():
    code = (
        "import sys, kda_lib; print(sorted(m for m in sys.modules if m.startswith(('kda_lib.lab', "
        "'kda_lib.teaching')))); print(callable(kda_lib.teaching.notebook.setup))"
    )
    env = {k: v for k, v in os.environ.items() if k != "KDA_EMULATE_TPU"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[]", "True"]


@pytest.mark.parametrize("flag", ["style", "on_host"])
def test_setup_refuses_a_flag_that_is_not_a_bool_before_changing_anything(flag):
    import jax

    from kda_lib.teaching import notebook

    before = jax.config.jax_default_matmul_precision
    with pytest.raises(ValueError, match=f"{flag} must be a bool"):
        notebook.setup(**{flag: "yes"})
    assert jax.config.jax_default_matmul_precision == before


@pytest.mark.parametrize("backend", ["cpu", "gpu", "tpu"])
def test_setup_asks_for_float32_matmuls_and_the_host_when_told(monkeypatch, capsys, backend):
    """On every backend (its name patched in) ``setup`` asks for float32's matmul precision and
    says so off a CPU; ``on_host=True`` puts new arrays on the CPU and says so (restored)."""
    import jax

    from kda_lib.teaching import notebook

    names = ("jax_default_matmul_precision", "jax_default_device", "jax_threefry_partitionable")
    before = {n: getattr(jax.config, n) for n in names}
    try:
        monkeypatch.setattr(jax, "default_backend", lambda: backend)
        notebook.setup(style=False, on_host=True)
        line = capsys.readouterr().out
        assert jax.config.jax_default_matmul_precision == "highest"
        assert jax.config.jax_default_device == jax.devices("cpu")[0]
        assert jax.numpy.ones(2).devices() == {jax.devices("cpu")[0]}
        assert ("float32 matmuls: highest" in line) == (backend != "cpu")
        assert "this page on the host's CPU" in line
    finally:
        for name, value in before.items():
            jax.config.update(name, value)
