"""harness.workloads.base.evaluating: eval mode and no gradients inside, the training mode restored."""
import pytest
import torch

from harness.workloads.base import evaluating


@pytest.mark.parametrize("training", [True, False])
def test_evaluating_restores_the_mode_also_after_an_error(training):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5)).train(training)
    with evaluating(model):
        assert not model.training and not model[1].training and not torch.is_grad_enabled()
    assert model.training is training and model[1].training is training and torch.is_grad_enabled()
    with pytest.raises(RuntimeError, match="boom"), evaluating(model):
        raise RuntimeError("boom")
    assert model.training is training and torch.is_grad_enabled()
