"""Shared pieces of the Flax tests (import after pytest.importorskip("flax"))."""

from flax import nnx


def scanned_stack():
    """A jitted forward of a stack of nnx layers (a layer's state stacked on
    axis 0), the layers applied in turn by nnx.scan: forward(layers, x,
    decode=False)."""
    @nnx.jit(static_argnames="decode")
    def forward(layers, x, decode=False):
        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
        def body(layer, h):
            return layer(h, h, decode=decode)
        return body(layers, x)
    return forward
