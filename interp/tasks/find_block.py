""""Find the block": the MTA paper's motivating toy task (Golovneva et al. 2025, section 2, App. C).

The input is a run of blocks of N distinct random letters separated by '.', then '#' and L query
letters taken from one block (the target) in random order. Distractor blocks are resampled until
they do not contain every query letter, so the target is unique. The model must answer with the
target block ("All"), or only its first ("First") or last ("Last") letter; the loss is on the
answer only. Finding the block needs to match L letters at once: one query-key similarity at a
time cannot, MTA's key-query convolution (c_q = L, c_k = 2N - 1) can.

Defaults follow the official generator (`projects/mta/toy_task/generate_data.py`): 26 letters,
N=5, L=2, and every "All" sample is truncated/filled to `len(input) + len(answer) = 319`.
Differences: samples whose target block would be cut by that truncation are rejected (notes 1.12.9:
the official N=8 data contains such ill-posed samples), and `n_blocks` / `vocab_size` scale the
task down for a CPU.

Example:
    >>> task = FindBlockTask(block_length=3, query_length=2, n_blocks=4, vocab_size=8)
    >>> s = task.generate(1, seed=0)[0]
    >>> s.text.count("."), s.text.count("#"), set(s.query) <= set(s.target), s.label == s.target
    (3, 1, True, True)
    >>> batch = task.to_tokens([s])
    >>> int(batch.loss_mask.sum()) == len(s.label)
    True
"""

from __future__ import annotations

import math
import random
import string
from dataclasses import dataclass

import torch
from torch import Tensor

from attnlens.hooked_models.config import VariantConfig
from attnlens.hooked_models.tokenizers.vocab import CharTokenizer

VARIANTS = ("All", "First", "Last")
# A size that trains in minutes on a laptop CPU (the paper: N=5, L=2, ~52 blocks, 319 chars).
CPU_TASK = dict(block_length=3, query_length=2, n_blocks=8, vocab_size=12)
_MAX_TRIES = 10_000


@dataclass(frozen=True)
class FindBlockSample:
    """One sample: `text` = blocks + '#' + query is the prompt, `label` the answer."""

    blocks: tuple[str, ...]
    target_index: int
    query: str
    label: str
    text: str

    @property
    def target(self) -> str:
        return self.blocks[self.target_index]


@dataclass
class FindBlockBatch:
    """Token ids `[batch pos]` ([BOS] + prompt + answer), `loss_mask` `[batch pos-1]` (1 where
    the next-token target is an answer token) and the position of the first answer token."""

    tokens: Tensor
    loss_mask: Tensor
    answer_start: int


