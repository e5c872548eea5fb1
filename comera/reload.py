"""Loading a pruned checkpoint into a freshly built TT / TTM layer: the ranks travel with the state dict.

A layer takes the state dict's core and gate shapes before loading; build the optimizer after loading
(docs/library.md, "Saving and reloading").
"""
from __future__ import annotations

from torch import nn


def resize_to_state_dict(module: nn.Module, state_dict: dict, prefix: str, error_msgs: list[str]) -> None:
    """Resize ``module.cores`` / ``module.gates`` to the ``{prefix}cores.k`` / ``{prefix}gates.k`` entries
    of ``state_dict`` whose mode sizes match; a chain of bonds that does not fit is reported in
    ``error_msgs`` (``load_state_dict`` raises with it)."""
    changed = False
    for name, size_axes in (("cores", slice(1, -1)), ("gates", slice(0, 0))):  # mode axes (a gate has none)
        params = getattr(module, name)
        for k, param in enumerate(list(params)):
            saved = state_dict.get(f"{prefix}{name}.{k}")
            if saved is None or saved.shape == param.shape or saved.dim() != param.dim():
                continue
            if saved.shape[size_axes] != param.shape[size_axes]:
                continue  # other mode sizes: load_state_dict reports the size mismatch
            params[k] = nn.Parameter(param.new_empty(saved.shape), requires_grad=param.requires_grad)
            changed = True
    if changed:
        cores, gates = list(module.cores), list(module.gates)
        bonds_ok = all(a.shape[-1] == b.shape[0] for a, b in zip(cores, cores[1:]))
        gates_ok = all(g.shape[0] == c.shape[-1] for g, c in zip(gates, cores))
        if not (bonds_ok and gates_ok):
            error_msgs.append(f"{prefix or 'the module'}: the checkpoint's cores and gates do not form one "
                              f"tensor train (cores {[tuple(c.shape) for c in cores]}, gates "
                              f"{[tuple(g.shape) for g in gates]})")


class ResizeOnLoad:
    """Mixin of the TT layers: a state dict with pruned ranks loads into a freshly built layer (its cores
    and gates take the checkpoint's shapes first, :func:`resize_to_state_dict`)."""

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        resize_to_state_dict(self, state_dict, prefix, error_msgs)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
