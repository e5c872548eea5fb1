"""README's recipe on the task family of tests/comera/task_family.py (five label kinds, networks with and
without residual connections, one seed each, alternating, batch 32-128, targets 0.5 and 0.2): rank
adaptation never ends more than 0.05 below the same TT model trained without it, and it reaches its size
target or says why not (its ``shortfall``). The measured table, both seeds of every case: docs/recipe.md
("The task family")."""
import pytest

from tests.comera import task_family

CASES = [pytest.param(*case, id=f"{case[0]}-{case[1]}-s{case[2]}") for case in task_family.SUITE]


@pytest.mark.slow
@pytest.mark.parametrize("task,kind,seed,batch,target", CASES)
def test_rank_adaptation_keeps_what_the_tt_model_learns(task, kind, seed, batch, target):
    twin = task_family.train(task, kind, seed, "tt", batch=batch)
    comera = task_family.train(task, kind, seed, "comera", target=target, batch=batch)
    assert comera.accuracy >= twin.accuracy - 0.05, (comera, twin)
    if comera.shortfall is None:       # reached, give or take one rank
        assert comera.size_ratio <= target * 1.1, comera
    else:                              # says where it stopped
        assert "no late stage" in comera.shortfall or f"{comera.size_ratio:.3f}" in comera.shortfall, comera
    assert comera.removed == ()
