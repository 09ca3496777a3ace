"""The jobs people write, small: a BERT classifier on dict batches, a CNN as an
``nn.Sequential`` on scikit-learn's digits, a classifier of the user's own on dict
batches (with a custom step in test_custom_step), and a user's module wrapping a Hugging
Face model (``hf_models``, whose Llama job also has the user's own loss reading
``.logits``). Tiny random-initialised configs, nothing downloaded, no dropout
(parity)."""

from __future__ import annotations

import functools

import torch
from hf_models import hf_job
from torch import nn
from torch.utils.data import Dataset

from unipar.job import Job
from unipar.testing import small_job

VOCAB, SEQ = 128, 16


class Sentences(Dataset):
    """Random token sentences of random lengths, padded to ``SEQ``, as dicts of
    ``input_ids`` and ``attention_mask``, with a label: what a tokenizer gives."""

    def __init__(self, size: int = 64, classes: int = 2, seed: int = 7) -> None:
        generator = torch.Generator().manual_seed(seed)
        lengths = torch.randint(SEQ // 2, SEQ + 1, (size,), generator=generator)
        self.mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).long()
        self.ids = torch.randint(1, VOCAB, (size, SEQ), generator=generator) * self.mask
        self.labels = torch.randint(0, classes, (size,), generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):  # type: ignore[no-untyped-def]
        inputs = {"input_ids": self.ids[index], "attention_mask": self.mask[index]}
        return inputs, self.labels[index]


def bert():  # type: ignore[no-untyped-def]
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        classifier_dropout=0.0,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


def digits_cnn() -> nn.Sequential:
    """A plain ``nn.Sequential`` CNN for 8x8 digit images."""
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 4 * 4, 32),
        nn.ReLU(),
        nn.Linear(32, 10),
    )


class Digits(Dataset):
    """scikit-learn's bundled 8x8 digits (no download): image [1, 8, 8], label."""

    def __init__(self) -> None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        self.images = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16
        self.labels = torch.tensor(digits.target)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):  # type: ignore[no-untyped-def]
        return self.images[index], self.labels[index]


class MaskedBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return h + self.fc2(torch.relu(self.fc1(self.norm(h)))) * mask[..., None]


class DictClassifier(nn.Module):
    """A user's classifier taking the dict batch as one argument, its forward running
    a list of layers in order, each also given the mask."""

    def __init__(self, width: int = 32, depth: int = 4, classes: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.layers = nn.ModuleList(MaskedBlock(width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        mask = batch["attention_mask"].float()
        h = self.embed(batch["input_ids"])
        for layer in self.layers:
            h = layer(h, mask)
        pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return self.head(pooled)


def bert_classifier(steps: int = 3) -> Job:
    return small_job("bert", bert, Sentences, steps=steps, call="kwargs")


def sequential_cnn(steps: int = 3) -> Job:
    return small_job("digits-cnn", digits_cnn, Digits, steps=steps)


def dict_classifier(steps: int = 3) -> Job:
    return small_job("dict-classifier", DictClassifier, Sentences, steps=steps)


JOBS = {
    "gpt2-in-user-model": functools.partial(hf_job, "gpt2-in-user-model"),
    "bert-classifier": bert_classifier,
    "sequential-cnn": sequential_cnn,
    "dict-classifier": dict_classifier,
}
