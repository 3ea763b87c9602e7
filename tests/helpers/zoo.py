"""Models nobody here wrote, and engineered failures, for the truth benchmark of `amp-harness
diagnose` (tests/lab/diagnose/test_diagnose_truth.py, tests/lab/diagnose/test_diagnose_zoo.py,
scripts/diagnose-truth, docs/diagnose.md's table).

Every model is random-init and small; nothing is downloaded. The architectures come from
transformers (GPT-2, BERT, T5, Llama, Qwen2) and, where they import beside this torch (`tox -e
zoo`), torchvision (ResNet, MobileNetV3, ConvNeXt) and timm (ViT). The failures are real
components with weights or data set the way they go wrong in practice:

| factory | what goes wrong |
|---|---|
| `t5_overflow` | T5's feed-forward output (`wo`) beyond 65504 (the known T5 fp16 overflow) |
| `attn_hot` | GPT-2 eager attention, unscaled hot q/k: logits of 1e5 in a functional matmul |
| `raw_targets` | a regression on raw-unit targets (about 60,000): fp16 gradients overflow |
| `exp_forward` | an `exp` inside the model's own forward, with no module of its own |
| `tiny_grad` | a loss multiplied by 1e-6: gradients fp16 flushes to zero without scaling |
| `bn_raw` | BatchNorm on raw inputs (std 1000): its running variance leaves fp16's range |
| `healthy` | a small MLP nothing troubles: the control |
| `fragile`, `mlp` | the harness's own (harness.lab.diagnose.examples) |

and the hazards as they happen in practice, no weight scaled:

| factory | what the user wrote |
|---|---|
| `bert_naive_softmax` | cross-entropy by hand on fp16 logits: log(exp / sum exp), no max taken |
| `qwen_accumulated` | a loss divided by 1024 for gradient accumulation, under fp16 |
| `gpt_unscaled_attention` | a hand-written GPT whose attention scores are not divided by sqrt(d) |
| `mlp_activation_penalty` | an activity regulariser written `a.pow(2).sum() / a.numel()` |
| `bert_half_adam` | a model cast with `.half()` and trained with Adam(W) |

Each factory returns a harness.lab.diagnose.Subject over endless batches of a synthetic task drawn
from a fixed seed; `seed` (where a factory takes it) changes the initial weights only, never the
batches: tests/helpers/zoo_truth.py trains fp32 from other seeds for its own spread.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import torch
from torch import nn

from harness.lab.diagnose import Subject
from harness.lab.diagnose import examples as diagnose_examples
from helpers import zoo_edges, zoo_growth

VOCAB, LENGTH, BATCH = 128, 16, 16
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def _tokens(seed: int = 0, batch: int = BATCH) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Next-token prediction on a sparse Markov chain (4 successors per token)."""
    g = torch.Generator().manual_seed(seed)
    successors = torch.randint(0, VOCAB, (VOCAB, 4), generator=g)
    while True:
        x = torch.empty(batch, LENGTH + 1, dtype=torch.long)
        x[:, 0] = torch.randint(0, VOCAB, (batch,), generator=g)
        for t in range(LENGTH):
            pick = torch.randint(0, 4, (batch,), generator=g)
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


def gpt2(attention: str = "sdpa", seed: int = 0) -> Subject:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=LENGTH, n_embd=64, n_layer=2, n_head=2,
        attn_implementation=attention,
    )  # fmt: skip
    return Subject(_Logits(GPT2LMHeadModel(config)), _tokens(), _token_loss)


def _small_bert_config():
    """The zoo's BERT: two layers of 64, the vocabulary and length of its token tasks."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=128, max_position_embeddings=LENGTH,
    )  # fmt: skip


def bert(seed: int = 0) -> Subject:
    from transformers import BertForMaskedLM

    torch.manual_seed(seed)
    config = _small_bert_config()
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


def t5(wo_scale: float = 1.0, seed: int = 0) -> Subject:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
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


def t5_overflow(seed: int = 0) -> Subject:
    return t5(wo_scale=3e4, seed=seed)


def attn_hot(seed: int = 0) -> Subject:
    """GPT-2 eager attention, unscaled, with q and k columns x300: logits of about 1e5."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
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


def raw_targets(seed: int = 0) -> Subject:
    """A regression whose targets are in raw units (about 60,000): the MSE's gradient is far
    beyond fp16 whatever the loss scale."""
    torch.manual_seed(seed)
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


def exp_forward(seed: int = 0) -> Subject:
    torch.manual_seed(seed)
    return Subject(ExpForward(), _classes(), nn.functional.cross_entropy)


