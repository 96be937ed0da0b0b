#!/usr/bin/env python3
"""The PyTorch baseline of `prl bench model --torch-baseline PYTHON`.

The same Qwen2/Llama/Qwen3-shaped decoder in plain PyTorch: token embedding, RMSNorm (fp32
statistics; Qwen3's per-head q/k norms with --qk-norm), RoPE, GQA attention through F.scaled_dot_product_attention(is_causal=True,
enable_gqa=True), SwiGLU MLP, LM head (tied or not) with a log-softmax + target gather (the
fused F.cross_entropy, reduction "sum", on fp32 logits). Random weights (std 0.02), the same
tokens per step in B = tokens / seq_len sequences of seq_len, timed like prl: forward without
autograd, and forward + backward (gradients accumulate into .grad, as prl's accumulate into its
gradient buffer), median of --iters steps after --warmup steps, each step ended by a device
synchronise. Modes, measured one after the other in this process:

  eager    the model as written (cuDNN/flash SDPA, cuBLAS GEMMs);
  compile  torch.compile of each decoder block and of the head + loss (one compiled graph
           reused by every layer: the usual per-block compilation, with a compile time of
           seconds rather than minutes for 28 unrolled layers).

fp32 runs with TF32 off (prl's exact fp32 mode); --dtype bf16 stores weights and activations in
bf16 (autograd's gradients are bf16 too). FLOPs use model/flops.cc's formula, so TFLOP/s and
MFU compare one to one with prl's. A mode that fails (out of memory, no compiler for
torch.compile) is reported with its error and does not stop the others.

Prints one JSON object on stdout: {"framework", "device", "dtype", "tokens", "seq_len",
"attention", "forward_flops", "train_flops", "peak_tflops", "modes": {MODE: {"forward_s",
"train_s", "forward_tokens_per_s", "train_tokens_per_s", "forward_tflops", "train_tflops",
"train_mfu"} or {"error"}}}. Progress on stderr. Stdlib + torch only.

usage: torch_model_bench.py --hidden 896 --layers 24 --heads 14 --kv-heads 2 \
           --intermediate 4864 --vocab 151936 --tied --tokens 8192 --seq-len 2048 \
           --dtype bf16 --modes eager,compile --peak-tflops 989
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in [("hidden", 896), ("layers", 24), ("heads", 14), ("kv-heads", 2),
                          ("head-dim", 0), ("intermediate", 4864), ("vocab", 151936),
                          ("tokens", 8192), ("seq-len", 2048), ("iters", 5), ("warmup", 2)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--tied", action="store_true", help="LM head shares the embedding")
    p.add_argument("--no-qkv-bias", action="store_true", help="Llama: no q/k/v biases")
    p.add_argument("--qk-norm", action="store_true",
                   help="Qwen3: RMSNorm of each query and key head before RoPE")
    p.add_argument("--o-bias", action="store_true", help="Qwen3 attention_bias: o_proj bias")
    for name in ("experts", "top-k", "moe-inter"):
        p.add_argument("--" + name, type=int, default=0, help="Qwen3-MoE (0: dense)")
    p.add_argument("--norm-topk", action="store_true", help="Qwen3-MoE norm_topk_prob")
    p.add_argument("--moe-layers", default="",
                   help="Qwen3-MoE: comma-separated indices of the MoE layers")
    p.add_argument("--rope-theta", type=float, default=1e6)
    p.add_argument("--rms-eps", type=float, default=1e-6)
    p.add_argument("--dtype", default="bf16", choices=["f32", "bf16"])
    p.add_argument("--modes", default="eager,compile", help="comma-separated: eager, compile")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (cpu: smoke tests)")
    p.add_argument("--peak-tflops", type=float, default=0.0,
                   help="the device's peak for --dtype (MFU is omitted when 0)")
    a = p.parse_args()
    if a.head_dim == 0:
        a.head_dim = a.hidden // a.heads
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in ("eager", "compile")]
    if bad or not modes:
        p.error("--modes: expected eager and/or compile, found %r" % a.modes)
    a.modes = modes
    a.moe_layers = {int(x) for x in a.moe_layers.split(",") if x}
    if a.tokens <= 0 or a.seq_len <= 0 or a.tokens % a.seq_len != 0:
        p.error("--tokens must be a positive multiple of --seq-len (B x S batch)")
    if a.heads % a.kv_heads != 0:
        p.error("--heads must be a multiple of --kv-heads")
    return a


def forward_flops(a):
    """model/flops.cc ForwardFlops: every GEMM at 2 FLOPs per multiply-add, causal attention
    over the visible keys only, the LM head on every position."""
    C, I, D = a.hidden, a.intermediate, a.head_dim
    q_dim, qkv_dim = a.heads * D, (a.heads + 2 * a.kv_heads) * D
    moe = len(a.moe_layers)
    mlp = ((a.layers - moe) * 2.0 * 3.0 * C * I
           + moe * 2.0 * (C * a.experts + a.top_k * 3.0 * C * a.moe_inter))
    layer_gemm = 2.0 * (C * qkv_dim + q_dim * C)
    seqs = a.tokens // a.seq_len
    pairs = 0.5 * a.seq_len * (a.seq_len + 1)
    attention = seqs * 4.0 * D * a.heads * pairs
    return (a.layers * (a.tokens * layer_gemm + attention) + a.tokens * mlp
            + 2.0 * a.tokens * C * a.vocab)


def torch_at_least(major, minor):
    parts = torch.__version__.split("+")[0].split(".")
    return (int(parts[0]), int(parts[1])) >= (major, minor)


def log(msg):
    print("torch_model_bench: " + msg, file=sys.stderr, flush=True)


class Model:
    """Weights as plain leaf tensors; block() and head() are pure functions of them, so that
    torch.compile can compile one block and reuse it for every layer."""

    def __init__(self, a, dev, dt):
        self.a, self.dev, self.dt = a, dev, dt
        C, H, KV, D, I, V = a.hidden, a.heads, a.kv_heads, a.head_dim, a.intermediate, a.vocab
        g = torch.Generator(device=dev).manual_seed(1)

        def w(*shape):
            return (torch.randn(*shape, device=dev, generator=g) * 0.02).to(dt).requires_grad_()

        def ones(n):
            return torch.ones(n, device=dev, dtype=dt, requires_grad=True)

        qkv = (H + 2 * KV) * D
        self.embed = w(V, C)
        self.layers = [dict(ln1=ones(C), qkv=w(qkv, C),
                            qkv_b=None if a.no_qkv_bias else w(qkv), o=w(C, H * D),
                            o_b=w(C) if a.o_bias else None,
                            q_norm=ones(D) if a.qk_norm else None,
                            k_norm=ones(D) if a.qk_norm else None,
                            ln2=ones(C), **self.mlp_weights(i, w))
                       for i in range(a.layers)]
        self.norm = ones(C)
        self.lm_head = self.embed if a.tied else w(V, C)
        B, S = a.tokens // a.seq_len, a.seq_len
        self.tokens = torch.randint(0, V, (B, S), device=dev, generator=g)
        self.targets = torch.randint(0, V, (B, S), device=dev, generator=g)
        inv_freq = 1.0 / (a.rope_theta ** (
            torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
        ang = torch.arange(S, device=dev, dtype=torch.float32)[:, None] * inv_freq[None]
        self.cos, self.sin = ang.cos().to(dt), ang.sin().to(dt)
        if torch_at_least(2, 5):
            self.attention_kind = "F.scaled_dot_product_attention(is_causal, enable_gqa)"
        elif hasattr(F, "scaled_dot_product_attention"):
            self.attention_kind = "F.scaled_dot_product_attention(is_causal), K/V repeated"
        else:
            self.attention_kind = "matmul + masked softmax (torch < 2.0)"

    def mlp_weights(self, layer, w):
        a = self.a
        if layer not in a.moe_layers:
            return dict(gate_up=w(2 * a.intermediate, a.hidden), down=w(a.hidden, a.intermediate),
                        router=None, e_gate_up=None, e_down=None)
        E, Im, C = a.experts, a.moe_inter, a.hidden
        return dict(gate_up=None, down=None, router=w(E, C), e_gate_up=w(E, 2 * Im, C),
                    e_down=w(E, C, Im))

    def moe(self, h, router, e_gate_up, e_down):
        """transformers' Qwen3MoeSparseMoeBlock (eager: one pass per expert)."""
        a = self.a
        shape, Im = h.shape, a.moe_inter
        x = h.reshape(-1, shape[-1])
        probs = F.linear(x, router).float().softmax(-1)
        top, ids = probs.topk(a.top_k, dim=-1)
        if a.norm_topk:
            top = top / top.sum(-1, keepdim=True)
        top = top.to(x.dtype)
        out = torch.zeros_like(x)
        for e in range(a.experts):
            rows, slot = torch.where(ids == e)
            if rows.numel() == 0:
                continue
            gu = F.linear(x[rows], e_gate_up[e])
            y = F.linear(F.silu(gu[:, :Im]) * gu[:, Im:], e_down[e])
            out = out.index_add(0, rows, y * top[rows, slot, None])
        return out.view(shape)

    def rms(self, x, weight):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.a.rms_eps)).to(
            self.dt) * weight

    def rope(self, x):  # (B, heads, S, D), HF rotate_half convention
        half = self.a.head_dim // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * self.cos - x2 * self.sin, x2 * self.cos + x1 * self.sin], dim=-1)

    def attention(self, q, k, v):
        H, KV = self.a.heads, self.a.kv_heads
        if torch_at_least(2, 5):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=H != KV)
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        S = q.shape[-2]
        scores = (q @ k.transpose(-1, -2)).float() / (self.a.head_dim ** 0.5)
        mask = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1)
        return scores.masked_fill(mask, float("-inf")).softmax(-1).to(self.dt) @ v

    def block(self, x, ln1, qkv_w, qkv_b, o, o_b, q_norm, k_norm, ln2, gate_up, down,
              router=None, e_gate_up=None, e_down=None):
        a = self.a
        B, S = x.shape[0], x.shape[1]
        H, KV, D, I = a.heads, a.kv_heads, a.head_dim, a.intermediate
        h = self.rms(x, ln1)
        qkv = F.linear(h, qkv_w, qkv_b)
        q, k, v = qkv.split([H * D, KV * D, KV * D], dim=-1)
        q, k = q.view(B, S, H, D), k.view(B, S, KV, D)
        if q_norm is not None:  # Qwen3: per-head RMSNorm before RoPE
            q, k = self.rms(q, q_norm), self.rms(k, k_norm)
        q = self.rope(q.transpose(1, 2))
        k = self.rope(k.transpose(1, 2))
        v = v.view(B, S, KV, D).transpose(1, 2)
        att = self.attention(q, k, v)
        x = x + F.linear(att.transpose(1, 2).reshape(B, S, H * D), o, o_b)
        h = self.rms(x, ln2)
        if router is not None:
            return x + self.moe(h, router, e_gate_up, e_down)
        gu = F.linear(h, gate_up)
        return x + F.linear(F.silu(gu[..., :I]) * gu[..., I:], down)

    def head(self, x, norm, lm_head, targets):
        # -sum of the targets' log-probs: log-softmax and gather fused in cross_entropy.
        logits = F.linear(self.rms(x, norm), lm_head)
        return F.cross_entropy(logits.view(-1, self.a.vocab).float(), targets.view(-1),
                               reduction="sum")

    def loss(self, block, head):
        x = self.embed[self.tokens]
        for l in self.layers:
            x = block(x, l["ln1"], l["qkv"], l["qkv_b"], l["o"], l["o_b"], l["q_norm"],
                      l["k_norm"], l["ln2"], l["gate_up"], l["down"], l["router"],
                      l["e_gate_up"], l["e_down"])
        return head(x, self.norm, self.lm_head, self.targets)


