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

# --quick: a run of a few seconds on a CPU (CI runs it); explicit options win.
FULL = dict(steps=300, layers=4, width=4, dim=128, batch=16, seq_len=128, generate=240)
QUICK = dict(steps=40, layers=2, width=4, dim=64, batch=8, seq_len=64, generate=80)


def add_parser(sub):
    p = sub.add_parser("demo", help="train a tiny causal-conv LM, generate, check the cache "
                                    "(the default command)")
    p.add_argument("--quick", action="store_true",
                   help="a small model for a few seconds: " +
                        ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    p.add_argument("--steps", type=int, default=None, help=f"training steps ({FULL['steps']})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=None, help=f"conv blocks ({FULL['layers']})")
    p.add_argument("--width", type=int, default=None,
                   help=f"conv kernel size W ({FULL['width']})")
    p.add_argument("--dim", type=int, default=None, help=f"model width D ({FULL['dim']})")
    p.add_argument("--batch", type=int, default=None, help=f"sequences per step ({FULL['batch']})")
    p.add_argument("--seq-len", type=int, default=None,
                   help=f"tokens per sequence ({FULL['seq_len']})")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--generate", type=int, default=None,
                   help=f"bytes to generate ({FULL['generate']})")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--platform", choices=["auto", "cpu", "gpu"], default="auto")
    return p


def resolve(args):
    """Fill the options left unset from the full or the --quick preset."""
    preset = QUICK if getattr(args, "quick", False) else FULL
    for k, v in preset.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    return args


def load_text(name: str = DEFAULT_TEXT) -> bytes:
    from importlib import resources
    return resources.files("jax_causal_conv").joinpath("data", name).read_bytes()


def pick_device(platform: str):
    """The device to run on; raises SystemExit with the reason (and its fix)
    when the platform asked for is not there."""
    import jax
    if platform == "auto":
        return jax.devices()[0]
    if platform == "gpu":
        from .gpu_status import gpu_problem
        problem = gpu_problem()
        if problem is not None:
            raise SystemExit(f"jax-causal-conv demo: --platform gpu: {problem}")
    return jax.devices(platform)[0]


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


class _Progress:
    """Training progress: a live bar (rich) on a terminal; in a log (a pipe or a
    file), one plain line every tenth of the run, so no carriage returns."""

    def __init__(self, steps, enabled=True):
        self.steps, self.enabled, self.bar = steps, enabled, None
        if not enabled:
            return
        try:
            from rich.console import Console
            console = Console()
        except ImportError:  # rich comes with flax; plain lines without it
            console = None
        if console is not None and console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
            self.bar = Progress(TextColumn("  training"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[status]}"), console=console)
            self.task = self.bar.add_task("train", total=steps, status="")
            self.bar.start()
        self.every = max(1, steps // 10)

    def update(self, step, loss, tps):
        if not self.enabled:
            return
        status = f"loss {loss:6.3f}  {tps:9,.0f} tok/s"
        if self.bar is not None:
            self.bar.update(self.task, completed=step, status=status)
        elif step % self.every == 0 or step == self.steps:
            print(f"  step {step:5d}/{self.steps}  {status}", flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.stop()


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
        bar = _Progress(steps, enabled=progress)
        for i in range(steps):
            key, sk = jax.random.split(key)
            params, opt_state, loss = train_step(params, opt_state, sk)
            losses.append(float(loss))            # syncs: the timing below is honest
            if i == 0:
                t0 = time.perf_counter()           # exclude compilation from tok/s
            elif t0 is not None:
                tps = i * batch * seq_len / (time.perf_counter() - t0)
            bar.update(i + 1, losses[-1], tps)
        bar.close()
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

    resolve(args)
    from .gpu_status import gpu_problem, require_gpu
    if args.platform == "gpu" and not require_gpu("jax-causal-conv demo"):
        return 2
    device = pick_device(args.platform)
    import jax_causal_conv as jcc
    on_gpu = device.platform in ("gpu", "cuda")
    ours = not on_gpu or "cuda" in jcc.PLATFORMS    # backend="auto" falls back to XLA
    problem = gpu_problem() if on_gpu else None
    text = load_text()
    print(f"jax-causal-conv demo: byte-level causal-conv LM on {DEFAULT_TEXT} "
          f"({len(text):,} bytes)")
    print(f"  device {device.platform}:{device.device_kind}, convolution by "
          f"{'our FFI kernels' if ours else 'the pure-XLA fallback'}")
    if problem is not None:
        print(f"  note: {problem}")
    print(f"  model: {args.layers} blocks x [RMSNorm, CausalConv1d(W={args.width}, silu) "
          f"+ residual, gated MLP], D={args.dim}")
    print(f"  training: {args.steps} steps of batch {args.batch} x {args.seq_len} tokens",
          flush=True)
    res = train_lm(steps=args.steps, seed=args.seed, layers=args.layers, width=args.width,
                   dim=args.dim, batch=args.batch, seq_len=args.seq_len, lr=args.lr,
                   platform=args.platform, progress=True, text=text)
    nparams = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(res.params))
    k = max(1, min(10, len(res.losses) // 5))
    first, last = np.mean(res.losses[:k]), np.mean(res.losses[-k:])
    print(f"  {nparams:,} parameters; loss {first:.3f} -> {last:.3f} (mean of first/last "
          f"{k} steps) in {res.seconds:.1f} s, {res.tokens_per_s:,.0f} tok/s", flush=True)

    with jax.default_matmul_precision("highest"):  # compare like with like on GPUs too
        tokens, cached_logits = generate(res, PROMPT.encode(), args.generate,
                                         temperature=args.temperature, seed=args.seed)
        diff, scale = check_cache(res, tokens, cached_logits)
    out = bytes(np.asarray(tokens[0], np.uint8)).decode("utf-8", errors="backslashreplace")
    print("  --- generated (decode cache, temperature %.2f) ---" % args.temperature)
    print("  " + out.replace("\n", "\n  "))
    print("  ---")
    tol = 1e-4 * max(1.0, scale)
    ok = diff <= tol
    print(f"  cached decoding vs full recomputation over {tokens.shape[1] - 1} positions: "
          f"max |diff| = {diff:.2e} (tol {tol:.1e}) {'OK' if ok else 'FAIL'}")
    return 0 if ok else 1