def healthy(seed: int = 0) -> Subject:
    """A small MLP on a learnable task: nothing in it troubles fp16 or bf16 (the control)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    return Subject(model, _classes(), nn.functional.cross_entropy)


def tiny_grad(seed: int = 0) -> Subject:
    """`healthy` with its loss multiplied by 1e-6 (a summed loss over few elements, late
    training): AdamW in fp32 does not mind, fp16 without loss scaling flushes it."""
    made = healthy(seed)
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


def bn_raw(seed: int = 0) -> Subject:
    torch.manual_seed(seed)
    return Subject(BNRaw(), _images(), nn.functional.cross_entropy)


# --- the architectures users train (transformers: the default suite) ------------------------


def llama(seed: int = 0) -> Subject:
    """A Llama-style decoder (RMSNorm, rotary positions, SwiGLU, grouped-query attention, SDPA)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=LENGTH,
        attn_implementation="sdpa",
    )  # fmt: skip
    return Subject(_Logits(LlamaForCausalLM(config)), _tokens(), _token_loss)


def mlp_mse(seed: int = 0) -> Subject:
    """An 8-16-1 MLP regressing unit-scale targets with MSE: the smallest model one starts from."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    return Subject(model, _regression(1.0), nn.functional.mse_loss)


# --- hazards as they happen in practice (real components, no weight scaled) -----------------

# Gradient accumulation over 1024 micro-batches, each loss divided by the count so that the
# summed gradient is the mean's: the per-micro-batch gradient is 1024 times smaller.
ACCUMULATION = 1024


def _accumulated_token_loss(out, y: torch.Tensor) -> torch.Tensor:
    return _token_loss(out, y) / ACCUMULATION


def qwen_accumulated(seed: int = 0) -> Subject:
    """A Qwen2 decoder whose loss is divided by 1024 for gradient accumulation: under fp16
    without a loss scaler, most of the gradient is under fp16's smallest subnormal."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=LENGTH,
        attn_implementation="sdpa",
    )  # fmt: skip
    return Subject(_Logits(Qwen2ForCausalLM(config)), _tokens(), _accumulated_token_loss)


