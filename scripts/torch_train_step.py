#!/usr/bin/env python3
"""PyTorch baseline for `cargo bench -p autopar-cpu --bench train_step`.

Builds the zoo GPT of a `gpt:` spec the way `import/src/zoo/gpt.rs` does
(learned positions, pre-LayerNorm layers, fused QKV with bias, causal
attention, GELU(tanh) MLP of `ffn` = 4·hidden by default, LM head tied to the
token embedding by default and without bias, no final LayerNorm unless
`final_norm=true`) and times the same f32 training step on the CPU: forward,
mean next-token cross-entropy, backward and AdamW with autopar's recipe
(lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on matrices only).
Prints the median step time and tokens/s for each thread count.

    python3 scripts/torch_train_step.py            # 1 thread, then torch's default
    python3 scripts/torch_train_step.py --threads 1 4 --batch 4
"""

import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_SPEC = "gpt:layers=4,hidden=512,heads=8,vocab=8192,seq=256"


def parse_spec(spec):
    """The zoo spec's keys with the zoo's defaults filled in."""
    family, _, body = spec.partition(":")
    if family != "gpt":
        raise SystemExit(f"spec '{spec}': only gpt specs are supported")
    keys = dict(kv.split("=", 1) for kv in body.split(",") if kv)
    c = {k: int(keys[k]) for k in ("layers", "hidden", "heads", "vocab", "seq")}
    c["ffn"] = int(keys.get("ffn", 4 * c["hidden"]))
    c["tied"] = keys.get("tied", "true") == "true"
    c["final_norm"] = keys.get("final_norm", "false") == "true"
    if keys.get("dtype", "f32") != "f32":
        raise SystemExit(f"spec '{spec}': only dtype=f32 is supported")
    return c


class Layer(nn.Module):
    """One pre-LayerNorm decoder layer (`h.{i}` in the zoo graph)."""

    def __init__(self, c):
        super().__init__()
        h = c["hidden"]
        self.heads = c["heads"]
        self.ln_1 = nn.LayerNorm(h, eps=1e-5)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln_2 = nn.LayerNorm(h, eps=1e-5)
        self.fc = nn.Linear(h, c["ffn"])
        self.mlp_proj = nn.Linear(c["ffn"], h)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    """The zoo GPT: logits `[batch, seq, vocab]` from token ids."""

    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab"], c["hidden"])
        self.wpe = nn.Embedding(c["seq"], c["hidden"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["layers"]))
        self.ln_f = nn.LayerNorm(c["hidden"], eps=1e-5) if c["final_norm"] else nn.Identity()
        self.lm_head = nn.Linear(c["hidden"], c["vocab"], bias=False)
        if c["tied"]:
            self.lm_head.weight = self.wte.weight
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
            else:
                nn.init.zeros_(p)
        for m in self.modules():
            if isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(positions)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_f(x))


def optimizer(model):
    """AdamW as autopar's `Optimizer::adamw`: decay on parameters of rank ≥ 2."""
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, foreach=False)


def time_steps(c, batch, warmup, steps, threads):
    """Median seconds of `steps` training steps after `warmup` ones."""
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    model = Gpt(c)
    opt = optimizer(model)
    times = []
    for step in range(warmup + steps):
        tokens = torch.randint(0, c["vocab"], (batch, c["seq"] + 1))
        start = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, c["vocab"]), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        elapsed = time.perf_counter() - start
        if step >= warmup:
            times.append(elapsed)
    params = sum(p.numel() for p in model.parameters())
    return statistics.median(times), params, loss.item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=DEFAULT_SPEC)
    ap.add_argument("--batch", type=int, default=2, help="rows per step (the bench's global batch)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[1, torch.get_num_threads()],
        help="intra-op thread counts to time (default: 1 and torch's default)",
    )
    a = ap.parse_args()
    c = parse_spec(a.spec)
    tokens = a.batch * c["seq"]
    print(f"torch {torch.__version__}, f32, AdamW; median of {a.steps} steps after {a.warmup} warm-up steps")
    print(f"{a.spec}  (global batch {a.batch} × seq {c['seq']})")
    print("  threads   step_s   tokens/s  params      loss")
    for threads in a.threads:
        step_s, params, loss = time_steps(c, a.batch, a.warmup, a.steps, threads)
        if not math.isfinite(loss):
            raise SystemExit(f"loss is {loss} with {threads} threads")
        print(f"  {threads:>7}  {step_s:>8.5f}  {tokens / step_s:>9.0f}  {params:>9}  {loss:.4f}")


if __name__ == "__main__":
    main()
