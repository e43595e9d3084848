"""Two mixture-of-experts layers and an attention workspace on one shared symmetric heap:
dispatch tokens to the ranks that own their experts with put + signal, apply the experts there,
combine the results back, and check everything against a single-process reference -- while a
token spike grows the layers' receive buffers mid-run and the workspace's data survives.

Run it on 4 PEs with either launcher:

    hmrun -n 4 -- python examples/moe_dispatch_combine.py
    torchrun --nproc-per-node 4 examples/moe_dispatch_combine.py --gloo

With ``--gloo`` (either launcher: ``hmrun`` sets torchrun's variables too) the same steps also
run through torch.distributed's gloo ``all_to_all_single`` (counts, tokens, expert ids, and the
outputs back), checked against the same reference, and rank 0 prints both times per step.

The heap is a :class:`~hyper_multicore.shmem.SharedRoot` with three consumers: ``moe0`` and
``moe1`` (one per layer: receive buffers that grow, and signal words) and ``attn`` (a workspace
whose contents must outlive every growth). Each consumer's calls run under its lease.

Each PE owns ``--experts-per-rank`` experts per layer (a small tanh MLP each) and ``--tokens``
tokens of width ``--dim``; at step ``--spike-step`` every PE has ``--spike`` times as many. A
router picks one expert per token (top-1, with a gate weight). One layer step:

0. capacity -- every PE states the most rows it will send to one destination; the layer's
   receive buffers grow (collectively, with the largest need, keeping every consumer's data)
   if they are too small;
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
    parser.add_argument("--spike-step", type=int, default=8, help="the step with more tokens")
    parser.add_argument("--spike", type=int, default=8, help="token multiplier at the spike")
    parser.add_argument(
        "--gloo",
        action="store_true",
        help="initialise torch.distributed (gloo) and use its WORLD as the root",
    )
    args = parser.parse_args()
    if not 0 <= args.spike_step < 3 + args.steps - 1:
        parser.error("--spike-step must be a step before the last one (3 warm-up + --steps)")
    return args


class Model:
    """Router and experts, identical on every PE (seeded)."""

    def __init__(self, experts: int, dim: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
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


MIB = 1 << 20


class Layer:
    """One MoE layer's communication: a consumer of the shared root with, per source PE, a
    growable receive slot for tokens, expert ids and outputs, and its signal words."""

    def __init__(self, root: shmem.SharedRoot, name: str, model: Model, budget: int) -> None:
        self.name, self.model = name, model
        self.consumer = root.reserve(
            shmem.ConsumerSpec(name, "moe-dispatch", budget, "per source: inbox, ids, outbox")
        )

    def allocate(self, pes: int, rows: int, dim: int) -> None:
        """Collective, under the layer's lease: the buffers, sized for ``rows`` per source."""
        c = self.consumer
        self.inbox = [c.growable(rows, dim, dtype=torch.float32) for _ in range(pes)]
        self.ids = [c.growable(rows, dtype=torch.int64) for _ in range(pes)]
        self.outbox = [c.growable(rows, dim, dtype=torch.float32) for _ in range(pes)]
        self.dispatch_signal = c.empty(pes, 8, dtype=torch.int64)
        self.combine_signal = c.empty(pes, 8, dtype=torch.int64)
        self.dispatch_signal.zero_()
        self.combine_signal.zero_()

    def buffers(self) -> list[shmem.GrowableBuffer]:
        return self.inbox + self.ids + self.outbox

    def step(self, index: int, x: torch.Tensor, me: int, pes: int, per_rank: int) -> torch.Tensor:
        """One dispatch/expert/combine step of ``x`` (this PE's tokens); under the lease."""
        c = self.consumer
        expert, gate = self.model.route(x)
        owner = expert // per_rank
        sent = [(owner == pe).nonzero().flatten() for pe in range(pes)]
        # 0. capacity: the largest slot any PE needs, agreed by all (a growth if too small).
        c.ensure_capacity(max(rows.numel() for rows in sent), *self.buffers())
        # A growth (this layer's or another consumer's) replaces every tensor of every consumer
        # by one with the same bytes in the bigger heap: look the signal words up again.
        self.dispatch_signal = c.refresh(self.dispatch_signal)
        self.combine_signal = c.refresh(self.combine_signal)
        dispatch_signal, combine_signal = self.dispatch_signal, self.combine_signal
        # 1. dispatch
        for pe, rows in enumerate(sent):
            count = rows.numel()
            if count:
                shmem.put(self.inbox[me].tensor[:count], x[rows].contiguous(), pe)
                shmem.put(self.ids[me].tensor[:count], expert[rows].contiguous(), pe)
            shmem.signal(dispatch_signal[me, 0:1], encode(index, count), pe)
        # 2. experts, for every source
        for source in range(pes):
            word = shmem.wait_signal(
                dispatch_signal[source, 0:1], encode(index, 0), comparison="ge"
            )
            count = word & 0xFFFFFFFF
            if count:
                received = self.inbox[source].tensor[:count]
                ids = self.ids[source].tensor[:count]
                result = torch.empty_like(received)
                for local in ids.unique().tolist():
                    rows = ids == local
                    result[rows] = self.model.expert(local, received[rows])
                # 3. combine: the outputs go back to the source
                shmem.put(self.outbox[me].tensor[:count], result, source)
            shmem.signal(combine_signal[me, 0:1], encode(index, count), source)
        out = torch.empty_like(x)
        for pe, rows in enumerate(sent):
            shmem.wait_signal(combine_signal[pe, 0:1], encode(index, 0), comparison="ge")
            if rows.numel():
                out[rows] = self.outbox[pe].tensor[: rows.numel()]
        return out * gate[:, None]

    def free(self) -> None:
        for buffer in self.buffers():
            self.consumer.free(buffer.tensor)
        self.consumer.free(self.combine_signal)
        self.consumer.free(self.dispatch_signal)


