#!/usr/bin/python3
"""Independent float64 PyTorch reference for one learner step.

Checks `prl learner step`: the gradient of the loss (--dump-grads) and the updated weights
(--out; with --adapter the LoRA adapter trained on the frozen base, peft's semantics) against a
single-process float64 computation of the same step: group-normalised
advantages, the learner's log-probs (torch_reference.py's model), the loss with global
normalisation, autograd, global-norm clipping and the SGD or AdamW update. It shares no
code with prl.

Subcommands:
  gen-rollouts   write random rollouts (reward + group lines) for a model
  check-step     compare prl's gradient and updated model with this reference
  compare-models two model directories agree within a relative tolerance per tensor
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference as ref  # noqa: E402


def cmd_gen_rollouts(args):
    rng = np.random.default_rng(args.seed)
    with open(args.out, "w") as f:
        for g in range(args.groups):
            for _ in range(args.samples):
                prompt = rng.integers(0, args.vocab_size, int(rng.integers(2, 9))).tolist()
                completion = rng.integers(
                    0, args.vocab_size, int(rng.integers(1, args.max_completion + 1))).tolist()
                # Behaviour log-probs near the model's (a random model gives about
                # -log(vocab)), so that ratios fall on both sides of the clips.
                base = -math.log(args.vocab_size)
                mu = [base + float(rng.normal(0, 0.5)) for _ in completion]
                mu = [min(m, -1e-3) for m in mu]
                line = {"prompt": prompt, "completion": completion, "behaviour_logprobs": mu,
                        "reward": float(rng.integers(0, 3)), "group": "g%d" % g}
                if args.episodes:
                    # An agentic episode: model turn, the environment's reply (context, never
                    # trained; log-prob 0), model turn.
                    reply = rng.integers(0, args.vocab_size, int(rng.integers(1, 5))).tolist()
                    turn = rng.integers(0, args.vocab_size, int(rng.integers(1, 4))).tolist()
                    line["completion"] = completion + reply + turn
                    line["behaviour_logprobs"] = (
                        mu + [0.0] * len(reply) + [base + float(rng.normal(0, 0.5)) for _ in turn])
                    line["behaviour_logprobs"] = [min(m, 0.0) for m in line["behaviour_logprobs"]]
                    line["sources"] = [0] * len(completion) + [1] * len(reply) + [0] * len(turn)
                f.write(json.dumps(line) + "\n")
    return 0


def advantages(lines, scale_by_std, eps=1e-6):
    groups = {}
    for i, line in enumerate(lines):
        groups.setdefault(line["group"], []).append(i)
    adv = [0.0] * len(lines)
    for members in groups.values():
        r = np.array([lines[i]["reward"] for i in members], dtype=np.float64)
        if len(members) < 2:
            continue
        a = r - r.mean()
        if scale_by_std:
            a = a / (r.std(ddof=1) + eps)
        for i, v in zip(members, a):
            adv[i] = float(v)
    return adv


def token_loss(kind, pi, mu, a, args):
    """Per-token losses of one sequence (float64 tensors)."""
    r = torch.exp(pi - mu)
    if kind == "reinforce_tis":
        return -torch.clamp(r, max=args.tis_cap).detach() * a * pi
    if kind == "ppo_clip":
        clipped = torch.clamp(r, 1 - args.clip_low, 1 + args.clip_high)
        return -torch.minimum(r * a, clipped * a)
    if kind == "sft":
        return -pi
    raise SystemExit("the reference implements reinforce_tis, ppo_clip and sft")


def reference_step(args):
    """The step's loss, its gradient and the updated weights. With --adapter (peft's LoRA on
    a frozen base) only the adapter's tensors train: gradients, clipping and the update are
    the adapter's."""
    cfg, params = ref.load_checkpoint(args.model)
    adapter = None
    if args.adapter:
        adapter = ref.load_adapter(args.adapter)
        for p in params.values():
            p.requires_grad_(False)
    lines = ref.read_jsonl(args.rollouts)
    adv = advantages(lines, args.advantage == "grpo")
    # An episode's environment tokens (sources 1) are read, never trained: outside the loss
    # and its denominators.
    def trained(line):
        return [s == 0 for s in line.get("sources", [0] * len(line["completion"]))]
    total_tokens = sum(sum(trained(line)) for line in lines)
    loss = torch.zeros((), dtype=torch.float64)
    router_log = [] if args.router_aux_loss_coef > 0 else None
    for line, a in zip(lines, adv):
        tokens = line["prompt"] + line["completion"]
        keep = torch.tensor(trained(line))
        pi = ref.score_line(cfg, params, tokens, len(line["prompt"]),
                            router_log=router_log, adapter=adapter)[keep]
        mu = torch.tensor(line["behaviour_logprobs"], dtype=torch.float32).double()[keep]
        per_token = token_loss(args.loss, pi, mu, a, args)
        if args.normalization == "tokens":
            loss = loss + per_token.sum() / total_tokens
        else:
            loss = loss + per_token.mean() / len(lines)
    if router_log is not None:  # over all the step's input tokens: prl's single micro-batch
        loss = loss + args.router_aux_loss_coef * ref.load_balancing_loss(cfg, router_log)
    loss.backward()
    trained = params if adapter is None else adapter[1]
    grads = {n: (t.grad if t.grad is not None else torch.zeros_like(t))
             for n, t in trained.items()}
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    scale = 1.0
    if args.max_grad_norm > 0:
        scale = min(1.0, args.max_grad_norm / (norm + 1e-6))
    new = {}
    for n, p in trained.items():
        p = p.detach()
        g = grads[n] * scale
        decay = args.weight_decay if p.dim() >= 2 else 0.0
        if args.optimizer == "sgd":
            new[n] = p - args.lr * (g + decay * p)
        else:  # AdamW, first step from zero moments
            m = (1 - args.beta1) * g
            v = (1 - args.beta2) * g * g
            denom = torch.sqrt(v) / math.sqrt(1 - args.beta2) + args.eps
            new[n] = p * (1 - args.lr * decay) - (args.lr / (1 - args.beta1)) * m / denom
    return cfg, trained, {n: g.numpy() for n, g in grads.items()}, new, float(loss), norm


