"""BERT-style masking for masked-language modelling: 15% of the real tokens are chosen; of those 80%
become [MASK], 10% a random token, 10% stay; labels are the original ids there and -100 elsewhere."""
from __future__ import annotations

import torch

IGNORE_INDEX = -100


def mask_tokens(input_ids: torch.Tensor, generator: torch.Generator, *, vocab_size: int, mask_id: int,
                special_ids: tuple[int, ...], first_regular_id: int, mask_prob: float = 0.15
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked input_ids, labels) for CPU ``input_ids``; at least one token per batch is chosen."""
    special = torch.isin(input_ids, torch.tensor(special_ids, dtype=input_ids.dtype))
    chosen = (torch.rand(input_ids.shape, generator=generator) < mask_prob) & ~special
    if not chosen.any():
        candidates = (~special).nonzero()
        if len(candidates) == 0:
            raise ValueError("masking: the batch has no regular token to mask")
        chosen[tuple(candidates[0])] = True
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    action = torch.rand(input_ids.shape, generator=generator)
    random_ids = torch.randint(first_regular_id, vocab_size, input_ids.shape, generator=generator,
                               dtype=input_ids.dtype)
    masked = torch.where(chosen & (action < 0.8), torch.full_like(input_ids, mask_id), input_ids)
    masked = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_ids, masked)
    return masked, labels