def gloo_step(model: Model, x: torch.Tensor, pes: int, per_rank: int) -> torch.Tensor:
    """One layer step of :class:`Layer` through gloo's ``all_to_all_single`` instead of the
    heap: the same routing, experts and combine."""
    import torch.distributed as dist

    expert, gate = model.route(x)
    owner = expert // per_rank
    order = torch.argsort(owner, stable=True)
    send_counts = torch.bincount(owner, minlength=pes)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    sends, receives = send_counts.tolist(), recv_counts.tolist()
    tokens, ids = x[order].contiguous(), expert[order].contiguous()
    received = torch.empty(sum(receives), x.shape[1], dtype=x.dtype)
    received_ids = torch.empty(sum(receives), dtype=expert.dtype)
    dist.all_to_all_single(received, tokens, receives, sends)
    dist.all_to_all_single(received_ids, ids, receives, sends)
    result = torch.empty_like(received)
    for local in received_ids.unique().tolist():
        rows = received_ids == local
        result[rows] = model.expert(local, received[rows])
    back = torch.empty_like(tokens)
    dist.all_to_all_single(back, result, sends, receives)
    out = torch.empty_like(x)
    out[order] = back
    return out * gate[:, None]


def main() -> None:
    args = parse()
    # Several PEs share few cores here: torch's own thread pool would only oversubscribe them.
    torch.set_num_threads(1)
    if args.gloo:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    pes = len(shmem.root_members())
    per_rank, tokens, dim = args.experts_per_rank, args.tokens, args.dim
    models = [Model(per_rank * pes, dim, seed) for seed in (1234, 5678)]

    # One heap, three consumers. The layers' budgets cover their buffers at the normal token
    # count (a quarter of the tokens to one destination, times 2 of headroom); the spike grows
    # them. The workspace holds state that every growth must keep.
    rows = tokens // 2
    slot = shmem.allocation_budget((rows, dim), "float32") * 2
    slot += shmem.allocation_budget((rows,), "int64")
    signals = 2 * shmem.allocation_budget((pes, 8), "int64")
    root = shmem.SharedRoot()
    layers = [Layer(root, f"moe{i}", model, pes * slot + signals) for i, model in enumerate(models)]
    attn = root.reserve(shmem.ConsumerSpec("attn", "workspace", 2 * MIB, "kv scratch"))
    root.activate()
    me = shmem.my_pe()
    for layer in layers:
        with layer.consumer.lease():
            layer.allocate(pes, rows, dim)
    with attn.lease():
        workspace = attn.empty(MIB // 4, dtype=torch.float32)
        kept = torch.arange(MIB // 4, dtype=torch.float32) * (me + 1)
        workspace.copy_(kept)
        shmem.barrier()  # every slot is initialised before any peer writes into it

    def forward(index: int, x: torch.Tensor) -> torch.Tensor:
        for layer in layers:
            with layer.consumer.lease():
                x = layer.step(index, x, me, pes, per_rank)
        return x

    def reference(x: torch.Tensor) -> torch.Tensor:
        for model in models:
            x = model.reference(x)
        return x

    def count(index: int) -> int:
        return tokens * args.spike if index == args.spike_step else tokens

    # Warm up, then time; every step is checked against the reference.
    worst = 0.0
    timings = []
    for index in range(3 + args.steps):
        x = tokens_of(me, index, count(index), dim)
        started = time.perf_counter()
        out = forward(index, x)
        elapsed = time.perf_counter() - started
        if index >= 3 and index != args.spike_step:
            timings.append(elapsed)
        worst = max(worst, (out - reference(x)).abs().max().item())
    assert worst < 1e-5, f"PE {me}: the distributed layers differ from the reference by {worst}"
    state = root.debug_state()
    growths = state["growths"]
    assert growths, "the token spike did not grow the receive buffers"

    with attn.lease():
        workspace = attn.refresh(workspace)
        assert torch.equal(workspace, kept), f"PE {me}: the workspace changed across growths"
        # Rank 0 checks every PE's last step against the reference of all tokens.
        last = 3 + args.steps - 1
        gathered = attn.empty(pes, tokens, dim, dtype=torch.float32)
        shmem.all_gather(gathered, out)
        if me == 0:
            everything = torch.cat([tokens_of(pe, last, tokens, dim) for pe in range(pes)])
            expected = reference(everything).view(pes, tokens, dim)
            assert torch.allclose(gathered, expected, atol=1e-5), "gathered outputs differ"
        attn.free(gathered)
        attn.free(workspace)
    mean_ms = 1e3 * sum(timings) / len(timings)
    if args.gloo:
        # The same steps (the spike step left out, as above) through gloo's all_to_all_single.
        gloo_timings = []
        for index in range(3 + args.steps):
            if index == args.spike_step:
                continue
            x = tokens_of(me, index, count(index), dim)
            started = time.perf_counter()
            out = x
            for model in models:
                out = gloo_step(model, out, pes, per_rank)
            elapsed = time.perf_counter() - started
            if index >= 3:
                gloo_timings.append(elapsed)
            error = (out - reference(x)).abs().max().item()
            assert error < 1e-5, f"PE {me}: the gloo layers differ from the reference by {error}"
        gloo_ms = 1e3 * sum(gloo_timings) / len(gloo_timings)
        if me == 0:
            print(
                f"same steps, {pes} PEs: hyper_multicore.shmem put + signal {mean_ms:.3f} ms/step, "
                f"torch.distributed gloo all_to_all_single {gloo_ms:.3f} ms/step "
                f"({gloo_ms / mean_ms:.1f}x)",
                flush=True,
            )
    grown = ", ".join(
        f"{g['consumer']} budget {g['budget_from_bytes'] / MIB:.2f} -> "
        f"{g['budget_to_bytes'] / MIB:.2f} MiB, heap {g['from_bytes'] / MIB:.0f} -> "
        f"{g['to_bytes'] / MIB:.0f} MiB in {sum(g['timings'].values()):.1f} ms"
        for g in growths
    )
    print(
        f"PE {me}/{pes}: {args.steps} steps of {tokens} tokens x {dim} through 2 layers, "
        f"{per_rank * pes} experts each: {mean_ms:.3f} ms/step (min {1e3 * min(timings):.3f}), "
        f"max |error| {worst:.1e}; growths: {grown}",
        flush=True,
    )
    for layer in layers:
        with layer.consumer.lease():
            if layer is layers[-1]:
                shmem.barrier()
            layer.free()
        layer.consumer.close()
    attn.close()
    root.close()
    if me == 0:
        print(
            f"moe dispatch/combine OK on {pes} PEs: matches the single-process reference; "
            "the workspace survived every growth"
        )
    if args.gloo:
        dist.destroy_process_group()  # gloo's threads must not outlive the interpreter


if __name__ == "__main__":
    main()
