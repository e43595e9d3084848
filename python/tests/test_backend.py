"""Which tensors the package hands out, with and without torch."""

from __future__ import annotations

import numpy as np
from conftest import TORCH
from hyper_multicore import shmem


def test_tensors_are_torch_cpu_tensors_or_numpy_arrays(runtime):
    tensor = shmem.empty(2, 3)
    if TORCH:
        import torch

        assert shmem.backend() == "torch"
        assert isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu"
        assert tensor.dtype == torch.get_default_dtype()
    else:
        assert shmem.backend() == "numpy"
        assert isinstance(tensor, np.ndarray) and tensor.dtype == np.float32
        assert tensor.flags.writeable and tensor.flags.c_contiguous
    shmem.free(tensor)


def test_numpy_only_really_has_no_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        assert not TORCH
    else:
        assert TORCH
