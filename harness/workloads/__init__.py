"""The benchmark workloads: ``transformer`` (MNLI), ``dlrm`` (Criteo) and ``mlm`` (code or text).

:func:`build_workload` returns a :class:`~harness.workloads.base.Workload`; :func:`check_params` fills the
size preset and defaults, naming unknown keys and bad values; modules are imported on first use.
"""
from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any, Mapping

import torch

from harness import plugins
from harness.workloads.base import Workload
from harness.workloads.params import resolve

_FILES = plugins.discover("workloads", Path(__file__).parent)
WORKLOADS: tuple[str, ...] = tuple(_FILES)
"""transformer, dlrm, mlm, and every other module here (or plug-in folder file) that defines ``build``."""

FEATURES: dict[str, str] = {"sized_models": "sized_candidates"}
"""What a workload may offer a method, each with the module-level function whose presence says the workload
offers it: ``sized_models``, smaller dense models of its kind (:attr:`Workload.sized_models`; the
size-matched dense baseline), where the module defines ``sized_candidates(params, n)``."""

__all__ = ["FEATURES", "WORKLOADS", "PARAMS_DEFAULTS", "Workload", "build_workload", "check_params",
           "features"]


def _module(name: str) -> ModuleType:
    if name not in _FILES:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return plugins.load("workloads", name, _FILES[name], __name__)


def check_params(name: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The full, checked params of workload ``name`` (preset and defaults filled in)."""
    return resolve(name, _module(name), params)


def features(name: str) -> frozenset[str]:
    """The :data:`FEATURES` workload ``name`` offers (known from its module, before anything is built)."""
    module = _module(name)
    return frozenset(feature for feature, function in FEATURES.items() if callable(getattr(module, function,
                                                                                            None)))


def build_workload(name: str, params: Mapping[str, Any] | None, *, batch_size: int, seed: int,
                   device: torch.device | str) -> Workload:
    """Builds model (seeded with ``seed``, on ``device``) and data of workload ``name``."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"workload {name!r}: batch_size={batch_size!r} must be a positive integer")
    checked = check_params(name, params)
    return _module(name).build(checked, batch_size=batch_size, seed=seed, device=torch.device(device))


class _Defaults(Mapping):
    """PARAMS_DEFAULTS[name]: resolved on access, so importing this package stays cheap."""

    def __getitem__(self, name: str) -> dict[str, Any]:
        return check_params(name, {})

    def __iter__(self):
        return iter(WORKLOADS)

    def __len__(self) -> int:
        return len(WORKLOADS)


PARAMS_DEFAULTS: Mapping[str, dict[str, Any]] = _Defaults()
