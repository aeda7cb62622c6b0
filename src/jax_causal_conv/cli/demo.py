"""``jax-causal-conv demo``: train a small byte-level causal-conv language model on a
short public-domain text, generate from it with the decode cache, and check that
cached decoding gives the logits of a full recomputation.

The model: byte embedding, N blocks of [RMSNorm -> CausalConv1d(silu) + residual
(fused in the kernel), RMSNorm -> gated MLP + residual], RMSNorm, linear head.

In-process use (the tests do this): ``train_lm(steps=30)`` returns a
:class:`TrainResult` whose ``losses`` is the loss history.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, List, Optional

DEFAULT_TEXT = "lighthouse.txt"
PROMPT = "Every evening "


def add_parser(sub):
    p = sub.add_parser("demo", help="train a tiny causal-conv LM, generate, check the cache "
                                    "(the default command)")
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=4, help="conv blocks (default 4)")
    p.add_argument("--width", type=int, default=4, help="conv kernel size W (default 4)")
    p.add_argument("--dim", type=int, default=128, help="model width D (default 128)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--generate", type=int, default=240, help="bytes to generate")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--platform", choices=["auto", "cpu", "gpu"], default="auto")
    return p


def load_text(name: str = DEFAULT_TEXT) -> bytes:
    from importlib import resources
    return resources.files("jax_causal_conv").joinpath("data", name).read_bytes()


def pick_device(platform: str):
    import jax
    if platform == "auto":
        return jax.devices()[0]
    try:
        devs = jax.devices(platform)
    except RuntimeError as e:
        raise SystemExit(f"jax-causal-conv demo: no {platform} device available ({e})")
    return devs[0]


def make_model(layers: int, width: int, dim: int, vocab: int = 256):
    import flax.linen as nn
    from ..flax import CausalConv1d

    def _split(a):
        half = a.shape[-1] // 2
        return a[..., :half], a[..., half:]

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, decode=False):
            h = nn.RMSNorm(name="conv_norm")(x)
            x = CausalConv1d(dim, kernel_size=width, activation="silu", name="conv")(
                h, x, decode=decode)                     # residual fused in the kernel
            h = nn.RMSNorm(name="mlp_norm")(x)
            gate, up = _split(nn.Dense(4 * dim, use_bias=False, name="wi")(h))
            return x + nn.Dense(dim, use_bias=False, name="wo")(nn.silu(gate) * up)

    class ConvLM(nn.Module):
        @nn.compact
        def __call__(self, tokens, decode=False):
            x = nn.Embed(vocab, dim, name="embed")(tokens)
            for i in range(layers):
                x = Block(name=f"block{i}")(x, decode)
            return nn.Dense(vocab, name="head")(nn.RMSNorm(name="final_norm")(x))

    return ConvLM()


@dataclasses.dataclass
class TrainResult:
    losses: List[float]
    params: Any
    model: Any
    data: Any
    tokens_per_s: float
    seconds: float
    device: Any


def _progress(step, steps, loss, tps, final=False):
    width = 24
    done = int(width * step / max(steps, 1))
    bar = "#" * done + "." * (width - done)
    sys.stderr.write(f"\r  [{bar}] step {step:4d}/{steps}  loss {loss:6.3f}  "
                     f"{tps:9,.0f} tok/s")
    if final:
        sys.stderr.write("\n")
    sys.stderr.flush()


def train_lm(steps=300, seed=0, layers=4, width=4, dim=128, batch=16, seq_len=128, lr=3e-3,
             platform="auto", progress=False, text: Optional[bytes] = None) -> TrainResult:
    """Train the demo model; returns the loss history and the trained params."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    device = pick_device(platform)
    data = np.frombuffer(text if text is not None else load_text(), dtype=np.uint8)
    if data.size < seq_len + 2:
        raise ValueError(f"text too short ({data.size} bytes) for seq_len={seq_len}")
    model = make_model(layers, width, dim)
    with jax.default_device(device):
        key = jax.random.key(seed)
        params = model.init(key, jnp.zeros((1, seq_len), jnp.int32))["params"]
        sched = optax.warmup_cosine_decay_schedule(0.0, lr, min(20, max(steps // 10, 1)),
                                                   max(steps, 1), lr * 0.1)
        opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.01))
        opt_state = opt.init(params)
        data_dev = jnp.asarray(data, jnp.int32)

        def loss_fn(p, seqs):
            logits = model.apply({"params": p}, seqs[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, seqs[:, 1:]).mean()

        @jax.jit
        def train_step(p, s, key):
            starts = jax.random.randint(key, (batch,), 0, data_dev.shape[0] - seq_len - 1)
            seqs = jax.vmap(lambda i: jax.lax.dynamic_slice(data_dev, (i,), (seq_len + 1,)))(
                starts)
            loss, g = jax.value_and_grad(loss_fn)(p, seqs)
            upd, s = opt.update(g, s, p)
            return optax.apply_updates(p, upd), s, loss

        losses, t_start, t0, tps = [], time.perf_counter(), None, 0.0
        every = max(1, steps // 100)
        for i in range(steps):
            key, sk = jax.random.split(key)
            params, opt_state, loss = train_step(params, opt_state, sk)
            losses.append(float(loss))            # syncs: the timing below is honest
            if i == 0:
                t0 = time.perf_counter()           # exclude compilation from tok/s
            elif t0 is not None:
                tps = i * batch * seq_len / (time.perf_counter() - t0)
            if progress and (i % every == 0 or i == steps - 1):
                _progress(i + 1, steps, losses[-1], tps, final=i == steps - 1)
    return TrainResult(losses, params, model, data, tps, time.perf_counter() - t_start, device)


def generate(res: TrainResult, prompt: bytes, n: int, temperature=0.7, seed=0):
    """Sample ``n`` bytes after ``prompt`` with the decode cache (prefill, then one
    token at a time inside one jitted scan). Returns (tokens, step logits) where
    step logits[i] are the logits that predicted token i+1 of prompt+generated."""
    import jax
    import jax.numpy as jnp

    model, params = res.model, res.params
    toks = jnp.asarray(list(prompt), jnp.int32)[None]
    with jax.default_device(res.device):
        cache = model.init(jax.random.key(0), toks, decode=True)["cache"]

        @jax.jit
        def run(params, cache, toks, key):
            logits, mut = model.apply({"params": params, "cache": cache}, toks, decode=True,
                                      mutable=["cache"])

            def body(carry, k):
                cache, last_logits = carry
                tok = jax.random.categorical(k, last_logits / temperature)[:, None]
                lg, mut = model.apply({"params": params, "cache": cache}, tok, decode=True,
                                      mutable=["cache"])
                return (mut["cache"], lg[:, -1]), (tok[:, 0], lg[:, -1])

            keys = jax.random.split(key, n)
            _, (new_toks, step_logits) = jax.lax.scan(body, (mut["cache"], logits[:, -1]), keys)
            # logits for every position: prompt (from prefill) then each generated token
            all_logits = jnp.concatenate([logits, jnp.swapaxes(step_logits, 0, 1)], axis=1)
            return jnp.swapaxes(new_toks, 0, 1), all_logits

        new, logits = run(params, cache, toks, jax.random.key(seed))
        return jnp.concatenate([toks, new], axis=1), logits


def check_cache(res: TrainResult, tokens, cached_logits):
    """Max |cached - full| over every position but the last sampled token's."""
    import jax
    import jax.numpy as jnp

    with jax.default_device(res.device):
        full = jax.jit(lambda p, t: res.model.apply({"params": p}, t))(res.params,
                                                                       tokens[:, :-1])
    diff = float(jnp.max(jnp.abs(full - cached_logits[:, :-1])))
    scale = float(jnp.max(jnp.abs(full)))
    return diff, scale


def run(args) -> int:
    try:
        import flax  # noqa: F401
        import optax  # noqa: F401
    except ImportError:
        print("jax-causal-conv demo needs flax and optax: pip install 'jax-causal-conv[flax]'",
              file=sys.stderr)
        return 1
    import jax
    import numpy as np

    device = pick_device(args.platform)
    text = load_text()
    print(f"jax-causal-conv demo: byte-level causal-conv LM on {DEFAULT_TEXT} "
          f"({len(text):,} bytes), device {device.platform}:{device.device_kind}")
    print(f"  model: {args.layers} blocks x [RMSNorm, CausalConv1d(W={args.width}, silu) + "
          f"residual, gated MLP], D={args.dim}; batch {args.batch} x {args.seq_len} tokens, "
          f"{args.steps} steps")
    res = train_lm(steps=args.steps, seed=args.seed, layers=args.layers, width=args.width,
                   dim=args.dim, batch=args.batch, seq_len=args.seq_len, lr=args.lr,
                   platform=args.platform, progress=True, text=text)
    nparams = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(res.params))
    k = max(1, min(10, len(res.losses) // 5))
    first, last = np.mean(res.losses[:k]), np.mean(res.losses[-k:])
    print(f"  {nparams:,} parameters; loss {first:.3f} -> {last:.3f} "
          f"(mean of first/last {k} steps) in {res.seconds:.1f} s, {res.tokens_per_s:,.0f} tok/s")

    with jax.default_matmul_precision("highest"):  # compare like with like on GPUs too
        tokens, cached_logits = generate(res, PROMPT.encode(), args.generate,
                                         temperature=args.temperature, seed=args.seed)
        diff, scale = check_cache(res, tokens, cached_logits)
    out = bytes(np.asarray(tokens[0], np.uint8)).decode("utf-8", errors="replace")
    print("  --- generated (decode cache, temperature %.2f) ---" % args.temperature)
    print("  " + out.replace("\n", "\n  "))
    print("  ---")
    tol = 1e-4 * max(1.0, scale)
    ok = diff <= tol
    print(f"  cached decoding vs full recomputation over {tokens.shape[1] - 1} positions: "
          f"max |diff| = {diff:.2e} (tol {tol:.1e}) {'OK' if ok else 'FAIL'}")
    return 0 if ok else 1
