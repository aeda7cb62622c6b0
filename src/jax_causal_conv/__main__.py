"""``jax-causal-conv`` / ``python -m jax_causal_conv``: demo (default), info, bench."""

from __future__ import annotations

import argparse
import sys

from .cli import bench_cmd, demo, info

COMMANDS = {"demo": demo, "info": info, "bench": bench_cmd}


def build_parser():
    from . import __version__
    p = argparse.ArgumentParser(
        prog="jax-causal-conv",
        description="Causal depthwise conv1d for JAX. With no command, runs `demo` "
                    "(`python -m jax_causal_conv --quick`: a run of a few seconds).")
    p.add_argument("--version", action="version", version=f"jax-causal-conv {__version__}")
    sub = p.add_subparsers(dest="command", metavar="{demo,info,bench}")
    for name, mod in COMMANDS.items():
        mod.add_parser(sub)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # no command (or only demo options): the demo
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv = ["demo"] + argv
    args = build_parser().parse_args(argv)
    return COMMANDS[args.command].run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
