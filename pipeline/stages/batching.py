"""Batch inference that loses only the sample that breaks it."""
from __future__ import annotations

import logging
from typing import Callable

import numpy as np

log = logging.getLogger(__name__)


def infer_each(infer: Callable[[np.ndarray], np.ndarray], xs: list[np.ndarray], stage: str) -> list:
    """Run `infer` on the stacked batch; if the batch fails, on each sample alone, so a sample that
    breaks the model costs only its own row. Returns one output row, or the Exception, per sample."""
    try:
        return list(infer(np.stack(xs)))
    except Exception as e:
        log.warning("%s: batch of %d failed (%s); retrying one by one", stage, len(xs), e)
    out: list = []
    for x in xs:
        try:
            out.append(infer(x[None])[0])
        except Exception as e1:
            out.append(e1)
    return out
