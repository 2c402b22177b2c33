#!/usr/bin/env python3
"""PyTorch twin of iota's `small` (or `tiny`) preset: the same Llama-style decoder with the
same section bottlenecks, trained with the same AdamW, timed per step on the CPU.

It is the yardstick for iota's CPU speed: `iota bench step --torch benches/torch_twin.py` runs it
interleaved with its own steps and compares the median step times, wall clock and CPU time
(forward + backward + AdamW of the whole model in one graph).

    pip install torch
    python3 benches/torch_twin.py --preset small --batch-size 8 --seq-len 128 --steps 20

The model mirrors src/model: RMSNorm (eps 1e-5), rotary embeddings in the rotate-half
layout (theta 10000), causal grouped-query attention, SwiGLU, untied LM head, and at each
section boundary the learned residual bottleneck (encoder: W_enc * mlp(norm(h)) + h[..d_b];
decoder: silu(W_dec z + b) + [z, 0]) and, where the preset re-embeds the token ids (`tiny`,
`small`), sqrt(d_model) times a section's own embedding of the ids added to the decoded
boundary. AdamW: betas (0.9, 0.95), eps 1e-8, weight decay 0.1
on matrices only, global-norm clipping at 1.0.
"""

import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    # vocab, d_model, n_layers, n_heads, n_kv_heads, d_ff, sections, reembed
    "tiny": (256, 128, 6, 4, 2, 256, 3, True),
    "small": (256, 384, 8, 6, 2, 1024, 3, True),
    "1b": (128256, 2048, 16, 32, 8, 8192, 3, False),
}


def even_sections(n_layers, n):
    return [(i * n_layers // n, (i + 1) * n_layers // n) for i in range(n)]


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq, head_dim, theta=10000.0):
    half = head_dim // 2
    inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / head_dim)
    ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=1)
    return ang.cos().float(), ang.sin().float()


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


class Attention(nn.Module):
    def __init__(self, d, n_heads, n_kv):
        super().__init__()
        self.h, self.kv, self.hd = n_heads, n_kv, d // n_heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, n_kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, n_kv * self.hd, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x, cos, sin):
        b, s, d = x.shape
        q = self.q_proj(x).view(b, s, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv, self.hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        group = self.h // self.kv
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, d))


class Mlp(nn.Module):
    def __init__(self, d, d_ff):
        super().__init__()
        self.gate_proj = nn.Linear(d, d_ff, bias=False)
        self.up_proj = nn.Linear(d, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, d, n_heads, n_kv, d_ff):
        super().__init__()
        self.input_layernorm = RMSNorm(d)
        self.self_attn = Attention(d, n_heads, n_kv)
        self.post_attention_layernorm = RMSNorm(d)
        self.mlp = Mlp(d, d_ff)

    def attend(self, x, cos, sin):
        return x + self.self_attn(self.input_layernorm(x), cos, sin)

    def mlp_branch(self, h):
        return self.mlp(self.post_attention_layernorm(h))


class Model(nn.Module):
    def __init__(self, preset):
        super().__init__()
        vocab, d, n_layers, n_heads, n_kv, d_ff, n_sections, reembed = PRESETS[preset]
        self.d, self.d_b, self.hd = d, max(d // 64, 1), d // n_heads
        self.sections = even_sections(n_layers, n_sections)
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d, n_heads, n_kv, d_ff) for _ in range(n_layers))
        self.encoders = nn.ModuleDict()
        self.decoders = nn.ModuleDict()
        for start, end in self.sections[:-1]:
            self.encoders[str(end - 1)] = nn.Linear(d, self.d_b, bias=False)
        self.reembed = nn.ModuleDict()
        for start, _ in self.sections[1:]:
            self.decoders[str(start)] = nn.Linear(self.d_b, d, bias=True)
            if reembed:
                self.reembed[str(start)] = nn.Embedding(vocab, d)
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
        for dec in self.decoders.values():
            nn.init.zeros_(dec.bias)

    def forward(self, tokens):
        b, s = tokens.shape
        cos, sin = rope_tables(s, self.hd)
        x = self.embed_tokens(tokens)
        cos, sin = cos.to(x.device, x.dtype), sin.to(x.device, x.dtype)
        for i, block in enumerate(self.layers):
            if str(i) in self.decoders:
                z = x
                x = F.silu(self.decoders[str(i)](z)) + F.pad(z, (0, self.d - self.d_b))
                if str(i) in self.reembed:
                    x = x + math.sqrt(self.d) * self.reembed[str(i)](tokens)
            h = block.attend(x, cos, sin)
            if str(i) in self.encoders:
                x = self.encoders[str(i)](block.mlp_branch(h)) + h[..., : self.d_b]
            else:
                x = h + block.mlp_branch(h)
        return self.lm_head(self.norm(x))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small", choices=sorted(PRESETS))
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20, help="timed steps (after 3 warm-up steps)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", action="store_true", help="print one JSON line")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument(
        "--dtype",
        default="f32",
        choices=["f32", "bf16"],
        help="bf16: the whole model in bf16, as `iota bench model --float bf16` (no autocast)",
    )
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = Model(args.preset).to(device)
    if args.dtype == "bf16":
        model = model.to(torch.bfloat16)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    vocab = PRESETS[args.preset][0]
    gen = torch.Generator().manual_seed(1)
    times = []
    cpu_times = []
    for step in range(args.steps + 3):
        tokens = torch.randint(0, vocab, (args.batch_size, args.seq_len + 1), generator=gen)
        tokens = tokens.to(device)
        sync()
        t0 = time.perf_counter()
        c0 = time.process_time()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        dt = time.perf_counter() - t0
        dc = time.process_time() - c0
        if step >= 3:
            times.append(dt)
            cpu_times.append(dc)
    params = sum(p.numel() for p in model.parameters())
    med = statistics.median(times)
    tokens = args.batch_size * args.seq_len
    out = {
        "framework": f"pytorch {torch.__version__}",
        "preset": args.preset,
        "device": args.device,
        "dtype": args.dtype,
        "params": params,
        "batch": args.batch_size,
        "seq": args.seq_len,
        "threads": torch.get_num_threads(),
        "steps": len(times),
        "median_step_ms": med * 1e3,
        "median_step_cpu_ms": statistics.median(cpu_times) * 1e3,
        "tokens_per_s": tokens / med,
        "final_loss": float(loss.detach()),
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"pytorch {torch.__version__} twin of `{args.preset}` ({params / 1e6:.2f}M params), "
            f"batch {args.batch_size} x {args.seq_len}, {torch.get_num_threads()} threads: "
            f"median step {med * 1e3:.1f} ms wall, "
            f"{statistics.median(cpu_times) * 1e3:.1f} ms CPU over {len(times)} steps "
            f"({tokens / med:.0f} tokens/s), loss {float(loss.detach()):.3f}"
        )
    assert math.isfinite(float(loss.detach()))


if __name__ == "__main__":
    main()
