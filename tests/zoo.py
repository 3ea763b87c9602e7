"""Models nobody here wrote, and engineered failures, for the truth benchmark of `amp-harness
diagnose` (tests/lab/test_diagnose_truth.py, scripts/diagnose-truth, docs/diagnose.md's table).

Every model is random-init and small; nothing is downloaded. The architectures come from
transformers (GPT-2, BERT, T5) and, where it imports beside this torch, torchvision (resnet18);
the failures are real components with weights or data set the way they go wrong in practice:

| factory | what goes wrong |
|---|---|
| `t5_overflow` | T5's feed-forward output (`wo`) beyond 65504 (the known T5 fp16 overflow) |
| `attn_hot` | GPT-2 eager attention, unscaled hot q/k: logits of 1e5 in a functional matmul |
| `raw_targets` | a regression on raw-unit targets (about 60,000): fp16 gradients overflow |
| `exp_forward` | an `exp` inside the model's own forward, with no module of its own |
| `tiny_grad` | a loss multiplied by 1e-6: gradients fp16 flushes to zero without scaling |
| `bn_raw` | BatchNorm on raw inputs (std 1000): its running variance leaves fp16's range |
| `healthy` | a small MLP nothing troubles: the control |
| `fragile`, `mlp` | the harness's own (harness.lab.diagnose_examples) |

Each factory returns a harness.lab.diagnose.Subject over endless batches of a synthetic task drawn
from a fixed seed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import torch
from torch import nn

from harness.lab import diagnose_examples
from harness.lab.diagnose import Subject

VOCAB, LENGTH, BATCH = 128, 16, 16
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def _tokens(seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Next-token prediction on a sparse Markov chain (4 successors per token)."""
    g = torch.Generator().manual_seed(seed)
    successors = torch.randint(0, VOCAB, (VOCAB, 4), generator=g)
    while True:
        x = torch.empty(BATCH, LENGTH + 1, dtype=torch.long)
        x[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=g)
        for t in range(LENGTH):
            pick = torch.randint(0, 4, (BATCH,), generator=g)
            x[:, t + 1] = successors[x[:, t], pick]
        yield x[:, :-1], x[:, 1:]


def _token_loss(out, y: torch.Tensor) -> torch.Tensor:
    logits = out.logits if hasattr(out, "logits") else out
    return nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


class _Logits(nn.Module):
    """A transformers model as (inputs) -> logits."""

    def __init__(self, hf: nn.Module):
        super().__init__()
        self.hf = hf

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=x).logits


def gpt2(attention: str = "sdpa") -> Subject:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=LENGTH, n_embd=64, n_layer=2, n_head=2,
        attn_implementation=attention,
    )  # fmt: skip
    return Subject(_Logits(GPT2LMHeadModel(config)), _tokens(), _token_loss)


def bert() -> Subject:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=LENGTH,
    )  # fmt: skip
    return Subject(_Logits(BertForMaskedLM(config)), _tokens(), _token_loss)


class _Seq2Seq(nn.Module):
    """T5 as (source and decoder input stacked) -> logits."""

    def __init__(self, hf: nn.Module):
        super().__init__()
        self.hf = hf

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=x[:, 0], decoder_input_ids=x[:, 1]).logits


def _reversal(seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    while True:
        source = torch.randint(1, VOCAB, (BATCH, LENGTH), generator=g)
        target = source.flip(1)
        decoder_input = torch.cat([torch.zeros(BATCH, 1, dtype=torch.long), target[:, :-1]], 1)
        yield torch.stack([source, decoder_input], 1), target


def t5(wo_scale: float = 1.0) -> Subject:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
        num_heads=4, feed_forward_proj="gated-gelu", decoder_start_token_id=0,
    )  # fmt: skip
    model = T5ForConditionalGeneration(config)
    if wo_scale != 1.0:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("DenseReluDense.wo.weight"):
                    p.mul_(wo_scale)
    return Subject(_Seq2Seq(model), _reversal(), _token_loss)