def measure(model, mode, a, sync):
    if mode == "compile":
        block = torch.compile(model.block, dynamic=False)
        head = torch.compile(model.head, dynamic=False)
    else:
        block, head = model.block, model.head

    def step(train):
        sync()
        start = time.perf_counter()
        if train:
            model.loss(block, head).backward()
        else:
            with torch.no_grad():
                model.loss(block, head)
        sync()
        return time.perf_counter() - start

    start = time.perf_counter()
    for _ in range(max(a.warmup, 1)):  # compiles both graphs (with and without autograd)
        step(False)
        step(True)
    log("%s: warm-up %.1f s" % (mode, time.perf_counter() - start))
    fwd = statistics.median(step(False) for _ in range(a.iters))
    train = statistics.median(step(True) for _ in range(a.iters))
    log("%s: forward %.4f s, forward+backward %.4f s (median of %d)" % (mode, fwd, train, a.iters))
    return fwd, train


def main():
    a = parse_args()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("torch_model_bench: --device %s but torch sees no GPU" % a.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dt = torch.float32 if a.dtype == "f32" else torch.bfloat16

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    fwd_flops = forward_flops(a)
    out = {"framework": "pytorch " + torch.__version__,
           "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
           "dtype": a.dtype, "tokens": a.tokens, "seq_len": a.seq_len,
           "forward_flops": fwd_flops, "train_flops": 3.0 * fwd_flops,
           "peak_tflops": a.peak_tflops, "modes": {}}
    model = None
    try:
        model = Model(a, dev, dt)
        out["attention"] = model.attention_kind
    except (RuntimeError, MemoryError) as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
        for mode in a.modes:
            out["modes"][mode] = {"error": "building the model: %s" % str(e).split("\n")[0]}
    for mode in a.modes if model is not None else []:
        try:
            fwd, train = measure(model, mode, a, sync)
            r = {"forward_s": fwd, "train_s": train,
                 "forward_tokens_per_s": a.tokens / fwd, "train_tokens_per_s": a.tokens / train,
                 "forward_tflops": fwd_flops / fwd / 1e12,
                 "train_tflops": 3.0 * fwd_flops / train / 1e12}
            if a.peak_tflops > 0:
                r["train_mfu"] = r["train_tflops"] / a.peak_tflops
            out["modes"][mode] = r
        except Exception as e:  # noqa: BLE001 (OOM, a missing compiler, ...: report, go on)
            msg = "%s: %s" % (type(e).__name__, str(e).strip().split("\n")[0][:300])
            log("%s failed: %s" % (mode, msg))
            out["modes"][mode] = {"error": msg}
        for t in [model.embed, model.norm, model.lm_head] + [
                v for l in model.layers for v in l.values() if v is not None]:
            t.grad = None
        if cuda:
            torch.cuda.empty_cache()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
