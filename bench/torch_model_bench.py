#!/usr/bin/env python3
"""The PyTorch baseline of `prl bench model`: the same Qwen2/Llama-shaped decoder (embedding,
RMSNorm, RoPE, GQA attention through F.scaled_dot_product_attention(is_causal), SwiGLU MLP,
LM head with log-softmax and target gather), random weights, the same tokens per step, timed
forward and forward+backward the same way (median over iterations after a warm-up, with a
device synchronise). fp32 with TF32 off by default (prl's exact mode), or --dtype bf16.
Prints one JSON object. Stdlib + torch only.

usage: torch_model_bench.py --hidden 896 --layers 24 --heads 14 --kv-heads 2 \
           --intermediate 4864 --vocab 151936 --tied --tokens 8192 --seq-len 2048
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def main():
    p = argparse.ArgumentParser()
    for name, default in [("hidden", 896), ("layers", 24), ("heads", 14), ("kv-heads", 2),
                          ("intermediate", 4864), ("vocab", 151936), ("tokens", 8192),
                          ("seq-len", 2048), ("iters", 5)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--tied", action="store_true")
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda"
    dt = torch.float32 if a.dtype == "f32" else torch.bfloat16
    C, H, KV, D, I, V = a.hidden, a.heads, a.kv_heads, a.hidden // a.heads, a.intermediate, a.vocab
    g = torch.Generator(device=dev).manual_seed(1)

    def w(*shape):
        return (torch.randn(*shape, device=dev, generator=g) * 0.02).to(dt).requires_grad_()

    embed = w(V, C)
    layers = [dict(ln1=torch.ones(C, device=dev, dtype=dt, requires_grad=True),
                   qkv=w((H + 2 * KV) * D, C), qkv_b=w((H + 2 * KV) * D), o=w(C, H * D),
                   ln2=torch.ones(C, device=dev, dtype=dt, requires_grad=True),
                   gate_up=w(2 * I, C), down=w(C, I)) for _ in range(a.layers)]
    norm = torch.ones(C, device=dev, dtype=dt, requires_grad=True)
    head = embed if a.tied else w(V, C)
    B, S = a.tokens // a.seq_len, a.seq_len
    tokens = torch.randint(0, V, (B, S), device=dev, generator=g)
    targets = torch.randint(0, V, (B, S), device=dev, generator=g)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
    ang = torch.arange(S, device=dev, dtype=torch.float32)[:, None] * inv_freq[None]
    cos, sin = ang.cos().to(dt), ang.sin().to(dt)

    def rms(x, weight):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dt) * weight

    def rope(x):  # (B, heads, S, D)
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def forward():
        x = embed[tokens]
        for l in layers:
            h = rms(x, l["ln1"])
            qkv = F.linear(h, l["qkv"], l["qkv_b"])
            q, k, v = qkv.split([H * D, KV * D, KV * D], dim=-1)
            q = rope(q.view(B, S, H, D).transpose(1, 2))
            k = rope(k.view(B, S, KV, D).transpose(1, 2))
            v = v.view(B, S, KV, D).transpose(1, 2)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + F.linear(att.transpose(1, 2).reshape(B, S, H * D), l["o"])
            h = rms(x, l["ln2"])
            gu = F.linear(h, l["gate_up"])
            x = x + F.linear(F.silu(gu[..., :I]) * gu[..., I:], l["down"])
        h = rms(x, norm)
        logits = F.linear(h, head)
        # -sum of the targets' log-probs, fused (the memory-lean path PyTorch users take).
        return F.cross_entropy(logits.view(-1, V).float(), targets.view(-1), reduction="sum")

    fwd = torch.compile(forward) if a.compile else forward

    def timed(train):
        torch.cuda.synchronize()
        t = time.perf_counter()
        if train:
            fwd().backward()
        else:
            with torch.no_grad():
                fwd()
        torch.cuda.synchronize()
        return time.perf_counter() - t

    for _ in range(2):
        timed(False)
        timed(True)
    f = statistics.median(timed(False) for _ in range(a.iters))
    t = statistics.median(timed(True) for _ in range(a.iters))
    print(json.dumps({"framework": "pytorch " + torch.__version__ + (" compile" if a.compile else
                                                                       " eager"),
                      "dtype": a.dtype, "forward_s": f, "train_s": t,
                      "forward_tokens_per_s": a.tokens / f, "train_tokens_per_s": a.tokens / t}))


if __name__ == "__main__":
    main()