def cmd_check_step(args):
    _, params, grads, new, loss, norm = reference_step(args)
    print("reference: loss %.6g, grad norm %.6g" % (loss, norm))
    failures = []
    if args.grads:
        failures += ref.check_grads(grads, args.grads, args.grad_rtol)
    if args.adapter:  # prl's output is the trained adapter, a peft directory
        got = ref.load_adapter(args.prl_out)[1]
    else:
        _, got = ref.load_checkpoint(args.prl_out)
    if set(got) != set(new):
        failures.append("tensor names differ: missing %s, unexpected %s"
                        % (sorted(set(new) - set(got)), sorted(set(got) - set(new))))
        got = {n: new[n] if n not in got else got[n] for n in new}
    worst_w, worst_u = (0.0, ""), (0.0, "")
    for n, p_ref in new.items():
        before = params[n].detach().numpy()
        p_prl = got[n].detach().numpy()
        p_ref = p_ref.numpy()
        ew = np.linalg.norm(p_prl - p_ref) / max(np.linalg.norm(p_ref), 1e-30)
        # The update itself, less what storing fp32 weights must lose: up to half an ulp of
        # each new weight (a norm weight near 1 moved by 1e-5 keeps only ~3 digits of it).
        du_ref = p_ref - before
        ulp = np.linalg.norm(np.spacing(np.abs(p_ref).astype(np.float32)).astype(np.float64))
        err = max(0.0, np.linalg.norm((p_prl - before) - du_ref) - ulp)
        eu = err / max(np.linalg.norm(du_ref), 1e-30)
        if np.linalg.norm(du_ref) == 0:
            eu = 0.0 if np.array_equal(p_prl, before) else math.inf
        worst_w = max(worst_w, (ew, n))
        worst_u = max(worst_u, (eu, n))
    print("updated weights: worst relative error %.3e (%s), rtol %.1e"
          % (worst_w[0], worst_w[1], args.param_rtol))
    print("updates (new - old): worst relative error %.3e (%s), rtol %.1e"
          % (worst_u[0], worst_u[1], args.update_rtol))
    if worst_w[0] > args.param_rtol:
        failures.append("weights differ by %.3e in %s" % worst_w)
    if worst_u[0] > args.update_rtol:
        failures.append("updates differ by %.3e in %s" % worst_u)
    print("FAIL: " + "; ".join(failures) if failures else "PASS")
    return 1 if failures else 0