@dataclass(frozen=True)
class FindBlockTask:
    """Generator of the find-the-block task.

    Attributes:
        block_length: N, letters per block (distinct within a block).
        query_length: L, query letters (distinct letters of the target block, shuffled).
        variant: answer "All" (the block), "First" or "Last" (its first or last letter).
        n_blocks: number of blocks; None fills up to `seq_len` as the official generator.
        seq_len: with n_blocks None: len(prompt) + N (the official `pad_len`, 319); the joined
            blocks are truncated to fit.
        vocab_size: number of letters, from 'a' (at most 26).
        block_separator / query_separator: '.' and '#'.
    """

    block_length: int = 5
    query_length: int = 2
    variant: str = "All"
    n_blocks: int | None = None
    seq_len: int = 319
    vocab_size: int = 26
    block_separator: str = "."
    query_separator: str = "#"

    def __post_init__(self) -> None:
        N, L = self.block_length, self.query_length
        if self.variant not in VARIANTS:
            raise ValueError(f"variant={self.variant!r}; choose one of {list(VARIANTS)}")
        if not 1 <= self.vocab_size <= 26:
            raise ValueError(f"vocab_size must be in [1, 26], got {self.vocab_size}")
        if not 1 <= L <= N <= self.vocab_size:
            raise ValueError(f"need 1 <= query_length ({L}) <= block_length ({N}) <= "
                             f"vocab_size ({self.vocab_size})")
        if L == N and (self.n_blocks or 2) > 1:
            raise ValueError(f"query_length == block_length ({N}) leaves no valid distractor "
                             "block (every block of the query letters is the target)")
        if self.n_blocks is not None and self.n_blocks < 1:
            raise ValueError(f"n_blocks must be >= 1 or None, got {self.n_blocks}")
        if self.n_blocks is None and self.blocks_length < N:
            raise ValueError(f"seq_len={self.seq_len} leaves no room for one block of {N}")
        if set(self.alphabet) & {self.block_separator, self.query_separator}:
            raise ValueError("the separators must not be letters of the alphabet")

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def alphabet(self) -> str:
        return string.ascii_lowercase[:self.vocab_size]

    @property
    def blocks_length(self) -> int:
        """Characters of the joined blocks in every prompt."""
        if self.n_blocks is not None:
            return self.n_blocks * (self.block_length + 1) - 1
        return self.seq_len - self.block_length - self.query_length - 1

    @property
    def count(self) -> int:
        """Blocks drawn per sample (official: ceil(room / (N + 1)), then truncation)."""
        if self.n_blocks is not None:
            return self.n_blocks
        return math.ceil((self.blocks_length) / (self.block_length + 1))

    @property
    def prompt_length(self) -> int:
        return self.blocks_length + 1 + self.query_length

    @property
    def answer_length(self) -> int:
        return self.block_length if self.variant == "All" else 1

    @property
    def n_tokens(self) -> int:
        """Sequence length with BOS: what `n_ctx` must cover."""
        return 1 + self.prompt_length + self.answer_length

    # -- sampling ------------------------------------------------------------------------------
    def sample(self, rng: random.Random) -> FindBlockSample:
        """Draw one sample with `rng` (a `random.Random`)."""
        letters = list(self.alphabet)
        N, L = self.block_length, self.query_length
        for _ in range(_MAX_TRIES):
            target = "".join(rng.sample(letters, N))
            query = rng.sample(list(target), L)
            blocks, seen, tries = [target], {target}, 0
            while len(blocks) < self.count:
                tries += 1
                if tries > _MAX_TRIES:
                    raise ValueError(f"cannot draw {self.count} distinct distractor blocks "
                                     f"without the query letters from {self.vocab_size} letters")
                block = "".join(rng.sample(letters, N))
                if block not in seen and not set(query) <= set(block):
                    blocks.append(block)
                    seen.add(block)
            rng.shuffle(blocks)
            joined = self.block_separator.join(blocks)[:self.blocks_length]
            kept = tuple(joined.split(self.block_separator))
            if target not in kept:   # truncated away or cut short: ill-posed, draw again
                continue
            label = {"All": target, "First": target[0], "Last": target[-1]}[self.variant]
            text = joined + self.query_separator + "".join(query)
            return FindBlockSample(kept, kept.index(target), "".join(query), label, text)
        raise ValueError("could not draw a well-posed sample; increase seq_len")

    def generate(self, n: int, seed: int = 0, unique: bool = True) -> list[FindBlockSample]:
        """`n` samples from a `random.Random(seed)`; distinct prompts when `unique` (as the
        official generator, which keys samples by their blocks)."""
        rng = random.Random(seed)
        out, seen = [], set()
        for _ in range(n * 100 + _MAX_TRIES):
            if len(out) == n:
                return out
            s = self.sample(rng)
            if unique and s.text in seen:
                continue
            seen.add(s.text)
            out.append(s)
        raise ValueError(f"could not draw {n} distinct samples; the task is too small")

    # -- tokens and metrics --------------------------------------------------------------------
    def tokenizer(self) -> CharTokenizer:
        """A character tokenizer: BOS = 0, letters, then the two separators."""
        return CharTokenizer(self.alphabet + self.block_separator + self.query_separator)

    def to_tokens(self, samples: list[FindBlockSample], device=None) -> FindBlockBatch:
        """Encode samples as [BOS] + prompt + answer, with the answer-only loss mask."""
        tok = self.tokenizer()
        rows = [[tok.bos_token_id] + tok.encode(s.text + s.label) for s in samples]
        if len({len(r) for r in rows}) != 1:
            raise ValueError("samples of one batch must have the same length")
        tokens = torch.tensor(rows, dtype=torch.long, device=device)
        start = 1 + self.prompt_length
        mask = torch.zeros(tokens.shape[0], tokens.shape[1] - 1, device=device)
        mask[:, start - 1:] = 1.0   # predictions made at positions start-1 .. end-1
        return FindBlockBatch(tokens, mask, start)

    def batch(self, n: int, seed: int, device=None) -> FindBlockBatch:
        """`to_tokens(generate(n, seed))`, without the uniqueness constraint (training)."""
        return self.to_tokens(self.generate(n, seed, unique=False), device)

    def mta_options(self) -> dict:
        """The paper's MTA set-up for this task (App. C, `find_block_mta.yaml`): pre-softmax
        key-query convolution only, c_q = L, c_k = 2N - 1, on every layer, no head mixing."""
        return dict(query_kernel_size=self.query_length, key_kernel_size=2 * self.block_length - 1,
                    after_sm_query_kernel_size=None, after_sm_key_kernel_size=None,
                    pre_sm_head_kernel_size=None, head_kernel_size=None, group_norm=False,
                    add_gating=False, mta_layers="all")

    def model_config(self, attention: str = "mta", d_model: int = 256, n_layers: int = 4,
                     n_heads: int = 2, **overrides) -> VariantConfig:
        """A Lingua-style model for the task (paper: 4 layers, 2 heads, d_model 256; RoPE,
        RMSNorm, SwiGLU); `attention="mha"` gives the baseline. Overrides go to VariantConfig."""
        mult = 256 if d_model >= 256 else 32
        d_mlp = mult * math.ceil(int(8 * d_model / 3) / mult)
        kwargs = dict(d_model=d_model, d_head=d_model // n_heads, n_layers=n_layers,
                      n_heads=n_heads, n_ctx=self.n_tokens, d_vocab=self.tokenizer().vocab_size,
                      d_mlp=d_mlp, attention=attention, positional_embedding_type="rotary",
                      normalization_type="RMS", act_fn="silu", gated_mlp=True,
                      tokenizer_alphabet=self.tokenizer().alphabet)
        if attention == "mta":
            kwargs["attn_cfg"] = self.mta_options()
        kwargs.update(overrides)
        return VariantConfig(**kwargs)


def answer_loss(model, batch: FindBlockBatch) -> Tensor:
    """Mean next-token cross-entropy over the answer tokens only (`no_loss_prompt`)."""
    losses = model(batch.tokens, return_type="loss", loss_per_token=True)
    return (losses * batch.loss_mask).sum() / batch.loss_mask.sum()


@torch.no_grad()
def answer_error_rate(model, batch: FindBlockBatch) -> float:
    """Fraction of samples whose answer is not reproduced exactly. With teacher forcing every
    answer token is the argmax iff greedy decoding writes the whole answer, so one forward
    suffices."""
    logits = model(batch.tokens)
    pred = logits[:, batch.answer_start - 1:-1].argmax(-1)
    wrong = (pred != batch.tokens[:, batch.answer_start:]).any(-1)
    return float(wrong.float().mean())
