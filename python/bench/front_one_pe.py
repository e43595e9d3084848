"""The Python front's own cost per small call, on one PE (no peer to be scheduled): ``put`` and
``get`` of 8 B, ``signal``, ``put_signal``, ``wait_signal`` already satisfied, two atomics, and
an ``empty`` + ``free`` pair, each as the min over 5 batches of 20000 calls (torch CPU tensors).
``python python/bench/front_one_pe.py``; see ``front.py`` for 2 PEs, against the Rust API."""

from __future__ import annotations

import timeit

import torch
from hyper_multicore import shmem


def main() -> None:
    shmem.acquire(heap_size_bytes=64 << 20)
    me = shmem.my_pe()
    dst, src = shmem.empty(2, dtype=torch.float32), torch.ones(2)
    word = shmem.empty(1, dtype=torch.int64)
    word.zero_()

    def empty_free() -> None:
        shmem.free(shmem.empty(2, dtype=torch.float32))

    rows = {
        "put": lambda: shmem.put(dst, src, me),
        "get": lambda: shmem.get(src, dst, me),
        "signal": lambda: shmem.signal(word, 0, me),
        "put_signal": lambda: shmem.put_signal(dst, src, word, 0, me),
        "wait_signal": lambda: shmem.wait_signal(word, 0),
        "atomic_fetch_add": lambda: shmem.atomic_fetch_add(word, 0, me),
        "atomic_set": lambda: shmem.atomic_set(word, 0, me),
        "empty_free": empty_free,
    }
    for name, call in rows.items():
        calls = 20000
        best = min(timeit.repeat(call, number=calls, repeat=5)) / calls
        print(f"{name:16s} {best * 1e6:6.2f} us")
    shmem.free(word)
    shmem.free(dst)
    shmem.release()


if __name__ == "__main__":
    main()
