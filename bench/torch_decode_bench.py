#!/usr/bin/env python3
"""The PyTorch baseline of `prl bench engine --torch-baseline PYTHON`: KV-cache generation.

The Qwen2/Llama-shaped decoder of torch_model_bench.py in plain PyTorch (token embedding,
RMSNorm with fp32 statistics, RoPE, GQA attention with q/k/v biases unless --no-qkv-bias,
SwiGLU MLP, LM head tied or not), random weights (std 0.02), and the generation loop a
competent PyTorch user writes without an inference engine, all under torch.inference_mode():

  cache    one static, preallocated K and V cache per layer, (B, KV, prompt + output, D) in the
           model dtype, allocated once per mode;
  prefill  B random prompts of --prompt tokens in one forward, attention through
           F.scaled_dot_product_attention(is_causal=True, enable_gqa=True), each layer's K/V
           written into the cache; the LM head on the last position only, fp32 logits, and the
           first token sampled;
  decode   --output steps of one new token per sequence at position p = prompt + i: its K/V
           written into the cache at p, the attention of the single query over the cache's
           valid prefix, the LM head to fp32 logits, a sample with temperature 1
           (torch.multinomial of the softmax) and the sampled token's log-prob (which prl's
           engine returns too); the sampled tokens and log-probs stay on the device, so no
           step synchronises with the host.

Modes, measured one after the other in this process on the same weights and prompts:

  eager    the decode step as written: the K/V written into cache[:, :, p] by slicing, the
           attention over cache[:, :, :p+1] (no mask: a single query sees its whole prefix);
  graph    the "static cache + CUDA graph" recipe (HF's static cache, gpt-fast): the forward
           of the decode step (embedding to fp32 logits) captured once in a
           torch.cuda.CUDAGraph over static buffers (token, position, an additive mask of
           shape (1, 1, 1, prompt + output): 0 up to p, -inf beyond), the K/V written with
           index_copy_ at the position buffer and the attention over the full cache length
           with the mask, so that every shape is static (GQA folded into the query length:
           the H / KV query heads that share a KV head are that many queries of it, so that
           the masked attention needs no GQA support from SDPA's fused kernels, whose fallback
           for enable_gqa is the math kernel that repeats K/V). Each step sets the position and the
           mask's entry p, replays the graph, then samples outside the graph (as HF's generate
           samples outside its compiled static-cache forward; the sampling kernels queue
           behind the replay, there is no synchronisation in the loop). The prefill is eager.
           CUDA only: on a CPU device this mode reports the error "needs CUDA".

Timing, per mode: a warm-up generation (prefill + --warmup decode steps; for graph also the
side-stream warm-up and the capture) that is not counted, then the timed generation from a
fresh prefill of the same prompts: prefill_s (synchronised before and after, the first token's
sample included), decode_s (the --output steps, from the end of the prefill to a synchronise
after the last step), decode_tokens_per_s = batch * output / decode_s, and step_ms, the median
step time (CUDA events around each step on a GPU, wall clock on the CPU). fp32 runs with TF32
off; --dtype bf16 stores weights, activations and the cache in bf16. A mode that fails (out of
memory, a capture error) is reported with its error and does not stop the others.

Prints one JSON object on stdout: {"framework", "device", "dtype", "batch", "prompt",
"output", "warmup", "attention", "sampling", "modes": {MODE: {"prefill_s", "decode_s",
"decode_tokens_per_s", "step_ms"} or {"error"}}}. Progress on stderr. Stdlib + torch only.

usage: torch_decode_bench.py --hidden 896 --layers 24 --heads 14 --kv-heads 2 \
           --intermediate 4864 --vocab 151936 --tied --batch 1 --prompt 512 --output 512 \
           --dtype bf16 --modes eager,graph
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

MODES = ("eager", "graph")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in [("hidden", 896), ("layers", 24), ("heads", 14), ("kv-heads", 2),
                          ("head-dim", 0), ("intermediate", 4864), ("vocab", 151936),
                          ("batch", 1), ("prompt", 512), ("output", 512), ("warmup", 3),
                          ("seed", 1)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--tied", action="store_true", help="LM head shares the embedding")
    p.add_argument("--no-qkv-bias", action="store_true", help="Llama: no q/k/v biases")
    p.add_argument("--qk-norm", action="store_true",
                   help="Qwen3: RMSNorm of each query and key head before RoPE")
    p.add_argument("--o-bias", action="store_true", help="Qwen3 attention_bias: o_proj bias")
    p.add_argument("--rope-theta", type=float, default=1e6)
    p.add_argument("--rms-eps", type=float, default=1e-6)
    p.add_argument("--dtype", default="bf16", choices=["f32", "bf16"])
    p.add_argument("--modes", default="eager,graph", help="comma-separated: eager, graph")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cuda, cuda:N or cpu (cpu: smoke tests; default cuda when available)")
    a = p.parse_args()
    if a.head_dim == 0:
        a.head_dim = a.hidden // a.heads
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        p.error("--modes: expected eager and/or graph, found %r" % a.modes)
    a.modes = modes
    if a.batch <= 0 or a.prompt <= 0 or a.output <= 0:
        p.error("--batch, --prompt and --output must be positive")
    if a.heads % a.kv_heads != 0:
        p.error("--heads must be a multiple of --kv-heads")
    if a.head_dim % 2 != 0:
        p.error("the head dimension must be even (RoPE)")
    a.warmup = max(1, min(a.warmup, a.output))
    return a


def torch_at_least(major, minor):
    parts = torch.__version__.split("+")[0].split(".")
    return (int(parts[0]), int(parts[1])) >= (major, minor)


def log(msg):
    print("torch_decode_bench: " + msg, file=sys.stderr, flush=True)


def sample(logits):
    """Temperature-1 sample of each row of fp32 logits (B, V) and its log-prob."""
    logp = logits.log_softmax(-1)
    tok = torch.multinomial(logp.exp(), 1)  # (B, 1)
    return tok[:, 0], logp.gather(-1, tok)[:, 0]


class Model:
    """Weights as plain tensors (no autograd), a prefill and a decode step as functions of
    them and of the caller's KV cache."""

    def __init__(self, a, dev, dt):
        self.a, self.dev, self.dt = a, dev, dt
        C, H, KV, D, I, V = a.hidden, a.heads, a.kv_heads, a.head_dim, a.intermediate, a.vocab
        g = torch.Generator(device=dev).manual_seed(a.seed)

        def w(*shape):
            return (torch.randn(*shape, device=dev, generator=g) * 0.02).to(dt)

        def ones(n):
            return torch.ones(n, device=dev, dtype=dt)

        qkv = (H + 2 * KV) * D
        self.embed = w(V, C)
        self.layers = [dict(ln1=ones(C), qkv=w(qkv, C),
                            qkv_b=None if a.no_qkv_bias else w(qkv), o=w(C, H * D),
                            o_b=w(C) if a.o_bias else None,
                            q_norm=ones(D) if a.qk_norm else None,
                            k_norm=ones(D) if a.qk_norm else None,
                            ln2=ones(C), gate_up=w(2 * I, C), down=w(C, I))
                       for _ in range(a.layers)]
        self.norm = ones(C)
        self.lm_head = self.embed if a.tied else w(V, C)
        self.prompts = torch.randint(0, V, (a.batch, a.prompt), device=dev, generator=g)
        self.max_len = a.prompt + a.output
        inv_freq = 1.0 / (a.rope_theta ** (
            torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
        ang = torch.arange(self.max_len, device=dev, dtype=torch.float32)[:, None] * inv_freq[None]
        self.cos, self.sin = ang.cos().to(dt), ang.sin().to(dt)  # (max_len, D / 2)
        if torch_at_least(2, 5):
            self.attention_kind = ("F.scaled_dot_product_attention(enable_gqa); graph decode: "
                                   "GQA folded into the queries, additive mask")
        elif hasattr(F, "scaled_dot_product_attention"):
            self.attention_kind = "F.scaled_dot_product_attention, K/V repeated (torch < 2.5)"
        else:
            self.attention_kind = "matmul + softmax (torch < 2.0)"

    def new_cache(self):
        a = self.a
        shape = (a.batch, a.kv_heads, self.max_len, a.head_dim)
        return ([torch.zeros(shape, device=self.dev, dtype=self.dt) for _ in range(a.layers)],
                [torch.zeros(shape, device=self.dev, dtype=self.dt) for _ in range(a.layers)])

    def rms(self, x, weight):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.a.rms_eps)).to(
            self.dt) * weight

    def rope(self, x, cos, sin):  # x (B, heads, S, D), cos/sin (S, D / 2): rotate_half
        half = self.a.head_dim // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def attention(self, q, k, v, causal=False, mask=None):
        gqa = q.shape[1] != k.shape[1]
        if torch_at_least(2, 5):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                  enable_gqa=gqa)
        if gqa:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        scores = (q @ k.transpose(-1, -2)).float() / (self.a.head_dim ** 0.5)
        if causal:
            S = q.shape[-2]
            tri = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(tri, float("-inf"))
        if mask is not None:
            scores = scores + mask.float()
        return scores.softmax(-1).to(self.dt) @ v

    def block(self, x, l, kc, vc, cos, sin, pos, mask):
        """One layer over x (B, S, C). pos: an int (the first position, slicing: prefill and
        eager decode) or a one-element position tensor (graph decode: index_copy_ and the
        full-length attention with `mask`)."""
        a = self.a
        B, S = x.shape[0], x.shape[1]
        H, KV, D, I = a.heads, a.kv_heads, a.head_dim, a.intermediate
        h = self.rms(x, l["ln1"])
        qkv = F.linear(h, l["qkv"], l["qkv_b"])
        q, k, v = qkv.split([H * D, KV * D, KV * D], dim=-1)
        q, k = q.view(B, S, H, D), k.view(B, S, KV, D)
        if l["q_norm"] is not None:  # Qwen3: per-head RMSNorm before RoPE
            q, k = self.rms(q, l["q_norm"]), self.rms(k, l["k_norm"])
        q = self.rope(q.transpose(1, 2), cos, sin)
        k = self.rope(k.transpose(1, 2), cos, sin)
        v = v.view(B, S, KV, D).transpose(1, 2)
        if isinstance(pos, int):
            kc[:, :, pos:pos + S].copy_(k)
            vc[:, :, pos:pos + S].copy_(v)
            if S > 1:  # prefill (from position 0): attention within the prompt
                att = self.attention(q, k, v, causal=True)
            else:  # one query over the valid prefix, no mask
                att = self.attention(q, kc[:, :, :pos + 1], vc[:, :, :pos + 1])
        else:
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v)
            # GQA folded into the query length: the H / KV query heads of a KV head become
            # that many queries of it (one position, the same mask), so the fused masked SDPA
            # kernels apply rather than the math fallback that repeats K/V.
            att = self.attention(q.reshape(B, KV, H // KV, D), kc, vc, mask=mask)
            att = att.reshape(B, H, 1, D)
        x = x + F.linear(att.transpose(1, 2).reshape(B, S, H * D), l["o"], l["o_b"])
        h = self.rms(x, l["ln2"])
        gu = F.linear(h, l["gate_up"])
        return x + F.linear(F.silu(gu[..., :I]) * gu[..., I:], l["down"])

    def head(self, x):  # x (B, C) -> fp32 logits (B, V)
        return F.linear(self.rms(x, self.norm), self.lm_head).float()

    def prefill(self, cache):
        """The prompts through the model, the cache filled: the first token and its log-prob."""
        P = self.a.prompt
        x = F.embedding(self.prompts, self.embed)
        for l, kc, vc in zip(self.layers, *cache):
            x = self.block(x, l, kc, vc, self.cos[:P], self.sin[:P], 0, None)
        return sample(self.head(x[:, -1]))

    def decode_logits(self, tok, pos, cache, mask=None):
        """One decode step's fp32 logits for tokens tok (B,) at position pos (an int for
        eager; a one-element tensor, with the additive mask, for the graph)."""
        x = F.embedding(tok, self.embed)[:, None]  # (B, 1, C)
        if isinstance(pos, int):
            cos, sin = self.cos[pos:pos + 1], self.sin[pos:pos + 1]
        else:
            cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)
        for l, kc, vc in zip(self.layers, *cache):
            x = self.block(x, l, kc, vc, cos, sin, pos, mask)
        return self.head(x[:, 0])


class Timer:
    """Per-step times: CUDA events (no synchronisation until read) or the wall clock."""

    def __init__(self, cuda, steps):
        self.cuda = cuda
        if cuda:
            self.events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        self.times = []

    def mark(self, i):
        if self.cuda:
            self.events[i].record()
        else:
            self.times.append(time.perf_counter())

    def step_ms(self):  # after a synchronise
        if self.cuda:
            ms = [s.elapsed_time(e) for s, e in zip(self.events, self.events[1:])]
        else:
            ms = [1e3 * (e - s) for s, e in zip(self.times, self.times[1:])]
        return statistics.median(ms)


class EagerDecoder:
    def __init__(self, model, cache):
        self.model, self.cache = model, cache

    def start(self, first_tok):
        self.tok = first_tok

    def step(self, pos):
        self.tok, logp = sample(self.model.decode_logits(self.tok, pos, self.cache))
        return self.tok, logp


class GraphDecoder:
    """The decode forward captured in a CUDA graph over static buffers; sampling outside."""

    def __init__(self, model, cache, warmup_steps):
        a, dev = model.a, model.dev
        self.model, self.cache, self.prompt = model, cache, a.prompt
        self.tok = torch.zeros(a.batch, dtype=torch.long, device=dev)
        self.pos = torch.full((1,), a.prompt, dtype=torch.long, device=dev)
        self.mask = torch.zeros(1, 1, 1, model.max_len, dtype=model.dt, device=dev)
        self.reset_mask()

        def forward():
            return model.decode_logits(self.tok, self.pos, cache, self.mask)

        side = torch.cuda.Stream(device=dev)  # warm-up before capture, as the docs prescribe
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(warmup_steps):
                forward()
        torch.cuda.current_stream(dev).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = forward()  # the static output

    def reset_mask(self):
        self.mask.fill_(float("-inf"))
        self.mask[..., :self.prompt] = 0

    def start(self, first_tok):
        self.reset_mask()
        self.tok.copy_(first_tok)

    def step(self, pos):
        self.pos.fill_(pos)
        self.mask[..., pos] = 0
        self.graph.replay()
        tok, logp = sample(self.logits)
        self.tok.copy_(tok)
        return tok, logp


def generate(model, decoder, steps, sync, cuda):
    """A fresh prefill then `steps` decode steps: (prefill_s, decode_s, step_ms)."""
    a = model.a
    tokens = torch.empty(a.batch, steps, dtype=torch.long, device=model.dev)
    logps = torch.empty(a.batch, steps, dtype=torch.float32, device=model.dev)
    timer = Timer(cuda, steps)
    sync()
    start = time.perf_counter()
    first, _ = model.prefill(decoder.cache)
    sync()
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    decoder.start(first)
    timer.mark(0)
    for i in range(steps):
        tok, logp = decoder.step(a.prompt + i)
        tokens[:, i] = tok
        logps[:, i] = logp
        timer.mark(i + 1)
    sync()
    decode_s = time.perf_counter() - start
    return prefill_s, decode_s, timer.step_ms()


def measure(model, mode, a, sync, cuda):
    if mode == "graph" and not cuda:
        raise RuntimeError("needs CUDA")
    cache = model.new_cache()
    start = time.perf_counter()
    if mode == "graph":
        decoder = GraphDecoder(model, cache, a.warmup)
    else:
        decoder = EagerDecoder(model, cache)
    generate(model, decoder, a.warmup, sync, cuda)
    log("%s: warm-up (prefill + %d steps%s) %.2f s" % (
        mode, a.warmup, ", capture" if mode == "graph" else "", time.perf_counter() - start))
    prefill_s, decode_s, step_ms = generate(model, decoder, a.output, sync, cuda)
    r = {"prefill_s": prefill_s, "decode_s": decode_s,
         "decode_tokens_per_s": a.batch * a.output / decode_s, "step_ms": step_ms}
    log("%s: prefill %.4f s, decode %.4f s (%.1f tokens/s, median step %.3f ms)" % (
        mode, prefill_s, decode_s, r["decode_tokens_per_s"], step_ms))
    return r


def main():
    a = parse_args()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("torch_decode_bench: --device %s but torch sees no GPU" % a.device)
    if cuda and dev.index is not None:
        torch.cuda.set_device(dev)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dt = torch.float32 if a.dtype == "f32" else torch.bfloat16
    torch.manual_seed(a.seed)  # the sampling

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    out = {"framework": "pytorch " + torch.__version__,
           "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
           "dtype": a.dtype, "batch": a.batch, "prompt": a.prompt, "output": a.output,
           "warmup": a.warmup, "attention": None,
           "sampling": "torch.multinomial of the softmax; graph: outside the graph", "modes": {}}
    with torch.inference_mode():
        model = None
        try:
            model = Model(a, dev, dt)
            out["attention"] = model.attention_kind
        except (RuntimeError, MemoryError) as e:  # torch.cuda.OutOfMemoryError: RuntimeError
            for mode in a.modes:
                out["modes"][mode] = {"error": "building the model: %s" % str(e).split("\n")[0]}
        for mode in a.modes if model is not None else []:
            try:
                out["modes"][mode] = measure(model, mode, a, sync, cuda)
            except Exception as e:  # noqa: BLE001 (OOM, a capture error, ...: report, go on)
                msg = str(e).strip().split("\n")[0][:300]
                if not (isinstance(e, RuntimeError) and msg == "needs CUDA"):
                    msg = "%s: %s" % (type(e).__name__, msg)
                log("%s failed: %s" % (mode, msg))
                out["modes"][mode] = {"error": msg}
            if cuda:
                try:
                    sync()
                except Exception:  # noqa: BLE001 (a failed capture may leave an error behind)
                    pass
                torch.cuda.empty_cache()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
