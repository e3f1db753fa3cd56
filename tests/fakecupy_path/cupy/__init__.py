"""``import cupy`` -> the test-only fake (tests/fakecupy.py), in processes that have this folder
(``tests/fakecupy_path``) on ``PYTHONPATH``: the GPU code paths of an ``mpiexec`` run on a CPU."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/
import fakecupy

sys.modules[__name__] = fakecupy
