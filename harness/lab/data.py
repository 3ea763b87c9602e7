"""Synthetic, learnable tasks for the model families of harness.lab.models; nothing is downloaded.

Every task is a rule fixed by its seed plus a sampler that draws fresh examples from it, so the
training stream never runs out and never repeats, and the validation split is a held-out draw:

    task = make_task("mlp", seed=0)
    model = models.build("mlp", 50_000, **task.model_options)
    x, y = next(task.batches(64, seed=0))
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from harness.common.errors import HarnessError, closest

Batch = tuple[torch.Tensor, torch.Tensor]
Sampler = Callable[[int, torch.Generator], Batch]  # (count, generator) -> (x, y) on the CPU


def _generator(*parts: object) -> torch.Generator:
    """An independent random stream per purpose: teacher, validation and each training seed."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


@dataclass(frozen=True)
class Task:
    """A rule fixed by `seed`, its sampler, and a held-out validation draw."""

    kind: str
    seed: int
    model_options: dict[str, int]  # pass to harness.lab.models.build so the shapes match
    chance: float  # the accuracy of guessing the most frequent class (for the val split)
    val: Batch = field(repr=False)
    sample: Sampler = field(repr=False)

    def batches(self, batch_size: int, seed: int = 0) -> Iterator[Batch]:
        """Training batches, endless, the same sequence for the same task and seed."""
        generator = _generator(self.kind, self.seed, "train", seed)
        while True:
            yield self.sample(batch_size, generator)

    @staticmethod
    def loss(output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # (batch, classes) logits as they are; the transformer's (batch, tokens, vocab) logits
        # flatten to one prediction per token.
        return F.cross_entropy(output.flatten(0, -2), y.flatten())

    @staticmethod
    def accuracy(output: torch.Tensor, y: torch.Tensor) -> float:
        return (output.argmax(dim=-1) == y).float().mean().item()


def _mlp(seed: int, input_dim: int, classes: int) -> tuple[dict[str, int], Sampler]:
    """Gaussian vectors labelled by a fixed random one-hidden-layer teacher network."""
    teacher = _generator("mlp", seed, "teacher")
    w1 = torch.randn(input_dim, 64, generator=teacher) / input_dim**0.5
    w2 = torch.randn(64, classes, generator=teacher)

    def sample(count: int, generator: torch.Generator) -> Batch:
        x = torch.randn(count, input_dim, generator=generator)
        return x, (torch.tanh(x @ w1) @ w2).argmax(dim=-1)

    return {"input_dim": input_dim, "classes": classes}, sample


def _cnn(seed: int, classes: int, image_size: int, noise: float) -> tuple[dict[str, int], Sampler]:
    """Each class is a fixed blocky colour pattern; an image is its pattern plus Gaussian noise."""
    teacher = _generator("cnn", seed, "teacher")
    coarse = torch.randn(classes, 3, 4, 4, generator=teacher)
    patterns = F.interpolate(coarse, size=(image_size, image_size), mode="nearest")

    def sample(count: int, generator: torch.Generator) -> Batch:
        y = torch.randint(classes, (count,), generator=generator)
        pixels = torch.randn(count, 3, image_size, image_size, generator=generator)
        return patterns[y] + noise * pixels, y

    return {"in_channels": 3, "classes": classes}, sample


def _transformer(
    seed: int, vocab: int, seq_len: int, noise: float
) -> tuple[dict[str, int], Sampler]:
    """Token sequences where each next token is a fixed function of the current one, except
    that with probability `noise` it is uniformly random instead."""
    successor = torch.randperm(vocab, generator=_generator("transformer", seed, "teacher"))

    def sample(count: int, generator: torch.Generator) -> Batch:
        # One token more than seq_len: the targets are the inputs shifted left by one.
        tokens = torch.empty(count, seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(vocab, (count,), generator=generator)
        random = torch.randint(vocab, (count, seq_len), generator=generator)
        keep = torch.rand(count, seq_len, generator=generator) >= noise
        for t in range(seq_len):
            tokens[:, t + 1] = torch.where(keep[:, t], successor[tokens[:, t]], random[:, t])
        return tokens[:, :-1], tokens[:, 1:]

    return {"vocab": vocab, "seq_len": seq_len}, sample


# Small on purpose: a few hundred CPU training steps take seconds.
_TASKS = {
    "mlp": (_mlp, {"input_dim": 32, "classes": 10, "val_size": 2048}),
    "cnn": (_cnn, {"classes": 10, "image_size": 16, "noise": 3.0, "val_size": 512}),
    "transformer": (_transformer, {"vocab": 64, "seq_len": 32, "noise": 0.1, "val_size": 256}),
}


def make_task(kind: str, seed: int = 0, **options) -> Task:
    if kind not in _TASKS:
        raise HarnessError(
            f"unknown task kind {kind!r}: known kinds are {', '.join(_TASKS)} "
            f"(closest: {closest(kind, _TASKS)})"
        )
    maker, defaults = _TASKS[kind]
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise HarnessError(
            f"{kind} task: unknown option(s) {', '.join(unknown)}: known are "
            f"{', '.join(defaults)} (closest: {closest(unknown[0], defaults)})"
        )
    resolved = {**defaults, **options}
    val_size = resolved.pop("val_size")
    model_options, sample = maker(seed, **resolved)
    x, y = sample(val_size, _generator(kind, seed, "val"))
    chance = torch.bincount(y.flatten()).max().item() / y.numel()
    return Task(kind, seed, model_options, chance, (x, y), sample)
