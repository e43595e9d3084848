"""A toy mixture-of-experts layer over symmetric memory: dispatch tokens to the ranks that own
their experts with put + signal, apply the experts there, combine the results back, and check
everything against a single-process reference.

Run it on 4 PEs with either launcher:

    hmrun -n 4 -- python examples/moe_dispatch_combine.py
    torchrun --nproc-per-node 4 examples/moe_dispatch_combine.py --gloo

Each PE owns ``--experts-per-rank`` experts (a small tanh MLP each) and ``--tokens`` tokens of
width ``--dim``. A router picks one expert per token (top-1, with a gate weight). One step:

1. dispatch -- for every destination PE, put the tokens routed to its experts into the
   destination's receive slot for this source (``inbox[me]``), put their expert ids, then
   signal ``dispatch_signal[me]`` on the destination with (step, count);
2. expert -- wait for every source's signal, apply the local experts to what arrived;
3. combine -- put the outputs back into the source's ``outbox[me]`` and signal it; the source
   waits for every owner, scatters the rows back into token order and scales them by the gate.

No barrier is needed between steps: a source writes a destination's inbox for step s+1 only after
it received that destination's outputs for step s, which the destination sends after reading its
inbox. Signal words are 64 bytes apart (one row of 8 int64 each) so concurrent writers never
share a cache line.
"""

from __future__ import annotations

import argparse
import time

import torch
from hyper_multicore import shmem


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=256, help="tokens per PE per step")
    parser.add_argument("--dim", type=int, default=64, help="token width")
    parser.add_argument("--experts-per-rank", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="timed steps (after 3 warm-up)")
    parser.add_argument(
        "--gloo",
        action="store_true",
        help="initialise torch.distributed (gloo) and use its WORLD as the root",
    )
    return parser.parse_args()


class Model:
    """Router and experts, identical on every PE (seeded)."""

    def __init__(self, experts: int, dim: int) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.router = torch.randn(dim, experts, generator=generator) / dim**0.5
        self.weights = torch.randn(experts, dim, dim, generator=generator) / dim**0.5
        self.biases = torch.randn(experts, dim, generator=generator) * 0.1

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-1 expert of each token and its gate weight."""
        probabilities = torch.softmax(tokens @ self.router, dim=-1)
        gate, expert = probabilities.max(dim=-1)
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
    """This PE's input for one step (any process can recompute it: the reference does)."""
    generator = torch.Generator().manual_seed(rank * 100_003 + step)
    return torch.randn(count, dim, generator=generator)


def encode(step: int, count: int) -> int:
    return (step + 1) << 32 | count  # never 0, so a fresh (zeroed) signal never matches


def main() -> None:
    args = parse()
    # Several PEs share few cores here: torch's own thread pool would only oversubscribe them.
    torch.set_num_threads(1)
    if args.gloo:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    shmem.acquire(heap_size_bytes=64 << 20)
    me, pes = shmem.my_pe(), shmem.n_pes()
    per_rank, tokens, dim = args.experts_per_rank, args.tokens, args.dim
    model = Model(per_rank * pes, dim)

    # Symmetric buffers: one receive slot per source PE, sized for the worst case.
    inbox = shmem.empty(pes, tokens, dim, dtype=torch.float32)
    inbox_experts = shmem.empty(pes, tokens, dtype=torch.int64)
    outbox = shmem.empty(pes, tokens, dim, dtype=torch.float32)
    dispatch_signal = shmem.empty(pes, 8, dtype=torch.int64)
    combine_signal = shmem.empty(pes, 8, dtype=torch.int64)
    dispatch_signal.zero_()
    combine_signal.zero_()
    shmem.barrier()  # every slot is initialised before any peer writes into it

    def step(index: int) -> torch.Tensor:
        x = tokens_of(me, index, tokens, dim)
        expert, gate = model.route(x)
        owner = expert // per_rank
        sent = []
        # 1. dispatch
        for pe in range(pes):
            rows = (owner == pe).nonzero().flatten()
            count = rows.numel()
            sent.append(rows)
            if count:
                shmem.put(inbox[me, :count], x[rows].contiguous(), pe)
                shmem.put(inbox_experts[me, :count], expert[rows].contiguous(), pe)
            shmem.signal(dispatch_signal[me, 0:1], encode(index, count), pe)
        # 2. experts, for every source
        for source in range(pes):
            word = shmem.wait_signal(
                dispatch_signal[source, 0:1], encode(index, 0), comparison="ge"
            )
            count = word & 0xFFFFFFFF
            if count:
                received = inbox[source, :count]
                ids = inbox_experts[source, :count]
                result = torch.empty_like(received)
                for local in ids.unique().tolist():
                    rows = ids == local
                    result[rows] = model.expert(local, received[rows])
                # 3. combine: the outputs go back to the source
                shmem.put(outbox[me, :count], result, source)
            shmem.signal(combine_signal[me, 0:1], encode(index, count), source)
        out = torch.empty_like(x)
        for pe in range(pes):
            shmem.wait_signal(combine_signal[pe, 0:1], encode(index, 0), comparison="ge")
            rows = sent[pe]
            if rows.numel():
                out[rows] = outbox[pe, : rows.numel()]
        return out * gate[:, None]

    # Warm up, then time; every step is checked against the reference.
    worst = 0.0
    timings = []
    for index in range(3 + args.steps):
        started = time.perf_counter()
        out = step(index)
        elapsed = time.perf_counter() - started
        if index >= 3:
            timings.append(elapsed)
        expected = model.reference(tokens_of(me, index, tokens, dim))
        worst = max(worst, (out - expected).abs().max().item())
    assert worst < 1e-5, f"PE {me}: the distributed layer differs from the reference by {worst}"

    # Rank 0 checks every PE's last step against the single-process reference of all tokens.
    last = 3 + args.steps - 1
    gathered = shmem.empty(pes, tokens, dim, dtype=torch.float32)
    shmem.all_gather(gathered, out)
    if me == 0:
        everything = torch.cat([tokens_of(pe, last, tokens, dim) for pe in range(pes)])
        reference = model.reference(everything).view(pes, tokens, dim)
        assert torch.allclose(gathered, reference, atol=1e-5), "gathered outputs differ"
    mean_ms = 1e3 * sum(timings) / len(timings)
    print(
        f"PE {me}/{pes}: {args.steps} steps of {tokens} tokens x {dim}, "
        f"{per_rank * pes} experts: {mean_ms:.3f} ms/step (min {1e3 * min(timings):.3f}), "
        f"max |error| {worst:.1e}",
        flush=True,
    )
    shmem.barrier()
    if me == 0:
        print(f"moe dispatch/combine OK on {pes} PEs: matches the single-process reference")
    for tensor in (gathered, combine_signal, dispatch_signal, outbox, inbox_experts, inbox):
        shmem.free(tensor)
    shmem.release()
    if args.gloo:
        dist.destroy_process_group()  # gloo's threads must not outlive the interpreter


if __name__ == "__main__":
    main()
