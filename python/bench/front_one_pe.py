"""The Python front's own cost per small call, on one PE (no peer to be scheduled): ``put`` and
``get`` of 8 B, ``signal``, and ``wait_signal`` already satisfied, each as the min over 5 batches
of 20000 calls, next to the bare native ``put``/``signal`` with pre-resolved arguments (the floor
the front adds to). ``python python/bench/front_one_pe.py``; see ``front.py`` for 2 PEs."""

from __future__ import annotations

import timeit

import torch
from hyper_multicore import _native, shmem
from hyper_multicore.shmem._registry import _local, _region


def main() -> None:
    shmem.acquire(heap_size_bytes=64 << 20)
    me = shmem.my_pe()
    dst, src = shmem.empty(2, dtype=torch.float32), torch.ones(2)
    word = shmem.empty(1, dtype=torch.int64)
    word.zero_()
    region, local, signal_region = _region(dst, "dst"), _local(src, "src").arg, _region(word, "w")
    rows = {
        "put": lambda: shmem.put(dst, src, me),
        "get": lambda: shmem.get(src, dst, me),
        "signal": lambda: shmem.signal(word, 0, me),
        "wait_signal": lambda: shmem.wait_signal(word, 0),
        "native put": lambda: _native.put(region, local, me),
        "native signal": lambda: _native.signal(signal_region, "int64", 0, "set", me),
    }
    for name, call in rows.items():
        calls = 20000
        best = min(timeit.repeat(call, number=calls, repeat=5)) / calls
        print(f"{name:14s} {best * 1e6:6.2f} us")
    shmem.free(word)
    shmem.free(dst)
    shmem.release()


if __name__ == "__main__":
    main()
