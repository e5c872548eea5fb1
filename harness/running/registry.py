"""Where a cell's workload and method come from: the registries (harness.workloads, baselines; tests inject
toys), and the spec of a cell made with their params checks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from harness import spec as specs

@dataclass
class Registry:
    """Where workloads and methods come from (the real ones by default; tests inject toys)."""

    build_workload: Callable[..., Any]
    get_method: Callable[[str], Any]
    check_workload_params: Callable[[str, dict], dict] = lambda name, params: dict(params)
    check_method_params: Callable[[str, dict], dict] = lambda name, params: dict(params)

    @property
    def checks(self) -> specs.ParamChecks:
        """The params checks a spec of this registry's cells is made with (harness.spec.make)."""
        return specs.ParamChecks(self.check_workload_params, self.check_method_params)


def default_registry() -> Registry:
    import baselines
    import harness.workloads as workloads

    return Registry(workloads.build_workload, baselines.get_method,
                    workloads.check_params, baselines.check_params)


def cell_spec(spec: specs.Spec | dict[str, Any], registry: Registry) -> specs.Spec:
    """``spec`` itself, or a spec's JSON object made into one with the registry's checks."""
    return spec if isinstance(spec, specs.Spec) else specs.make(spec, registry.checks)