def _naive_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy written by hand on the (fp16 under autocast) logits: the softmax as
    exp / sum exp without subtracting the max, then its log. exp overflows fp16 past 11.09."""
    e = logits.exp()
    p = e / e.sum(-1, keepdim=True)
    return -p.gather(1, y[:, None]).log().mean()


class CosineClassifier(nn.Module):
    """A BERT encoder under a cosine (normalised-softmax) head, logits = 64 cos(feature, class),
    with ArcFace's and CosFace's usual scale: logits up to 64, where fp16's exp ends at 11.09."""

    SCALE = 64.0

    def __init__(self, encoder: nn.Module, classes: int = 4):
        super().__init__()
        self.encoder = encoder
        self.classes = nn.Parameter(torch.randn(classes, encoder.config.hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.encoder(input_ids=x).pooler_output
        cos = nn.functional.linear(
            nn.functional.normalize(features, dim=-1), nn.functional.normalize(self.classes, dim=-1)
        )
        return self.SCALE * cos


def _token_classes(seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Sequences of random tokens, labelled by their first token (mod 4)."""
    g = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=g)
        yield x, x[:, 0] % 4


def bert_naive_softmax(seed: int = 0) -> Subject:
    from transformers import BertModel

    torch.manual_seed(seed)
    config = _small_bert_config()
    return Subject(CosineClassifier(BertModel(config)), _token_classes(), _naive_cross_entropy)


class UnscaledAttentionBlock(nn.Module):
    """A pre-norm GPT block as tutorials write it by hand, with the attention scores left
    unscaled: the `/ sqrt(head_dim)` forgotten."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1)  # no / sqrt(d // heads)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        attention = scores.masked_fill(causal, float("-inf")).softmax(-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class HandWrittenGPT(nn.Module):
    def __init__(self, width: int = 64, heads: int = 2, layers: int = 2):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, width)
        self.positions = nn.Parameter(torch.randn(LENGTH, width) * 0.02)
        self.blocks = nn.Sequential(*(UnscaledAttentionBlock(width, heads) for _ in range(layers)))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tokens(x) + self.positions[: x.shape[1]]
        return self.head(self.ln(self.blocks(h)))


def gpt_unscaled_attention(seed: int = 0) -> Subject:
    torch.manual_seed(seed)
    return Subject(HandWrittenGPT(), _tokens(), _token_loss)


class ActivityRegularisedMLP(nn.Module):
    """An MLP whose hidden activations are also returned, for an activity regulariser (Keras'
    `activity_regularizer=l2(...)`, ported by hand)."""

    def __init__(self, width: int = 1024):
        super().__init__()
        self.hidden = nn.Sequential(nn.Linear(8, width), nn.ReLU())
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.hidden(x)
        return self.head(a), a


def _activity_penalised_loss(out: tuple[torch.Tensor, torch.Tensor], y: torch.Tensor):
    logits, a = out
    # The mean square written as sum / numel: 64 x 1024 squares of about 1.5 sum to about
    # 1e5, past fp16's 65504, though the mean is 1.5 (fp16 under autocast: a is a Linear's).
    penalty = a.pow(2).sum() / a.numel()
    return nn.functional.cross_entropy(logits, y) + 0.01 * penalty


def mlp_activation_penalty(seed: int = 0) -> Subject:
    torch.manual_seed(seed)
    return Subject(ActivityRegularisedMLP(), _classes(), _activity_penalised_loss)


def bert_half_adam(seed: int = 0) -> Subject:
    """BERT cast with `.half()` (to halve its memory), then trained with Adam(W): eps 1e-8 is 0
    in fp16 and the second moments underflow. The `half` recipe is what this user runs."""
    made = bert(seed)
    return Subject(made.model.half(), made.batches, made.loss)


# --- vision (torchvision, timm: `tox -e zoo`) -------------------------------------------------


def _colour_images(size: int = 16, seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(4, 3, size, size, generator=g)
    while True:
        y = torch.randint(0, 4, (16,), generator=g)
        yield prototypes[y] + 3 * torch.randn(16, 3, size, size, generator=g), y


def resnet18(seed: int = 0) -> Subject:
    """torchvision's resnet18 (BatchNorm) on noisy 16x16 images of 4 classes."""
    from torchvision.models import resnet18 as build

    torch.manual_seed(seed)
    return Subject(build(num_classes=4), _colour_images(), nn.functional.cross_entropy)


def mobilenet_v3_small(seed: int = 0) -> Subject:
    """torchvision's mobilenet_v3_small (BatchNorm, hardswish, squeeze-excitation) at 16x16."""
    from torchvision.models import mobilenet_v3_small as build

    torch.manual_seed(seed)
    return Subject(build(num_classes=4), _colour_images(), nn.functional.cross_entropy)


def convnext(seed: int = 0) -> Subject:
    """torchvision's ConvNeXt (7x7 depthwise convolutions, LayerNorm, GELU, layer scale), three
    stages of widths 24-48-96 instead of convnext_tiny's 96-768, on 32x32 images."""
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    torch.manual_seed(seed)
    stages = [CNBlockConfig(24, 48, 1), CNBlockConfig(48, 96, 1), CNBlockConfig(96, None, 1)]
    model = ConvNeXt(stages, stochastic_depth_prob=0.0, num_classes=4)
    return Subject(model, _colour_images(32), nn.functional.cross_entropy)


def vit(seed: int = 0) -> Subject:
    """timm's ViT-tiny narrowed (width 96, depth 4, 3 heads) on 32x32 images in patches of 4."""
    import timm

    torch.manual_seed(seed)
    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=4, depth=4,
        embed_dim=96, num_heads=3, num_classes=4,
    )  # fmt: skip
    return Subject(model, _colour_images(32), nn.functional.cross_entropy)


fragile = diagnose_examples.fragile
mlp = diagnose_examples.mlp

# The engineered failures and the harness's models: fast enough for every CI run.
FAST = ("healthy", "fragile", "raw_targets", "exp_forward", "tiny_grad", "bn_raw")
# The architectures from transformers: the docs' table (scripts/diagnose-truth).
TRANSFORMERS = ("gpt2", "bert", "t5", "t5_overflow", "attn_hot")
# The zoo of tests/lab/diagnose/test_diagnose_zoo.py in the default suite: architectures users train
# (transformers; T5 is the encoder-decoder) and hazards as they happen in practice.
ARCHITECTURES = ("llama", "t5", "mlp_mse")
HAZARDS = (
    "bert_naive_softmax", "qwen_accumulated", "gpt_unscaled_attention", "mlp_activation_penalty",
    "bert_half_adam",
)  # fmt: skip
# Hazards that grow with training, for the forecast (tests/helpers/zoo_growth.py), and at the
# edges of what diagnose says (tests/helpers/zoo_edges.py): their truth needs training that reaches
# the overflow, longer than the default suite's (scripts/diagnose-truth 300 GROWTH...).
GROWTH = (
    "growing_exp_loss", "growing_attention", "growing_norm", "growing_penalty", "flat_exp_loss",
)  # fmt: skip
EDGES = ("contrastive_lse", "patch_rmsnorm")
growing_exp_loss, growing_attention = zoo_growth.growing_exp_loss, zoo_growth.growing_attention
growing_norm, growing_penalty = zoo_growth.growing_norm, zoo_growth.growing_penalty
flat_exp_loss = zoo_growth.flat_exp_loss
contrastive_lse, patch_rmsnorm = zoo_edges.contrastive_lse, zoo_edges.patch_rmsnorm
# torchvision and timm: `tox -e zoo` (PyPI's torchvision does not import beside the CPU build of
# torch the default environment installs).
VISION = ("resnet18", "mobilenet_v3_small", "convnext", "vit")
