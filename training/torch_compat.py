"""Every setting of torch's internals humanset changes, and nothing else.

Tested on torch 2.14.1. tests/training/test_torch_compat.py fails when a torch upgrade renames or
drops what is set here.
"""
from __future__ import annotations

TESTED_TORCH = ("2.14",)  # minor versions this was tested on


def raise_recompile_limit(at_least: int) -> None:
    """Let Dynamo compile up to `at_least` variants of one code object before it falls back to
    eager (its default is 8). A process-wide setting of torch._dynamo.config; never lowered."""
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, at_least)
