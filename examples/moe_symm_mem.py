"""A mixture-of-experts layer whose dispatch and combine are torch's symmetric-memory operators,
``torch.ops.symm_mem.all_to_all_vdev_2d`` and ``all_to_all_vdev_2d_offset``, on CPU tensors:
the program is written for ``torch.distributed._symmetric_memory`` and changed only in its
import. Every step is checked against the layer computed in one process.

Run it with either launcher (any number of PEs):

    hmrun -n 4 -- python examples/moe_symm_mem.py
    torchrun --nproc-per-node 4 examples/moe_symm_mem.py

Each PE owns ``--experts-per-rank`` experts (a small tanh MLP each) and ``--tokens`` tokens of
width ``--dim`` per step. A router picks one expert per token (top-1, with a gate weight);
global expert ``g`` lives on rank ``g // experts_per_rank``. One step:

1. dispatch -- sort the tokens by expert (so rank-major: the owner, then its expert) into the
   symmetric ``send`` buffer, count them per expert into ``send_splits``, and
   ``all_to_all_vdev_2d``: every rank receives, expert-major, the rows for its experts from
   every rank, with the rows and offsets of each chunk in ``dispatch_splits_offsets``;
2. expert -- apply each local expert to its rows (one contiguous range per expert), writing
   into ``results`` at the same places;
3. combine -- ``all_to_all_vdev_2d_offset`` with those same splits and offsets sends every
   chunk back to its source, which receives its rows rank-major: in its sorted order; unsort
   and scale by the gate.
"""

from __future__ import annotations

import argparse
import os
import time

import hyper_multicore.symm_mem as symm_mem  # instead of torch.distributed._symmetric_memory
import torch
import torch.distributed as dist


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=256, help="tokens per PE per step")
    parser.add_argument("--dim", type=int, default=64, help="token width")
    parser.add_argument("--experts-per-rank", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="timed steps (after 3 warm-up)")
    return parser.parse_args()


class Model:
    """Router and experts, identical on every PE (seeded)."""

    def __init__(self, experts: int, dim: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.router = torch.randn(dim, experts, generator=generator) / dim**0.5
        self.weights = torch.randn(experts, dim, dim, generator=generator) / dim**0.5
        self.biases = torch.randn(experts, dim, generator=generator) * 0.1

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-1 expert of each token and its gate weight."""
        gate, expert = torch.softmax(tokens @ self.router, dim=-1).max(dim=-1)
        return expert, gate

    def expert(self, index: int, tokens: torch.Tensor) -> torch.Tensor:
        return torch.tanh(tokens @ self.weights[index] + self.biases[index])

    def reference(self, tokens: torch.Tensor) -> torch.Tensor:
        """The layer in one process, without any communication."""
        expert, gate = self.route(tokens)
        out = torch.empty_like(tokens)
        for index in range(self.weights.shape[0]):
            rows = expert == index
            out[rows] = self.expert(index, tokens[rows])
        return out * gate[:, None]


def tokens_of(rank: int, step: int, count: int, dim: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(rank * 100_003 + step)
    return torch.randn(count, dim, generator=generator)


def main() -> None:
    args = parse()
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    torch.set_num_threads(1)  # several PEs share few cores
    ne, dim, count = args.experts_per_rank, args.dim, args.tokens
    experts = ne * world
    model = Model(experts, dim)
    group = "0"  # the world, as torch names it

    # Symmetric buffers, allocated once (collectively) and reused every step. A rank receives
    # at most every rank's tokens, plus one row of padding per empty expert.
    rows_in = count * world + ne
    send = symm_mem.empty(count, dim)
    send_splits = symm_mem.empty(experts, dtype=torch.int64)
    received = symm_mem.empty(rows_in, dim)
    dispatch_splits_offsets = symm_mem.empty(2, experts, dtype=torch.int64)
    results = symm_mem.empty(rows_in, dim)
    returned = symm_mem.empty(count, dim)
    combine_splits_offsets = symm_mem.empty(2, experts, dtype=torch.int64)

    times = []
    for step in range(3 + args.steps):
        tokens = tokens_of(rank, step, count, dim)
        started = time.perf_counter()
        expert, gate = model.route(tokens)
        order = torch.argsort(expert, stable=True)
        send.copy_(tokens[order])
        send_splits.copy_(torch.bincount(expert, minlength=experts))
        torch.ops.symm_mem.all_to_all_vdev_2d(
            send, received, send_splits, dispatch_splits_offsets, group
        )
        splits, offsets = dispatch_splits_offsets.tolist()
        for e in range(ne):
            first = e * world
            start, rows = offsets[first], sum(splits[first : first + world])
            chunk = slice(start, start + rows)
            results[chunk] = model.expert(rank * ne + e, received[chunk])
        torch.ops.symm_mem.all_to_all_vdev_2d_offset(
            results, returned, dispatch_splits_offsets, combine_splits_offsets, group
        )
        output = torch.empty_like(tokens)
        output[order] = returned
        output *= gate[:, None]
        if step >= 3:
            times.append(time.perf_counter() - started)
        expected = model.reference(tokens)
        if not torch.allclose(output, expected, atol=1e-5, rtol=1e-5):
            worst = (output - expected).abs().max().item()
            raise SystemExit(f"rank {rank}, step {step}: output differs by {worst}")
    times.sort()
    if rank == 0:
        print(
            f"moe_symm_mem: {world} PEs, {count} tokens x {dim} per PE, {experts} experts: "
            f"{args.steps} steps checked, median {times[len(times) // 2] * 1e3:.2f} ms per step"
        )
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
