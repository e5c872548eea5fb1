"""README's recipe on a model built from ``nn.TransformerEncoder`` (a character-level language model, the
shape of a user's) keeps every layer: ranks go by their share of their bond, so a bond keeps its largest
(and ``min_rank`` 1 keeps one anyway). Removing a layer whose weight is zero (``min_rank=0``), openly:
tests/comera/test_prune.py and test_rank.py."""
import torch
from torch import nn

import comera

VOCAB, WIDTH, CONTEXT = 32, 32, 16


class CharLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, 2, 4 * WIDTH, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        return self.head(self.encoder(self.embed(tokens), mask=causal, is_causal=True))


def train(min_rank: int, steps: int = 150, target: float = 0.3) -> comera.RankAdaptation:
    torch.manual_seed(0)
    text = torch.randint(0, VOCAB, (4096,))
    text[1::2] = (text[0::2] * 7 + 3) % VOCAB  # every second character follows from the one before
    model = CharLM()
    comera.tensorize(model, "all-linear", rank=8)
    optimizer = torch.optim.AdamW(comera.param_groups(model, lr=3e-3))
    adapt = comera.RankAdaptation(model, optimizer, target=target, total_steps=steps, switch_when="step",
                                  min_rank=min_rank)
    for _ in range(steps):
        start = torch.randint(0, len(text) - CONTEXT - 1, (32,))
        window = torch.stack([text[s:s + CONTEXT + 1] for s in start])
        logits = model(window[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), window[:, 1:].reshape(-1))
        adapt.loss(loss).backward()
        optimizer.step()
        optimizer.zero_grad()
        adapt.step()
    return adapt


def test_the_recipe_keeps_a_rank_in_every_bond_of_every_layer():
    adapt = train(min_rank=1)
    ranks = adapt.ranks()
    assert len(ranks) == 5  # linear1 and linear2 of both blocks, the head (not the attention's out_proj)
    assert all(min(bonds) >= 1 for bonds in ranks.values()), ranks
    assert adapt.removed_layers == [] and "removed" not in adapt.summary()
