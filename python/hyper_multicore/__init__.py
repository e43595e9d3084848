"""hyper_multicore: a symmetric-memory (SHMEM) runtime with a managed, collective lifecycle.

The Python front is :mod:`hyper_multicore.shmem` (PyTorch CPU tensors, or NumPy arrays where
torch is not installed, that view the symmetric heap without copies). The runtime itself is the
Rust library, loaded as the extension module ``hyper_multicore._native``. Importing this package
does not import torch; importing :mod:`hyper_multicore.shmem` does, if it is installed.

    from hyper_multicore import shmem
    shmem.acquire(heap_size_bytes=64 << 20)
"""

from ._native import __version__

__all__ = ["__version__"]
