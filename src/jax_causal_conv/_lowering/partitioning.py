"""How the four kernel entry points split over a device mesh under ``jit``.

An FFI custom call is opaque to XLA's partitioner: alone, it would have its
sharded operands gathered onto every device. Each entry point therefore
declares what its dimensions are (a Shardy sharding rule: "b d l, g d w, ...
-> b d l"), so that shardings propagate through it like through XLA's own
ops, and says how it runs on the blocks it is given (shard_bodies.py):

- Auto mesh axes (XLA's sharding propagation): the call is wrapped in
  ``jax.experimental.custom_partitioning``; XLA's partitioner calls back
  with the shardings it chose, and ``_plan`` turns them into per-device
  blocks and the body that runs on them.
- Explicit mesh axes (``jax.sharding.AxisType.Explicit``): the inputs' types
  carry their shardings at trace time, so the same plan runs at once under
  ``jax.shard_map``; the outputs' types carry the shardings of the plan.

Where a split cannot be served cheaply (a split that does not divide the
dimension, decode rows and state slots split differently) the plan drops it,
which makes XLA gather that dimension, and says so with a
``ShardingFallbackWarning`` naming the case and what to do: never a silent
gather of activations.
"""

from __future__ import annotations

import functools
import math
import warnings

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from . import shard_bodies
from .config import VARLEN
from .shard_bodies import Split

__all__ = ["ShardingFallbackWarning", "forward", "backward", "update", "varlen_states"]


class ShardingFallbackWarning(UserWarning):
    """A sharded dimension that the kernels cannot split: it is gathered."""


# Factors: b batch rows, d channels, l sequence/tokens, n state slots, v0..
# leading vmap axes (shardable); g weight groups, w taps, h and k state
# columns, s decode steps, m sequence offsets, r packed sequences (never split).
_KEEP_WHOLE = frozenset("g w h k s m r".split())


# --- the dimensions of each entry point's operands and results ----------------------

def _lead(k):
    return tuple(f"v{i}" for i in range(k))


def _conv_dims(cfg, x, w):
    k, kw = x.ndim - 3, w.ndim - 3
    lead = _lead(k)
    xd = ("b", "l", "d") if cfg.channels_last else ("b", "d", "l")
    rows = "r" if cfg.mode == VARLEN else "b"
    st = (rows, "h", "d") if cfg.states_channels_last else (rows, "d", "h")
    return dict(x=lead + xd, w=lead[:kw] + ("g", "d", "w"), b=lead[:kw] + ("g", "d"),
                seq=lead + ("b", "l"), cu=lead + ("b", "m"), st=lead + st)


def _dims(kind, static, args):
    """(dims of each operand, dims of each result); None where absent."""
    if kind == "forward":
        x, w, b, res, sidx, cu, init = args
        d = _conv_dims(static, x, w)
        ins = (d["x"], d["w"], d["b"], d["x"], d["seq"], d["cu"], d["st"])
        outs = (d["x"], d["st"] if static.want_final else None)
    elif kind == "backward":
        x, w, b, sidx, cu, init, dy, dfin = args
        d = _conv_dims(static, x, w)
        ins = (d["x"], d["w"], d["b"], d["seq"], d["cu"], d["st"], d["x"], d["st"])
        outs = (d["x"], d["w"], d["b"], d["st"])
        outs = tuple(o if a is not None else None for o, a in zip(outs, (x, w, b, init)))
    elif kind == "update":
        x, state, w = args[:3]
        lead, kw = _lead(x.ndim - 3), w.ndim - 3
        if getattr(static, "channels_last", False):  # x (B, S, D), state (N, SL, D)
            xd, sd = lead + ("b", "s", "d"), lead + ("n", "k", "d")
        else:
            xd, sd = lead + ("b", "d", "s"), lead + ("n", "d", "k")
        ins = (xd, sd, lead[:kw] + ("g", "d", "w"), lead[:kw] + ("g", "d"), lead + ("b",),
               lead + ("b",))
        outs = (xd, sd)
    else:  # varlen_states
        x = args[0]
        lead = _lead(x.ndim - 2)
        ins = (lead + ("l", "d"), lead + ("m",))
        outs = (lead + (("r", "k", "d") if static[2] else ("r", "d", "k")),)
    ins = tuple(d if a is not None else None for d, a in zip(ins, args))
    return ins, outs


