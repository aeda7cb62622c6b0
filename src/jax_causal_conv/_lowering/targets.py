"""The compiled modules and their XLA FFI targets.

The versioned target names are spelled once, in the C++ sources
(csrc/registrations.h); they are read here from the compiled CPU module. The
same names are registered for platform "cpu" (C++ kernels, always built) and
"CUDA" (when the CUDA module was built and loads)."""

from __future__ import annotations

import jax

try:  # for the command-buffer trait; its home may move between jaxlib versions
    from jaxlib import xla_client
except ImportError:  # pragma: no cover
    xla_client = None

from .. import _jcc_cpu

_NAMES = dict(_jcc_cpu.target_names())
FORWARD = _NAMES["forward"]
BACKWARD = _NAMES["backward"]
UPDATE = _NAMES["update"]
VARLEN_STATES = _NAMES["varlen_states"]
TARGETS = tuple(_jcc_cpu.registrations())  # every name a program may call, legacy ones too
MAX_WIDTH = int(_jcc_cpu.max_width)

try:  # absent in CPU-only builds, or when the CUDA runtime cannot load
    from .. import _jcc_cuda  # type: ignore[attr-defined]
except ImportError as e:  # pragma: no cover - depends on the build
    _jcc_cuda = None
    CUDA_IMPORT_ERROR = str(e)
else:
    CUDA_IMPORT_ERROR = None

# Platforms (as lax.platform_dependent names them) that have our kernels.
PLATFORMS = ("cpu", "cuda") if _jcc_cuda is not None else ("cpu",)


def _register():
    for name, capsule in _jcc_cpu.registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    if _jcc_cuda is not None:
        # The handlers only launch work on XLA's stream and allocate nothing, so
        # XLA may record them into command buffers (CUDA graphs); the trait is
        # passed with the registration (register_custom_call_target's `traits`).
        traits = {}
        cls = getattr(xla_client, "CustomCallTargetTraits", None)
        if cls is not None and hasattr(cls, "COMMAND_BUFFER_COMPATIBLE"):
            traits["traits"] = cls.COMMAND_BUFFER_COMPATIBLE
        for name, capsule in _jcc_cuda.registrations().items():
            jax.ffi.register_ffi_target(name, capsule, platform="CUDA", **traits)


_register()


def backward_workspace_bytes(batch, dim, length, width):
    """Bytes of the backward target's workspace result (scratch for its
    per-chunk partial weight/bias sums; csrc/problem.h has the formula)."""
    return _jcc_cpu.backward_workspace_bytes(batch, dim, length, width)


def forward_workspace_bytes(batch, length, width, mode, channels_last):
    """Bytes of the forward target's workspace result (scratch for the
    channels-first seq_idx kernels' mask words; 0 for every other call)."""
    return _jcc_cpu.forward_workspace_bytes(batch, length, width, mode, channels_last)


def disabled_safety_checks():
    """The ``jax.export.DisabledSafetyCheck`` list an exported function that
    calls these kernels needs: ``jax.export.export(jax.jit(f),
    disabled_checks=jcc.disabled_safety_checks())``. The importing process
    must ``import jax_causal_conv`` so the targets are registered."""
    return [jax.export.DisabledSafetyCheck.custom_call(t) for t in TARGETS]
