"""Small decoder and encoder models from transformers configs, random init, on the zoo's
next-token task (tests/helpers/zoo.py), for the question of issue 54: does a `half` model's AdamW
with eps 1e-4, whose fp16 second moments are 0 on most entries, train as fp32 with the same eps?
docs/diagnose.md ("keep the optimizer state in fp32") gives what `--verify 150` found on them:

    cd tests && amp-harness diagnose helpers.zoo_half_adamw:neox --device cpu --recipes half \\
        --verify 150 --no-mlflow
"""

from __future__ import annotations

import torch

from harness.lab.diagnose import Subject
from helpers.zoo import LENGTH, VOCAB, _Logits, _token_loss, _tokens

SIZE = {
    "vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 128, "max_position_embeddings": LENGTH,
}  # fmt: skip


def neox(seed: int = 0) -> Subject:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(seed)
    return Subject(_Logits(GPTNeoXForCausalLM(GPTNeoXConfig(**SIZE))), _tokens(), _token_loss)


def phi(seed: int = 0) -> Subject:
    from transformers import PhiConfig, PhiForCausalLM

    torch.manual_seed(seed)
    return Subject(_Logits(PhiForCausalLM(PhiConfig(**SIZE))), _tokens(), _token_loss)


def deberta(seed: int = 0) -> Subject:
    from transformers import DebertaV2Config, DebertaV2ForMaskedLM

    torch.manual_seed(seed)
    model = DebertaV2ForMaskedLM(DebertaV2Config(**SIZE))
    return Subject(_Logits(model), _tokens(), _token_loss)
