"""Hides torch from every Python process started with this directory on ``PYTHONPATH``, so the
suite exercises the NumPy-only path (as if torch were not installed)."""

import sys

sys.modules["torch"] = None  # `import torch` now raises ImportError
