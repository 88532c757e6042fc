"""``import kda_lib`` loads the library only: ``lab`` (the TPU emulation) and ``teaching`` load
on first use, ``kda_lib.teaching.notebook.setup()`` is reachable after ``import kda_lib`` alone
(README; issue 55, finding 11)."""

import os
import subprocess
import sys


def test_import_kda_lib_loads_no_lab_and_reaches_teaching():
    code = (
        "import sys, kda_lib; print(sorted(m for m in sys.modules if m.startswith(('kda_lib.lab', "
        "'kda_lib.teaching')))); print(callable(kda_lib.teaching.notebook.setup))"
    )
    env = {k: v for k, v in os.environ.items() if k != "KDA_EMULATE_TPU"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[]", "True"]
