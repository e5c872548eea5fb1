"""README's recipe on a model built from PyTorch's own transformer modules: a character-level language
model on ``nn.TransformerEncoder`` (causal mask) trains with rank adaptation, evaluates under
``torch.no_grad()`` in eval mode (where PyTorch would run its fused encoder-layer kernel, which reads
``linear1.weight``), saves and reloads into a freshly tensorized model with the same outputs."""
import math
import warnings

import pytest
import torch
from torch import nn

import comera

TEXT = "the quick brown fox jumps over the lazy dog; " * 40
CHARS = sorted(set(TEXT))
SEQ, STEPS, LR = 24, 120, 3e-3


class CharLM(nn.Module):
    def __init__(self, vocab: int, d_model: int = 32, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(0.02 * torch.randn(SEQ, d_model))
        block = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=64, dropout=0.0,
                                           batch_first=True)
        with warnings.catch_warnings():  # enable_nested_tensor is moot without a padding mask
            warnings.simplefilter("ignore")
            self.encoder = nn.TransformerEncoder(block, layers)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        h = self.embed(tokens) + self.pos[:tokens.shape[1]]
        if padding is not None:  # the encoder's nested-tensor path takes a padding mask without a mask
            return self.head(self.encoder(h, src_key_padding_mask=padding))
        return self.head(self.encoder(h, mask=mask, is_causal=True))


def batches(seed: int) -> torch.Tensor:
    data = torch.tensor([CHARS.index(c) for c in TEXT])
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - SEQ - 1, (16,), generator=g)
    return torch.stack([data[s:s + SEQ + 1] for s in starts])


def loss_of(model: nn.Module, chunk: torch.Tensor) -> torch.Tensor:
    logits = model(chunk[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1))


def tensorized() -> tuple[CharLM, comera.ConversionReport]:
    model = CharLM(len(CHARS))
    with warnings.catch_warnings():  # the attention's out_proj is left out, with a warning
        warnings.simplefilter("ignore")
        report = comera.tensorize(model, "all-linear", rank=8)
    return model, report


def test_a_char_lm_on_transformer_encoder_trains_evaluates_and_reloads(tmp_path):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, report = tensorized()
    assert "encoder.layers.0.linear1" in report.layers and "encoder.layers.1.linear2" in report.layers
    assert report.fast_path_off == ["encoder.layers.0", "encoder.layers.1", "encoder"]
    optimizer = torch.optim.AdamW(comera.param_groups(model, lr=LR))
    # the late stage at the fixed step (this short run is still learning: converged, it would not switch)
    adapt = comera.RankAdaptation(model, optimizer, target=0.5, total_steps=STEPS, switch_when="step")
    for step in range(STEPS):
        adapt.loss(loss_of(model, batches(step))).backward()
        optimizer.step()
        optimizer.zero_grad()
        adapt.step()
    assert adapt.stage == "late"

    held_out = batches(10_000)
    model.eval()
    with torch.no_grad():  # PyTorch's fused path would read linear1.weight here
        loss = loss_of(model, held_out).item()
        padding = torch.zeros(held_out.shape[0], SEQ, dtype=torch.bool)
        padding[:, -3:] = True
        padded = model(held_out[:, :-1], padding)
    assert loss < math.log(len(CHARS)) - 0.5, loss  # it learned something beyond a uniform guess

    torch.save(model.state_dict(), tmp_path / "tt.pt")
    fresh, _ = tensorized()
    fresh.load_state_dict(torch.load(tmp_path / "tt.pt"))
    fresh.eval()
    with torch.no_grad():
        assert loss_of(fresh, held_out).item() == pytest.approx(loss, rel=1e-6)
        torch.testing.assert_close(fresh(held_out[:, :-1], padding), padded)


def test_only_the_encoder_layers_whose_linears_were_replaced_lose_the_fused_path():
    """Per layer: a layer whose feed-forward stays dense keeps PyTorch's fused inference path, and so
    does an encoder none of whose layers changed; a decoder layer (no fused path) runs as it is."""
    enc = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    kept = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    dec = nn.TransformerDecoderLayer(16, 2, 32, batch_first=True)
    model = nn.ModuleDict({"enc": enc, "kept": kept, "dec": dec})
    report = comera.tensorize(model, {"enc.linear1": {}, "dec.linear1": {}, "dec.linear2": {}}, rank=4)
    assert report.fast_path_off == ["enc"]
    assert enc.activation_relu_or_gelu == 0 and kept.activation_relu_or_gelu == 1
    model.eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        assert enc(x).shape == kept(x).shape == dec(x, x).shape == x.shape
