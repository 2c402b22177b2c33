#!/usr/bin/env python3
"""PyTorch's time for the ops of `iota bench step`'s per-op table at the `small` preset's
shapes (batch 8 x 128 tokens): forward + backward of each op alone, one thread, CPU time
(`time.process_time`), mean of `--reps` runs after two warm-up runs.

    pip install torch
    python3 benches/torch_ops.py
"""

import argparse
import time

import torch
import torch.nn.functional as F


def cpu_ms(f, reps):
    f()
    f()
    start = time.process_time()
    for _ in range(reps):
        f()
    return (time.process_time() - start) / reps * 1000.0


def backward_of(make):
    def run():
        out = make()
        out.backward(torch.ones_like(out))

    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    b, s, d, ff, h, kv, hd = 8, 128, 384, 1024, 6, 2, 64

    def grad(*shape):
        return torch.randn(*shape, requires_grad=True)

    x, x_ff = grad(b, s, d), grad(b, s, ff)
    gate = torch.nn.Linear(d, ff, bias=False)
    down = torch.nn.Linear(ff, d, bias=False)
    g, u = grad(b, s, ff), grad(b, s, ff)
    q, k, v = grad(b, h, s, hd), grad(b, kv, s, hd), grad(b, kv, s, hd)

    def attention():
        rep = h // kv
        return F.scaled_dot_product_attention(
            q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True
        )

    rows = [
        ("swiglu silu(g) * u", f"[{b},{s},{ff}]", lambda: F.silu(g) * u),
        ("attention core (causal, GQA)", f"q [{b},{h},{s},{hd}]", attention),
        ("linear (gate, up)", f"[{b},{s},{d}] x [{ff},{d}]^T", lambda: gate(x)),
        ("linear (down)", f"[{b},{s},{ff}] x [{d},{ff}]^T", lambda: down(x_ff)),
    ]
    print(f"pytorch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    print(f"{'op (forward + backward)':32} {'shape':30} {'CPU ms':>8}")
    for name, shape, make in rows:
        print(f"{name:32} {shape:30} {cpu_ms(backward_of(make), args.reps):8.2f}")


if __name__ == "__main__":
    main()