def t5_overflow() -> Subject:
    return t5(wo_scale=3e4)


def attn_hot() -> Subject:
    """GPT-2 eager attention, unscaled, with q and k columns x300: logits of about 1e5."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=LENGTH, n_embd=64, n_layer=2, n_head=2,
        attn_implementation="eager", scale_attn_weights=False,
    )  # fmt: skip
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight[:, : 2 * config.n_embd].mul_(300)
    return Subject(_Logits(model), _tokens(), _token_loss)


def _regression(scale: float, seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(8, 1, generator=g)
    while True:
        x = torch.randn(64, 8, generator=g)
        yield x, (x @ w + 1.0) * scale


def raw_targets() -> Subject:
    """A regression whose targets are in raw units (about 60,000): the MSE's gradient is far
    beyond fp16 whatever the loss scale."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    return Subject(model, _regression(6e4), nn.functional.mse_loss)


class ExpForward(nn.Module):
    """A model computing `exp` inside its own forward (a hand-written softmax-like score)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x) * 4
        w = torch.exp(h)  # beyond 65504 once h > 11.1
        return self.head(w / w.sum(-1, keepdim=True))


def _classes(seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randn(64, 8, generator=g) * 3
        yield x, (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()


def exp_forward() -> Subject:
    torch.manual_seed(0)
    return Subject(ExpForward(), _classes(), nn.functional.cross_entropy)


def healthy() -> Subject:
    """A small MLP on a learnable task: nothing in it troubles fp16 or bf16 (the control)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    return Subject(model, _classes(), nn.functional.cross_entropy)


def tiny_grad() -> Subject:
    """`healthy` with its loss multiplied by 1e-6 (a summed loss over few elements, late
    training): AdamW in fp32 does not mind, fp16 without loss scaling flushes it."""
    made = healthy()
    return Subject(made.model, made.batches, lambda out, y: made.loss(out, y) * 1e-6)


class BNRaw(nn.Module):
    """A small CNN whose first BatchNorm sees raw inputs (std 1000, CT-like units)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def _images(seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(4, 1, 8, 8, generator=g)
    while True:
        y = torch.randint(0, 4, (32,), generator=g)
        yield (prototypes[y] + torch.randn(32, 1, 8, 8, generator=g)) * 1000, y


def bn_raw() -> Subject:
    torch.manual_seed(0)
    return Subject(BNRaw(), _images(), nn.functional.cross_entropy)


def resnet18() -> Subject:
    """torchvision's resnet18 (BatchNorm) on noisy 16x16 images of 4 classes."""
    from torchvision.models import resnet18 as build

    torch.manual_seed(0)
    return Subject(build(num_classes=4), _colour_images(), nn.functional.cross_entropy)


def vit() -> Subject:
    """timm's ViT-tiny, depth 6, on 32x32 images in patches of 4."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=4, depth=6,
        num_classes=4,
    )  # fmt: skip
    return Subject(model, _colour_images(32), nn.functional.cross_entropy)


def _colour_images(size: int = 16, seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(4, 3, size, size, generator=g)
    while True:
        y = torch.randint(0, 4, (16,), generator=g)
        yield prototypes[y] + 3 * torch.randn(16, 3, size, size, generator=g), y


fragile = diagnose_examples.fragile
mlp = diagnose_examples.mlp

# The engineered failures and the harness's models: fast enough for every CI run.
FAST = ("healthy", "fragile", "raw_targets", "exp_forward", "tiny_grad", "bn_raw")
# The architectures from transformers: the docs' table (scripts/diagnose-truth).
TRANSFORMERS = ("gpt2", "bert", "t5", "t5_overflow", "attn_hot")
# torchvision and timm: where they import beside this build of torch (PyPI's torchvision for a
# CPU build of torch does not: docs/diagnose.md).
VISION = ("resnet18", "vit")