def cmd_compare_models(args):
    """Pairs of model directories (or of safetensors files: gradients) agree within rtol per
    tensor (norm-wise): A B [A2 B2 ...], one python start for many pairs."""
    if len(args.files) % 2:
        print("FAIL: expected pairs of models, found %d paths" % len(args.files))
        return 1
    ok = True
    for i in range(0, len(args.files), 2):
        ok = compare_pair(args.files[i], args.files[i + 1], args.rtol) and ok
    return 0 if ok else 1


def compare_pair(path_a, path_b, rtol):
    if path_a.endswith(".safetensors"):
        a, b = ref.read_safetensors(path_a), ref.read_safetensors(path_b)
    else:
        a = {n: t.detach().numpy() for n, t in ref.load_checkpoint(path_a)[1].items()}
        b = {n: t.detach().numpy() for n, t in ref.load_checkpoint(path_b)[1].items()}
    if set(a) != set(b):
        print("FAIL: tensor names differ")
        return False
    worst = max((np.linalg.norm(a[n].astype(np.float64) - b[n].astype(np.float64))
                 / max(np.linalg.norm(a[n].astype(np.float64)), 1e-30), n) for n in a)
    print("%s vs %s: worst relative difference %.3e (%s), rtol %.1e"
          % (path_a, path_b, worst[0], worst[1], rtol))
    ok = worst[0] <= rtol
    print("PASS" if ok else "FAIL")
    return ok


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen-rollouts")
    for flag in ("--vocab-size", "--groups", "--samples", "--max-completion", "--seed"):
        g.add_argument(flag, type=int, required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--episodes", action="store_true",
                   help="agentic episodes: model turn, environment reply (sources 1), model turn")
    g.set_defaults(fn=cmd_gen_rollouts)
    c = sub.add_parser("check-step")
    for flag in ("--model", "--rollouts", "--prl-out"):
        c.add_argument(flag, required=True)
    c.add_argument("--grads")
    c.add_argument("--adapter", help="the starting peft LoRA adapter: train it, base frozen")
    c.add_argument("--loss", default="reinforce_tis")
    c.add_argument("--normalization", choices=["tokens", "sequence"], default="tokens")
    c.add_argument("--advantage", choices=["grpo", "dr_grpo"], default="grpo")
    c.add_argument("--optimizer", choices=["sgd", "adamw"], default="adamw")
    for flag, default in (("--lr", 1e-5), ("--max-grad-norm", 1.0), ("--weight-decay", 0.0),
                          ("--beta1", 0.9), ("--beta2", 0.95), ("--eps", 1e-8),
                          ("--tis-cap", 2.0), ("--clip-low", 0.2), ("--clip-high", 0.2),
                          ("--grad-rtol", 1e-4), ("--param-rtol", 1e-5),
                          ("--update-rtol", 1e-3), ("--router-aux-loss-coef", 0.0)):
        c.add_argument(flag, type=float, default=default)
    c.set_defaults(fn=cmd_check_step)
    m = sub.add_parser("compare-models")
    m.add_argument("files", nargs="+", help="A B [A2 B2 ...]")
    m.add_argument("--rtol", type=float, default=1e-5)
    m.set_defaults(fn=cmd_compare_models)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
