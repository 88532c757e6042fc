"""``import kda_lib`` is enough for ``kda_lib.teaching.notebook.setup()`` (README; issue 55,
finding 11)."""

import subprocess
import sys


def test_notebook_setup_is_reachable_after_import_kda_lib_alone():
    code = "import kda_lib; print(callable(kda_lib.teaching.notebook.setup))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"
