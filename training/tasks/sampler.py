"""Fine-tuning batches as a pure function of the step, so that a resumed run replays exactly."""
from __future__ import annotations

import numpy as np
import torch


class StepSampler(torch.utils.data.Sampler):
    """Batches of (index, epoch) for one rank, as a pure function of the step: sample p of the global
    stream is permutation_e[p mod n] with e = p div n, so resuming at step s replays exactly."""

    def __init__(self, n: int, batch_size: int, seed: int, rank: int = 0, world: int = 1, start_step: int = 0,
                 steps: int | None = None):
        self.n, self.batch, self.seed, self.rank, self.world = n, batch_size, seed, rank, world
        self.start, self.steps = start_step, steps
        self._perms: dict[int, np.ndarray] = {}

    def perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms = {epoch: np.random.default_rng([self.seed, epoch, 3]).permutation(self.n)}
        return self._perms[epoch]

    def batch_at(self, step: int) -> list[tuple[int, int]]:
        first = (step * self.world + self.rank) * self.batch
        out = []
        for p in range(first, first + self.batch):
            epoch = p // self.n
            out.append((int(self.perm(epoch)[p % self.n]), epoch))
        return out

    def __iter__(self):
        step = self.start
        while self.steps is None or step < self.steps:
            yield self.batch_at(step)
            step += 1

    def __len__(self):
        return (self.steps - self.start) if self.steps is not None else 2 ** 31


def collate(items: list[dict]) -> dict:
    return {k: torch.as_tensor(np.stack([it[k] for it in items])) for k in items[0]}
