#!/usr/bin/python3
"""Independent float64 PyTorch reference for Llama / Qwen2 / Qwen3 / Qwen3-MoE decoders.

ctest uses this file to check prl's C++ forward and backward passes.  It is
deliberately independent of prl: it shares no code with it, and it uses
neither `transformers` nor `safetensors` (only the stdlib, numpy and torch),
so a misreading of the Hugging Face format or of the model maths in the C++
code cannot be silently repeated here.  The maths follows transformers'
LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM (eager attention) in
float64 (Qwen3: RMSNorm of each query and key head before RoPE, head_dim from
the config, attention_bias on q/k/v and o_proj; Qwen3-MoE: transformers'
Qwen3MoeSparseMoeBlock, a softmax router over all experts, the top k kept,
renormalised iff norm_topk_prob, in the layers decoder_sparse_step and
mlp_only_layers select), and the
gradients come from torch autograd.  The one deliberate non-float64 step is
the RoPE angle, which transformers computes in float32: it is mirrored bit for
bit, and only its cos/sin are taken in float64.

Subcommands (`torch_reference.py CMD --help` lists the options):
  make-checkpoint      write a random Hugging Face model directory
  gen-input            write random scoring requests as JSONL
  score                write this reference's log-probs (and gradients) in
                       prl's output format
  check-score          compare prl's log-probs / gradients with this reference
  check-grad-selftest  check autograd against central finite differences
  make-adapter         write a random PEFT LoRA adapter directory for a model

LoRA adapters (check-score --adapter DIR) follow peft's LoraLayer: every
targeted projection adds scale * (h @ A^T) @ B^T to its output, scale =
lora_alpha / r (use_rslora: lora_alpha / sqrt(r)), with peft's tensor names
(base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}.weight)
read from adapter_model.safetensors; the adapter's gradients are checked too.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

# --- safetensors -------------------------------------------------------------


def _bf16_bits(a):
    """float32 -> bfloat16 bit patterns, rounding to nearest even."""
    bits = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


_ENCODE = {"F32": lambda a: a.astype("<f4"), "F16": lambda a: a.astype("<f2"),
           "BF16": _bf16_bits}
_DECODE = {"F32": lambda b: np.frombuffer(b, "<f4"),
           "F16": lambda b: np.frombuffer(b, "<f2"),
           "BF16": lambda b: (np.frombuffer(b, "<u2").astype("<u4") << 16)
           .view("<f4")}
_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}


def write_safetensors(path, tensors, dtype="F32"):
    """Write {name: float32 array} to `path`, every tensor stored as dtype."""
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        a = np.asarray(a, dtype=np.float32)
        blob = np.ascontiguousarray(_ENCODE[dtype](a)).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # pad the header to a multiple of 8
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    """Read a safetensors file (F32/BF16/F16) into {name: float32 array}."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8]) if len(raw) >= 8 else (len(raw),)
    if 8 + n > len(raw):
        raise ValueError("%s: truncated safetensors header" % path)
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data, out = memoryview(raw)[8 + n:], {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape = info["dtype"], tuple(int(s) for s in info["shape"])
        begin, end = info["data_offsets"]
        if dtype not in _DECODE:
            raise ValueError("%s: %s has dtype %s" % (path, name, dtype))
        if (end - begin != int(np.prod(shape)) * _ITEMSIZE[dtype]
                or end > len(data)):
            raise ValueError("%s: bad data_offsets for %s" % (path, name))
        a = _DECODE[dtype](data[begin:end]).astype(np.float32)
        out[name] = a.reshape(shape)
    return out


# --- configuration, parameter layout, checkpoints ---------------------------


class Config:
    """The config.json fields the model maths needs."""

    def __init__(self, raw):
        self.arch = raw.get("model_type")
        if self.arch not in ("llama", "qwen2", "qwen3", "qwen3_moe"):
            raise ValueError("unsupported model_type %r" % self.arch)
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError("unsupported hidden_act %r" % raw["hidden_act"])
        if self.arch == "llama" and raw.get("attention_bias", False):
            raise ValueError("llama with attention_bias is not supported")
        self.hidden, self.inter = raw["hidden_size"], raw["intermediate_size"]
        self.layers, self.vocab = raw["num_hidden_layers"], raw["vocab_size"]
        self.heads = raw["num_attention_heads"]
        self.kv_heads = raw.get("num_key_value_heads") or self.heads
        # Qwen3Config's head_dim defaults to 128, not hidden / heads.
        # (Qwen3MoeConfig's falls back to hidden / heads.)
        self.head_dim = raw.get("head_dim") or (
            128 if self.arch == "qwen3" else self.hidden // self.heads)
        self.eps = float(raw.get("rms_norm_eps", 1e-6))
        self.theta = float(raw.get("rope_theta", 10000.0))
        self.tie = bool(raw.get("tie_word_embeddings", False))
        self.rope_scaling = raw.get("rope_scaling")
        # Qwen2 always has q/k/v biases; Qwen3 has q/k/v and o_proj biases
        # iff attention_bias.
        qwen3 = self.arch in ("qwen3", "qwen3_moe")
        qwen3_bias = qwen3 and bool(raw.get("attention_bias"))
        self.bias = self.arch == "qwen2" or qwen3_bias
        self.o_bias = qwen3_bias
        self.qk_norm = qwen3
        moe = self.arch == "qwen3_moe"  # Qwen3MoeConfig's defaults
        self.experts = raw.get("num_experts", 128) if moe else 0
        self.top_k = raw.get("num_experts_per_tok", 8)
        self.moe_inter = raw.get("moe_intermediate_size", 768)
        self.norm_topk = bool(raw.get("norm_topk_prob", False))
        self.sparse_step = raw.get("decoder_sparse_step", 1)
        self.mlp_only = list(raw.get("mlp_only_layers") or [])
        if raw.get("output_router_logits"):
            raise ValueError("output_router_logits (the aux loss) is not modelled")
        if raw.get("use_sliding_window"):
            raise ValueError("sliding windows are not supported")
        if self.heads % self.kv_heads:
            raise ValueError("num_attention_heads % num_key_value_heads != 0")

    def is_moe(self, i):
        """transformers' Qwen3MoeDecoderLayer choice of the sparse block."""
        return (i not in self.mlp_only and self.experts > 0
                and (i + 1) % self.sparse_step == 0)


def param_shapes(cfg):
    """[(HF tensor name, shape)] in canonical order."""
    C, I, D, V = cfg.hidden, cfg.inter, cfg.head_dim, cfg.vocab
    Q, KV = cfg.heads * D, cfg.kv_heads * D
    attn = [("q_proj.weight", (Q, C)), ("k_proj.weight", (KV, C)),
            ("v_proj.weight", (KV, C))]
    if cfg.bias:
        attn += [("q_proj.bias", (Q,)), ("k_proj.bias", (KV,)),
                 ("v_proj.bias", (KV,))]
    if cfg.o_bias:
        attn.append(("o_proj.bias", (C,)))
    if cfg.qk_norm:
        attn += [("q_norm.weight", (D,)), ("k_norm.weight", (D,))]
    layer = ([("input_layernorm.weight", (C,))]
             + [("self_attn." + n, s) for n, s in attn]
             + [("self_attn.o_proj.weight", (C, Q)),
                ("post_attention_layernorm.weight", (C,))])
    dense = [("mlp.gate_proj.weight", (I, C)), ("mlp.up_proj.weight", (I, C)),
             ("mlp.down_proj.weight", (C, I))]
    Im = cfg.moe_inter
    sparse = [("mlp.gate.weight", (cfg.experts, C))]
    for e in range(cfg.experts):
        sparse += [("mlp.experts.%d.gate_proj.weight" % e, (Im, C)),
                   ("mlp.experts.%d.up_proj.weight" % e, (Im, C)),
                   ("mlp.experts.%d.down_proj.weight" % e, (C, Im))]
    out = [("model.embed_tokens.weight", (V, C))]
    for i in range(cfg.layers):
        mlp = sparse if cfg.is_moe(i) else dense
        out += [("model.layers.%d.%s" % (i, n), s) for n, s in layer + mlp]
    out.append(("model.norm.weight", (C,)))
    return out + ([] if cfg.tie else [("lm_head.weight", (V, C))])


def random_params(cfg, rng):
    """Random float32 weights giving O(1) activations and logits.

    Matrices ~ normal(0, 1/sqrt(fan_in)), norm weights ~ uniform(0.8, 1.2),
    biases ~ normal(0, 0.1).
    """
    out = {}
    for name, shape in param_shapes(cfg):
        if name.endswith("norm.weight"):
            a = rng.uniform(0.8, 1.2, size=shape)
        elif name.endswith(".bias"):
            a = rng.normal(0.0, 0.1, size=shape)
        else:
            a = rng.normal(0.0, 1.0 / math.sqrt(shape[1]), size=shape)
        out[name] = a.astype(np.float32)
    return out


def make_config(args):
    """config.json contents for the make-checkpoint arguments."""
    llama = args.arch == "llama"
    raw = {
        "architectures": [{"llama": "LlamaForCausalLM",
                           "qwen2": "Qwen2ForCausalLM",
                           "qwen3": "Qwen3ForCausalLM",
                           "qwen3_moe": "Qwen3MoeForCausalLM"}[args.arch]],
        "model_type": args.arch, "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "vocab_size": args.vocab_size, "rms_norm_eps": 1e-6,
        "rope_theta": args.rope_theta,
        "max_position_embeddings": args.max_position_embeddings,
        "tie_word_embeddings": args.tie_embeddings, "hidden_act": "silu",
        "rope_scaling": None,
        "torch_dtype": {"f32": "float32", "bf16": "bfloat16",
                        "f16": "float16"}[args.dtype],
        "attention_bias" if llama else "use_sliding_window": False,
    }
    if args.head_dim is not None:
        raw["head_dim"] = args.head_dim
    if args.arch in ("qwen3", "qwen3_moe"):  # a released config.json's keys
        raw.update({"attention_bias": bool(args.attention_bias),
                    "attention_dropout": 0.0, "sliding_window": None,
                    "max_window_layers": args.layers, "use_cache": True})
    if args.arch == "qwen3_moe":
        raw.update({"num_experts": args.num_experts,
                    "num_experts_per_tok": args.top_k,
                    "moe_intermediate_size": args.moe_intermediate_size,
                    "norm_topk_prob": bool(args.norm_topk_prob),
                    "decoder_sparse_step": args.decoder_sparse_step,
                    "mlp_only_layers": [int(x) for x in
                                        (args.mlp_only_layers or "").split(",")
                                        if x],
                    "router_aux_loss_coef": 0.001,
                    "output_router_logits": False})
    if args.attention_bias and args.arch not in ("qwen3", "qwen3_moe"):
        raise ValueError("--attention-bias is for qwen3 and qwen3_moe only")
    if args.rope_scaling == "linear":
        raw["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    elif args.rope_scaling == "llama3":
        # original_max_position_embeddings = P/4 puts the frequencies of small
        # test models in all three llama3 regimes (kept, smoothed, scaled).
        raw["rope_scaling"] = {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings":
                max(1, args.max_position_embeddings // 4)}
    return raw


def save_checkpoint(out_dir, raw_cfg, params, dtype, shards):
    """Write config.json and the (optionally sharded) safetensors weights."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(raw_cfg, f, indent=2)
    if shards <= 1:
        write_safetensors(os.path.join(out_dir, "model.safetensors"), params,
                          dtype)
        return
    names = list(params)
    if shards > len(names):
        raise ValueError("more shards than tensors")
    size = {n: params[n].size * _ITEMSIZE[dtype] for n in names}
    total, acc, groups = sum(size.values()), 0, [[]]
    for i, n in enumerate(names):
        # Open the next shard once this one holds its share of the bytes, or
        # when every remaining shard needs one of the remaining tensors.
        if groups[-1] and len(groups) < shards and (
                acc >= total * len(groups) / shards
                or len(names) - i <= shards - len(groups)):
            groups.append([])
        groups[-1].append(n)
        acc += size[n]
    weight_map = {}
    for k, group in enumerate(groups):
        fname = "model-%05d-of-%05d.safetensors" % (k + 1, shards)
        write_safetensors(os.path.join(out_dir, fname),
                          {n: params[n] for n in group}, dtype)
        weight_map.update((n, fname) for n in group)
    with open(os.path.join(out_dir, "model.safetensors.index.json"),
              "w") as f:
        json.dump({"metadata": {"total_size": total},
                   "weight_map": weight_map}, f, indent=2)


def load_checkpoint(model_dir):
    """Read a HF directory: (Config, {name: float64 leaf tensor})."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = Config(json.load(f))
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
        arrays = {}
        for fname in sorted(set(weight_map.values())):
            part = read_safetensors(os.path.join(model_dir, fname))
            if {n for n, f in weight_map.items() if f == fname} != set(part):
                raise ValueError("%s does not hold what the index says"
                                 % fname)
            arrays.update(part)
    else:
        arrays = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    expected = dict(param_shapes(cfg))
    if set(arrays) != set(expected):
        raise ValueError("tensors differ from config: missing %s, extra %s"
                         % (sorted(set(expected) - set(arrays)),
                            sorted(set(arrays) - set(expected))))
    for name, shape in expected.items():
        if arrays[name].shape != shape:
            raise ValueError("%s has shape %s, expected %s"
                             % (name, arrays[name].shape, shape))
    return cfg, {n: torch.from_numpy(arrays[n].astype(np.float64))
                 .requires_grad_() for n in expected}


# --- model maths -------------------------------------------------------------


def rope_inv_freq(cfg):
    """float32 inverse frequencies, computed exactly as transformers does."""
    D = cfg.head_dim
    inv = 1.0 / (cfg.theta ** (torch.arange(0, D, 2, dtype=torch.int64)
                               .float() / D))
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / rs["factor"]
    if kind == "llama3":  # transformers' _compute_llama3_parameters
        factor, lo, hi = (rs["factor"], rs["low_freq_factor"],
                          rs["high_freq_factor"])
        old_len = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > old_len / lo, inv / factor, inv)
        smooth = (old_len / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < old_len / hi) * ~(wavelen > old_len / lo)
        return torch.where(medium, smoothed, inv_l)
    raise ValueError("unsupported rope_scaling type %r" % kind)


def rope_tables(cfg, T):
    """cos, sin (T, head_dim): float64 of the float32 angles."""
    pos = torch.arange(T, dtype=torch.int64).float()
    angle = pos[:, None] * rope_inv_freq(cfg)[None, :]  # float32 product
    emb = torch.cat([angle, angle], dim=-1).double()
    return emb.cos(), emb.sin()


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def sparse_moe_block(cfg, w, h, router_log=None):
    """transformers' Qwen3MoeSparseMoeBlock: h (T, C) -> (T, C). router_log, if given,
    receives (probs (T, E), chosen (T, K)) for the load-balancing loss."""
    probs = torch.softmax(h @ w["mlp.gate.weight"].t(), dim=-1)
    top, chosen = torch.topk(probs, cfg.top_k, dim=-1)
    if router_log is not None:
        router_log.append((probs, chosen))
    if cfg.norm_topk:
        top = top / top.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(h)
    for e in range(cfg.experts):
        rows, slot = torch.where(chosen == e)
        if rows.numel() == 0:
            continue
        pre = "mlp.experts.%d." % e
        x = h[rows]
        y = (torch.nn.functional.silu(x @ w[pre + "gate_proj.weight"].t())
             * (x @ w[pre + "up_proj.weight"].t())) @ w[pre + "down_proj.weight"].t()
        out = out.index_add(0, rows, y * top[rows, slot, None])
    return out


def forward(cfg, params, tokens, temperature=1.0, router_log=None,
            adapter=None):
    """Log-probabilities (T, vocab) of softmax(logits / temperature).

    adapter: None, or (scale, {peft name: tensor}) of a LoRA adapter.
    """
    T, D, H, KV = len(tokens), cfg.head_dim, cfg.heads, cfg.kv_heads
    x = params["model.embed_tokens.weight"][torch.as_tensor(tokens)]
    cos, sin = rope_tables(cfg, T)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    for i in range(cfg.layers):
        prefix = "model.layers.%d." % i
        w = {n[len(prefix):]: t for n, t in params.items()
             if n.startswith(prefix)}

        def lora(part, module, h, i=i):  # peft: scale * lora_B(lora_A(h))
            if adapter is None:
                return 0.0
            scale, tensors = adapter
            key = "base_model.model.model.layers.%d.%s.%s." % (i, part, module)
            if key + "lora_A.weight" not in tensors:
                return 0.0
            a, b = tensors[key + "lora_A.weight"], tensors[key + "lora_B.weight"]
            return scale * ((h @ a.t()) @ b.t())

        def proj(h, name, heads):  # -> (heads, T, D)
            y = h @ w["self_attn.%s.weight" % name].t() + lora("self_attn", name, h)
            if cfg.bias:
                y = y + w["self_attn.%s.bias" % name]
            return y.view(T, heads, D).transpose(0, 1)

        def head_norm(y, name):  # Qwen3: RMSNorm over each head's D values
            if not cfg.qk_norm:
                return y
            return rms_norm(y, w["self_attn.%s.weight" % name], cfg.eps)

        h = rms_norm(x, w["input_layernorm.weight"], cfg.eps)
        q = apply_rope(head_norm(proj(h, "q_proj", H), "q_norm"), cos, sin)
        k = apply_rope(head_norm(proj(h, "k_proj", KV), "k_norm"), cos, sin)
        # GQA: query head j reads kv head j // (H / KV).
        k = k.repeat_interleave(H // KV, dim=0)
        v = proj(h, "v_proj", KV).repeat_interleave(H // KV, dim=0)
        scores = (q @ k.transpose(1, 2)) / math.sqrt(D)
        attn = torch.softmax(scores.masked_fill(future, float("-inf")), -1)
        o = (attn @ v).transpose(0, 1).reshape(T, H * D)
        x = x + o @ w["self_attn.o_proj.weight"].t() + lora("self_attn", "o_proj", o)
        if cfg.o_bias:
            x = x + w["self_attn.o_proj.bias"]
        h = rms_norm(x, w["post_attention_layernorm.weight"], cfg.eps)
        if cfg.is_moe(i):
            x = x + sparse_moe_block(cfg, w, h, router_log)
            continue
        gate = torch.nn.functional.silu(
            h @ w["mlp.gate_proj.weight"].t() + lora("mlp", "gate_proj", h))
        up = h @ w["mlp.up_proj.weight"].t() + lora("mlp", "up_proj", h)
        act = gate * up
        x = x + act @ w["mlp.down_proj.weight"].t() + lora("mlp", "down_proj", act)
    x = rms_norm(x, params["model.norm.weight"], cfg.eps)
    head = params["model.embed_tokens.weight" if cfg.tie else "lm_head.weight"]
    return torch.log_softmax(x @ head.t() / temperature, dim=-1)


def score_line(cfg, params, tokens, score_from, temperature=1.0, router_log=None,
               adapter=None):
    """log p(tokens[i] | tokens[:i]) for i in [score_from, len(tokens))."""
    if not 1 <= score_from < len(tokens):
        raise ValueError("need 1 <= score_from < len(tokens)")
    logp = forward(cfg, params, tokens[:-1], temperature, router_log, adapter)
    rows = torch.arange(score_from - 1, len(tokens) - 1)
    return logp[rows, torch.as_tensor(tokens[score_from:])]


def score_all(cfg, params, requests, want_grads, temperature=1.0,
              adapter=None):
    """Score every request, one sequence at a time.

    Returns (list of float64 arrays, {name: gradient array} or None); the
    gradients are those of the loss -(sum of all scored log-probs), of the
    adapter's tensors too when one is given.
    """
    results = []
    for req in requests:
        lp = score_line(cfg, params, req["tokens"], req["score_from"],
                        temperature, adapter=adapter)
        if want_grads:
            (-lp.sum()).backward()
        results.append(lp.detach().numpy())
    if not want_grads:
        return results, None
    every = dict(params)
    if adapter is not None:
        every.update(adapter[1])
    return results, {n: (t.grad if t.grad is not None
                         else torch.zeros_like(t)).numpy()
                     for n, t in every.items()}


_LORA_MODULES = [("self_attn", m) for m in ("q_proj", "k_proj", "v_proj", "o_proj")] + \
    [("mlp", m) for m in ("gate_proj", "up_proj", "down_proj")]


def load_adapter(adapter_dir):
    """A peft LoRA directory: (scale, {peft name: float64 leaf tensor})."""
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        conf = json.load(f)
    if conf.get("peft_type") != "LORA":
        raise ValueError("peft_type %r" % conf.get("peft_type"))
    r, alpha = conf["r"], conf["lora_alpha"]
    scale = alpha / math.sqrt(r) if conf.get("use_rslora") else alpha / r
    arrays = read_safetensors(
        os.path.join(adapter_dir, "adapter_model.safetensors"))
    for name, a in arrays.items():
        if name.endswith("lora_A.weight") and a.shape[0] != r:
            raise ValueError("%s has shape %s for r = %d" % (name, a.shape, r))
    return scale, {n: torch.from_numpy(a.astype(np.float64)).requires_grad_()
                   for n, a in arrays.items()}


def cmd_make_adapter(args):
    """A random adapter: A ~ uniform(+-1/sqrt(in)), B ~ normal(0, b_std)."""
    with open(os.path.join(args.model, "config.json")) as f:
        cfg = Config(json.load(f))
    shapes = dict(param_shapes(cfg))
    targets = args.targets.split(",")
    if targets == ["all-linear"]:
        targets = [m for _, m in _LORA_MODULES]
    rng = np.random.default_rng(args.seed)
    tensors = {}
    for i in range(cfg.layers):
        for part, module in _LORA_MODULES:
            if module not in targets:
                continue
            base = "model.layers.%d.%s.%s.weight" % (i, part, module)
            if base not in shapes:
                raise SystemExit("%s: no %s (a MoE layer?)" % (args.model, base))
            out_f, in_f = shapes[base]
            key = "base_model.model.model.layers.%d.%s.%s." % (i, part, module)
            tensors[key + "lora_A.weight"] = rng.uniform(
                -1.0 / math.sqrt(in_f), 1.0 / math.sqrt(in_f),
                size=(args.rank, in_f)).astype(np.float32)
            tensors[key + "lora_B.weight"] = rng.normal(
                0.0, args.b_std, size=(out_f, args.rank)).astype(np.float32)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM",
                   "base_model_name_or_path": args.model, "r": args.rank,
                   "lora_alpha": args.alpha, "use_rslora": args.rslora,
                   "target_modules": args.targets.split(","),
                   "lora_dropout": 0.05, "bias": "none",
                   "fan_in_fan_out": False, "use_dora": False,
                   "rank_pattern": {}, "alpha_pattern": {},
                   "layers_to_transform": None, "modules_to_save": None},
                  f, indent=2)
    write_safetensors(os.path.join(args.out, "adapter_model.safetensors"),
                      tensors, args.dtype.upper())
    print("wrote %s (%d tensors)" % (args.out, len(tensors)))
    return 0


def load_balancing_loss(cfg, router_log):
    """transformers' load_balancing_loss_func over every (probs, chosen) logged, all layers and
    tokens concatenated: E * sum_e f_e P_e, f_e the share of (row, k) choices of expert e per
    row, P_e the mean router probability of e. Differentiable through the probabilities."""
    probs = torch.cat([p for p, _ in router_log])
    chosen = torch.cat([c for _, c in router_log])
    mask = torch.nn.functional.one_hot(chosen, cfg.experts).double()  # (rows, K, E)
    tokens_per_expert = mask.mean(dim=0)                                # (K, E)
    prob_per_expert = probs.mean(dim=0)                                 # (E)
    return cfg.experts * (tokens_per_expert * prob_per_expert[None, :]).sum()


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# --- subcommands -------------------------------------------------------------


def cmd_make_checkpoint(args):
    raw = make_config(args)
    params = random_params(Config(raw), np.random.default_rng(args.seed))
    dtype = {"f32": "F32", "bf16": "BF16", "f16": "F16"}[args.dtype]
    save_checkpoint(args.out, raw, params, dtype, args.shards)
    print("wrote %s (%d tensors, %s)" % (args.out, len(params), dtype))
    return 0


def cmd_gen_input(args):
    if not 2 <= args.min_len <= args.max_len:
        raise SystemExit("need 2 <= --min-len <= --max-len")
    rng = np.random.default_rng(args.seed)
    with open(args.out, "w") as f:
        for _ in range(args.lines):
            n = int(rng.integers(args.min_len, args.max_len + 1))
            tokens = rng.integers(0, args.vocab_size, size=n).tolist()
            f.write(json.dumps({"tokens": tokens,
                                "score_from": int(rng.integers(1, n))}) + "\n")
    return 0


def cmd_score(args):
    cfg, params = load_checkpoint(args.model)
    results, grads = score_all(cfg, params, read_jsonl(args.input),
                               args.grads is not None, args.temperature)
    with open(args.output, "w") as f:
        f.writelines(json.dumps({"logprobs": lp.tolist()}) + "\n"
                     for lp in results)
    if grads is not None:
        write_safetensors(args.grads, grads)
    return 0


def check_grads(grads, path, rtol):
    """Print per-tensor relative gradient errors; return failure messages."""
    got, failures, rel = read_safetensors(path), [], []
    if set(got) != set(grads):
        failures.append("gradient names differ: missing %s, unexpected %s"
                        % (sorted(set(grads) - set(got)),
                           sorted(set(got) - set(grads))))
    for name in set(got) & set(grads):
        g, r = got[name].astype(np.float64), grads[name]
        if g.shape != r.shape:
            failures.append("%s: gradient shape %s, expected %s"
                            % (name, g.shape, r.shape))
            continue
        e = np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-30)
        rel.append((e if np.isfinite(e) else math.inf, name))
    rel.sort(reverse=True)
    bad = [(e, n) for e, n in rel if e > rtol]
    print("gradient relative error, worst first (rtol %.1e):" % rtol)
    for e, name in rel[:max(5, len(bad))]:
        print("  %.3e  %s%s" % (e, name, "  <-- FAIL" if e > rtol else ""))
    if bad:
        failures.append("%d gradient(s) above rtol, worst %s (%.3e)"
                        % (len(bad), bad[0][1], bad[0][0]))
    return failures


def cmd_check_score(args):
    cfg, params = load_checkpoint(args.model)
    requests, prl = read_jsonl(args.input), read_jsonl(args.logprobs)
    if len(prl) != len(requests):
        print("FAIL: %s has %d lines, %s has %d"
              % (args.logprobs, len(prl), args.input, len(requests)))
        return 1
    adapter = load_adapter(args.adapter) if args.adapter else None
    ref, grads = score_all(cfg, params, requests, args.grads is not None,
                           args.temperature, adapter)
    failures, worst, where = [], 0.0, ""
    for line, (r, p) in enumerate(zip(ref, prl), start=1):
        got = np.asarray(p.get("logprobs", []), dtype=np.float64)
        if got.shape != r.shape:
            failures.append("line %d: %d logprobs, expected %d"
                            % (line, got.size, r.size))
        elif not np.all(np.isfinite(got)):
            failures.append("line %d: non-finite logprob" % line)
        elif r.size and np.abs(got - r).max() > worst:
            worst = np.abs(got - r).max()
            where = " (line %d, index %d)" % (line, np.abs(got - r).argmax())
    print("lines: %d, scored tokens: %d"
          % (len(ref), sum(r.size for r in ref)))
    print("max |logprob error|: %.3e%s, atol %.1e"
          % (worst, where, args.logprob_atol))
    if worst > args.logprob_atol:
        failures.append("logprob error %.3e > atol %.1e"
                        % (worst, args.logprob_atol))
    if grads is not None:
        failures += check_grads(grads, args.grads, args.grad_rtol)
    print("FAIL: " + "; ".join(failures) if failures else "PASS")
    return 1 if failures else 0


def cmd_check_grad_selftest(args):
    """Autograd vs central differences on tiny random models.

    Besides the required qwen2 model, a tied llama with llama3 RoPE scaling and
    two Qwen3 models (per-head q/k norms with head_dim 8 = 2 x hidden / heads;
    with and without attention biases, so q_norm / k_norm / o_proj.bias are
    checked) are covered too.  Also checks that log-probs are normalised and
    causal.
    """
    ok = True
    for arch, tie, scaling, head_dim, bias, moe in [
            ("qwen2", False, "none", None, False, None),
            ("llama", True, "llama3", None, False, None),
            ("qwen3", True, "none", 8, True, None),
            ("qwen3", False, "none", 8, False, None),
            # Qwen3-MoE: (norm_topk_prob, decoder_sparse_step, mlp_only_layers)
            ("qwen3_moe", True, "none", 8, False, (True, 1, "")),
            ("qwen3_moe", False, "none", 8, True, (False, 1, "0"))]:
        norm_topk, sparse_step, mlp_only = moe or (False, 1, "")
        cfg = Config(make_config(argparse.Namespace(
            arch=arch, hidden_size=16, layers=2, heads=4, kv_heads=2,
            intermediate_size=24, vocab_size=11, head_dim=head_dim,
            tie_embeddings=tie, dtype="f32", rope_theta=10000.0,
            rope_scaling=scaling, max_position_embeddings=32,
            attention_bias=bias, num_experts=4, top_k=2,
            moe_intermediate_size=6, norm_topk_prob=norm_topk,
            decoder_sparse_step=sparse_step, mlp_only_layers=mlp_only)))
        rng = np.random.default_rng(1234)
        params = {n: torch.from_numpy(a.astype(np.float64)).requires_grad_()
                  for n, a in random_params(cfg, rng).items()}
        tokens = rng.integers(0, cfg.vocab, size=9).tolist()
        with torch.no_grad():
            logp = forward(cfg, params, tokens)
            changed = tokens[:5] + [(tokens[5] + 1) % cfg.vocab] + tokens[6:]
            diff = (logp - forward(cfg, params, changed)).abs().amax(-1)
        # Earlier positions within float64 rounding, not bit for bit: a MoE expert's rows are
        # gathered and multiplied as one batch, so a later token routed elsewhere changes the
        # batch's shape and the BLAS kernel's summation order (4e-16 seen); a causality leak
        # would be orders of magnitude larger.
        if ((logp.exp().sum(-1) - 1).abs().max() > 1e-12
                or diff[:5].max() > 1e-12 or diff[5:].min() == 0):
            print("  %s: log-probs not normalised or not causal (%.3e before the change)"
                  % (arch, float(diff[:5].max())))
            ok = False

        def loss():
            return -score_line(cfg, params, tokens, 3).sum().item()

        (-score_line(cfg, params, tokens, 3).sum()).backward()
        worst, step = 0.0, 1e-5
        for name, t in sorted(params.items()):
            for _ in range(3):
                idx = tuple(int(rng.integers(s)) for s in t.shape)
                if name == "model.embed_tokens.weight":  # pick a used row
                    idx = (int(rng.choice(tokens)),) + idx[1:]
                with torch.no_grad():
                    orig = t[idx].item()
                    t[idx] = orig + step
                    up = loss()
                    t[idx] = orig - step
                    down = loss()
                    t[idx] = orig
                # (An expert no token was routed to has no gradient.)
                ad = 0.0 if t.grad is None else t.grad[idx].item()
                fd = (up - down) / (2 * step)
                # Floor of 1e-3 in the denominator: entries with a tiny
                # gradient are not judged by finite-difference rounding noise.
                err = abs(fd - ad) / max(abs(fd), abs(ad), 1e-3)
                worst = max(worst, err)
                if err >= 1e-6:
                    print("  %s%s: autograd %.10e, finite difference %.10e"
                          % (name, idx, ad, fd))
                    ok = False
        print("%s (tied=%s, rope_scaling=%s, attention_bias=%s%s): worst "
              "relative error %.3e" % (arch, tie, scaling, bias,
                                       "" if moe is None else
                                       ", norm_topk_prob=%s, mlp_only_layers=[%s]"
                                       % (norm_topk, mlp_only), worst))
    print("PASS" if ok else "FAIL: gradient self-test")
    return 0 if ok else 1


_REQ, _STR = {"required": True}, {}
_INT, _FLOAT = {"type": int, "required": True}, {"type": float}
_COMMANDS = {  # subcommand: (handler, help, [(flag, add_argument kwargs)])
    "make-checkpoint": (cmd_make_checkpoint, "write a random HF model dir", [
        ("--arch", {"choices": ["qwen2", "llama", "qwen3", "qwen3_moe"],
                    "required": True}),
        ("--attention-bias", {"action": "store_true"}),
        ("--num-experts", {"type": int, "default": 8}),
        ("--top-k", {"type": int, "default": 2}),
        ("--moe-intermediate-size", {"type": int, "default": 32}),
        ("--norm-topk-prob", {"action": "store_true"}),
        ("--decoder-sparse-step", {"type": int, "default": 1}),
        ("--mlp-only-layers", {"default": ""}),
        ("--hidden-size", _INT), ("--layers", _INT), ("--heads", _INT),
        ("--kv-heads", _INT), ("--intermediate-size", _INT),
        ("--vocab-size", _INT), ("--head-dim", {"type": int}),
        ("--tie-embeddings", {"action": "store_true"}),
        ("--dtype", {"choices": ["f32", "bf16", "f16"], "default": "f32"}),
        ("--shards", {"type": int, "default": 1}),
        ("--rope-theta", dict(_FLOAT, default=10000.0)),
        ("--rope-scaling", {"choices": ["none", "linear", "llama3"],
                            "default": "none"}),
        ("--max-position-embeddings", {"type": int, "default": 2048}),
        ("--seed", _INT), ("--out", _REQ)]),
    "gen-input": (cmd_gen_input, "write random scoring requests", [
        ("--vocab-size", _INT), ("--lines", _INT), ("--min-len", _INT),
        ("--max-len", _INT), ("--seed", _INT), ("--out", _REQ)]),
    "score": (cmd_score, "write the reference's own results", [
        ("--model", _REQ), ("--input", _REQ), ("--output", _REQ),
        ("--grads", _STR), ("--temperature", dict(_FLOAT, default=1.0))]),
    "check-score": (cmd_check_score, "compare prl's results", [
        ("--model", _REQ), ("--input", _REQ), ("--logprobs", _REQ),
        ("--grads", _STR), ("--logprob-atol", dict(_FLOAT, default=1e-4)),
        ("--grad-rtol", dict(_FLOAT, default=1e-3)),
        ("--temperature", dict(_FLOAT, default=1.0)),
        ("--adapter", _STR)]),
    "make-adapter": (cmd_make_adapter, "write a random peft LoRA directory", [
        ("--model", _REQ), ("--rank", _INT), ("--alpha", dict(_FLOAT, required=True)),
        ("--rslora", {"action": "store_true"}),
        ("--targets", {"default": "q_proj,k_proj,v_proj,o_proj"}),
        ("--b-std", dict(_FLOAT, default=0.3)),
        ("--dtype", {"choices": ["f32", "bf16"], "default": "f32"}),
        ("--seed", _INT), ("--out", _REQ)]),
    "check-grad-selftest": (cmd_check_grad_selftest,
                            "autograd vs finite differences", []),
}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, (handler, help_text, options) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        for flag, kwargs in options:
            p.add_argument(flag, **kwargs)
        p.set_defaults(fn=handler)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