def _rule(ins, outs):
    """The Shardy rule string and its factors kept whole, in order of appearance
    (the rule's attribute wants them sorted)."""
    present = [d for d in ins if d is not None], [d for d in outs if d is not None]
    rule = (", ".join(" ".join(d) for d in present[0]) + " -> " +
            ", ".join(" ".join(d) for d in present[1]))
    order = []
    for d in present[0] + present[1]:
        order += [f for f in d if f in _KEEP_WHOLE and f not in order]
    return rule, tuple(order)


# --- the plan: which mesh axes split what -----------------------------------------------

def _axes_of(entry):
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _warn(msg):
    warnings.warn(f"jax_causal_conv: {msg}", ShardingFallbackWarning, stacklevel=2)


def _plan(kind, static, ins, args_shapes, specs, mesh_shape, quiet=False):
    """Per-factor mesh axes from the operands' specs (the first operand that
    has a factor decides it), less the splits the kernels cannot serve."""
    sizes = dict(mesh_shape)
    axes, extent = {}, {}
    for dims, shape, spec in zip(ins, args_shapes, specs):
        if dims is None:
            continue
        spec = tuple(spec) + (None,) * (len(dims) - len(tuple(spec)))
        for f, n, entry in zip(dims, shape, spec):
            extent.setdefault(f, n)
            if f not in axes or (not axes[f] and _axes_of(entry)):
                axes[f] = _axes_of(entry)
    say = (lambda m: None) if quiet else _warn
    # a mesh axis splits one factor only (operands may disagree, e.g. x's rows
    # and a weight's channels on the same axis), except decode rows following
    # the slots
    used = set()
    for f in sorted(axes, key=lambda f: f not in ("n",)):
        a = axes[f] if f not in _KEEP_WHOLE else ()
        a = tuple(x for x in a if x not in used or (kind == "update" and f == "b"))
        count = math.prod(sizes[x] for x in a)
        if a and extent[f] % count:
            say(f"{_NAMES.get(f, 'a dimension')} of size {extent[f]} is split over mesh axes "
                f"{a} ({count} devices), which does not divide it: it is gathered. Pad it to a "
                f"multiple of {count}.")
            a = ()
        axes[f] = a
        used.update(a)
    extra = None
    if kind == "update":
        rows, slots = axes.get("b", ()), axes.get("n", ())
        extra = blocked = rows == slots
        if blocked and slots and args_shapes[5] is None and extent["b"] != extent["n"]:
            blocked = extra = False  # without indices row i uses slot i: not blocked
        if not blocked:
            if rows:
                say(f"causal_conv1d_update with its rows split over {rows} and the state slots "
                    f"over {slots or 'nothing'}"
                    + (" (and no conv_state_indices, with num_slots != batch)"
                       if rows == slots else "")
                    + ": the rows are gathered, each device serves those whose slot it holds, "
                    "and the outputs are summed. Split the state's slots over the same mesh "
                    "axes as the rows (conv_state_indices then pick slots of the row's block).")
            axes["b"] = ()
    order = tuple(sorted((f, a) for f, a in axes.items() if a))
    return Split(order, tuple(sorted(sizes.items()))), extra


_NAMES = dict(b="the batch", d="the channel dimension", l="the sequence length",
              n="the number of state slots")


def _spec(dims, split):
    if dims is None:
        return None
    entries = []
    for f in dims:
        a = split.of(f)
        entries.append(None if not a else a[0] if len(a) == 1 else a)
    return P(*entries)


def _body(kind, static, split, extra):
    if kind == "forward":
        return functools.partial(shard_bodies.forward, static, split)
    if kind == "backward":
        return functools.partial(shard_bodies.backward, static, split)
    if kind == "update":
        return functools.partial(shard_bodies.update, static, split, extra)
    return functools.partial(shard_bodies.varlen_states, *static, split)


_NO_SPLIT = Split((), ())


# --- automatic mode: custom_partitioning -------------------------------------------------

def _spec_of(sharding, ndim):
    spec = tuple(sharding.spec) if isinstance(sharding, NamedSharding) else None
    return None if spec is None else spec + (None,) * (ndim - len(spec))


