"""Sampling of the generation engine, per request, on the model's device.

Temperature 0 takes the argmax. Otherwise the distribution is ``softmax(logits / temperature)``,
cut to the nucleus when ``top_p < 1`` (the rule of transformers' ``TopPLogitsWarper``: the most
likely tokens, in order, while the mass of those before each is below ``top_p``; the most likely
token always stays), drawn from with the request's own ``torch.Generator`` seeded from its
``seed``. A batch's tokens stay on the device until :func:`sample_batch`'s caller reads them: per
decoding step only the sampled token ids cross to the host.
"""

from __future__ import annotations

import random

import torch

from asyncinfer.models.engine.request import Request

#: Candidates looked at first for nucleus sampling on the CPU; the full vocabulary is sorted
#: only when their probability mass falls short of ``top_p``.
NUCLEUS_CANDIDATES = 256


def _generator(req: Request, device: torch.device) -> torch.Generator:
    if req.generator is None:
        req.generator = torch.Generator(device=device).manual_seed(
            req.seed if req.seed is not None else random.getrandbits(63)
        )
    gen: torch.Generator = req.generator
    return gen


def sample_token(logits: torch.Tensor, req: Request) -> torch.Tensor:
    """The next token of ``req`` from its last-position ``logits`` (a 1-D float tensor of the
    vocabulary's size), as a 1-element long tensor on the logits' device.

    On the CPU the nucleus is found among the :data:`NUCLEUS_CANDIDATES` most likely tokens
    (``topk``) whenever their mass reaches ``top_p``, which it nearly always does, instead of
    sorting the whole vocabulary (checking the mass reads one float; free on the CPU). On an
    accelerator the vocabulary is sorted: no value crosses to the host.
    """
    if req.temperature <= 0:
        return torch.argmax(logits).reshape(1)
    gen = _generator(req, logits.device)
    probs = torch.softmax(logits.float() / req.temperature, dim=-1)
    if req.top_p >= 1.0:
        return torch.multinomial(probs, 1, generator=gen)
    if logits.device.type == "cpu":
        top, idx = torch.topk(probs, min(NUCLEUS_CANDIDATES, probs.shape[-1]))
        if float(top.sum()) < req.top_p:
            top, idx = torch.sort(probs, descending=True)
    else:
        top, idx = torch.sort(probs, descending=True)
    before = top.cumsum(dim=-1) - top  # mass of the more likely tokens
    keep = top.masked_fill(before >= req.top_p, 0.0)
    keep[0] = top[0]
    return idx[torch.multinomial(keep, 1, generator=gen)]


def sample(logits: torch.Tensor, req: Request) -> int:
    """:func:`sample_token` read back as an ``int`` (one request, e.g. after a prefill)."""
    return int(sample_token(logits, req).item())


def sample_batch(logits: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
    """The next token of every row: ``logits`` ``[rows, vocab]``, ``reqs`` in row order; a
    ``[rows]`` long tensor on the logits' device (greedy rows from one ``argmax`` over the
    batch, sampled rows each from its own generator)."""
    tokens = logits.argmax(dim=-1)
    for i, req in enumerate(reqs):
        if req.temperature > 0:
            tokens[i : i + 1] = sample_token(logits[i], req)
    return tokens