@functools.lru_cache(maxsize=None)
def _partitioned(kind, static, ins, outs):
    """custom_partitioning of one entry point for one arrangement of operands."""
    local = _body(kind, static, _NO_SPLIT, True)

    def fn(*args):
        return local(*args)

    def decide(mesh, arg_shapes, quiet):
        flat = [a for a in arg_shapes if a is not None]
        specs = [_spec_of(a.sharding, len(a.shape)) for a in flat]
        if any(s is None for s in specs):  # no mesh to name the axes by
            if not quiet:
                _warn(f"{kind}: its operands' shardings name no mesh axes (e.g. inside a "
                      "shard_map over only some axes): the call runs unsplit, on gathered "
                      "operands.")
            specs = [() for _ in flat]
        shapes = [None if a is None else a.shape for a in arg_shapes]
        it = iter(specs)
        all_specs = [None if a is None else next(it) for a in arg_shapes]
        split, extra = _plan(kind, static, ins, shapes, all_specs, mesh.shape, quiet)
        shard = lambda d: None if d is None else NamedSharding(mesh, _spec(d, split))  # noqa: E731
        return split, extra, tuple(map(shard, ins)), tuple(map(shard, outs))

    def partition(mesh, arg_shapes, result_shape):
        split, extra, arg_sh, out_sh = decide(mesh, arg_shapes, quiet=False)
        return mesh, _body(kind, static, split, extra), single(out_sh), arg_sh

    def infer(mesh, arg_shapes, result_shape):  # GSPMD (jax_use_shardy_partitioner=False)
        return single(decide(mesh, arg_shapes, quiet=True)[3])

    def single(out_sh):  # varlen_states returns one array, not a tuple
        return out_sh[0] if kind == "varlen_states" else out_sh

    cp = custom_partitioning(fn)
    rule, whole = _rule(ins, outs)
    cp.def_partition(partition=partition, infer_sharding_from_operands=infer,
                     sharding_rule=rule, need_replication_factors=whole)
    return cp


# --- explicit mode: shard_map on the shardings the types carry ---------------------------

def _explicit_mesh(args):
    """The mesh whose Explicit axes shard some operand's type, or None."""
    explicit = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)
    if explicit is None:
        return None
    for a in args:
        if a is None:
            continue
        s = getattr(jax.typeof(a), "sharding", None)
        mesh = getattr(s, "mesh", None)
        if mesh is None or mesh.empty or explicit not in tuple(mesh.axis_types):
            continue
        if any(_axes_of(e) for e in s.spec):
            return mesh
    return None


def _shard_map(f, mesh, in_specs, out_specs):
    if hasattr(jax, "shard_map"):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                             check_vma=False)
    from jax.experimental.shard_map import shard_map  # pragma: no cover - jax < 0.7
    return shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)


def _explicit(kind, static, ins, outs, mesh, args):
    explicit = jax.sharding.AxisType.Explicit
    hidden = [a for a, t in zip(mesh.axis_names, mesh.axis_types)
              if t != explicit and mesh.shape[a] > 1]
    if hidden:
        _warn(f"{kind}: the mesh mixes Explicit and other axes; the call follows the "
              f"shardings in the types (Explicit axes), and a split over {hidden} is "
              "gathered. Make those axes Explicit too, or all of them Auto.")
    specs = [None if a is None else tuple(jax.typeof(a).sharding.spec) for a in args]
    shapes = [None if a is None else a.shape for a in args]
    split, extra = _plan(kind, static, ins, shapes, specs, mesh.shape)
    present = [i for i, a in enumerate(args) if a is not None]
    in_specs = tuple(_spec(ins[i], split) for i in present)
    vals = [jax.sharding.reshard(args[i], NamedSharding(mesh, s))
            for i, s in zip(present, in_specs)]
    body = _body(kind, static, split, extra)

    def run(*vals):
        full = [None] * len(args)
        for i, v in zip(present, vals):
            full[i] = v
        out = body(*full)
        return tuple(o for o in out if o is not None) if isinstance(out, tuple) else out

    out_specs = tuple(_spec(d, split) for d in outs if d is not None)
    if len(outs) == 1:
        return _shard_map(run, mesh, in_specs, out_specs[0])(*vals)
    got = iter(_shard_map(run, mesh, in_specs, out_specs)(*vals))
    return tuple(None if d is None else next(got) for d in outs)


# --- the entry points -------------------------------------------------------------------

def _call(kind, static, args):
    ins, outs = _dims(kind, static, args)
    mesh = _explicit_mesh(args)
    if mesh is not None:
        return _explicit(kind, static, ins, outs, mesh, args)
    return _partitioned(kind, static, ins, outs)(*args)


def forward(cfg, x, w, b, res, seq_idx, cu, init):
    return _call("forward", cfg, (x, w, b, res, seq_idx, cu, init))


def backward(cfg, x, w, b, seq_idx, cu, init, dy, dfin):
    return _call("backward", cfg, (x, w, b, seq_idx, cu, init, dy, dfin))


def update(cfg, x, state, w, b, cache, idx):
    return _call("update", cfg, (x, state, w, b, cache, idx))


def varlen_states(state_len, backend, channels_last, x, cu):
    return _call("varlen_states", (state_len, backend, channels_last), (x, cu))
