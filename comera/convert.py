"""Replace ``nn.Linear`` / ``nn.Embedding`` modules of any model by TT / TTM layers, and count sizes.

:func:`tensorize` replaces the modules a spec selects in place (a bad spec raises, naming the key) and
returns a :class:`ConversionReport`; sizes count every parameter of a TT / TTM module. The spec, its
warnings and ``init``: docs/library.md, "tensorize".
"""
from __future__ import annotations

import fnmatch
import math
import re
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from comera.init import INIT_SCHEMES
from comera.size import tensorized_modules
from comera.shapes import factorize
from comera.tt import TTLinear
from comera.ttm import LOOKUP_MODES, TTMEmbedding

DEFAULT_ORDER = 3
DEFAULT_INIT = "official"
INITS = (*INIT_SCHEMES, "svd")


def is_linear(module: nn.Module) -> bool:
    """An ``nn.Linear``, or a linear layer with its weight laid out ``(in, out)``: Hugging Face's ``Conv1D``
    (GPT-2 and its kin; recognized by its class name and its ``nx`` / ``nf`` sizes, without importing
    transformers)."""
    return isinstance(module, nn.Linear) or _is_conv1d(module)


def _is_conv1d(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor)
            and tuple(weight.shape) == (getattr(module, "nx", None), getattr(module, "nf", None)))


def _is_layer(module: nn.Module) -> bool:
    return is_linear(module) or isinstance(module, nn.Embedding)


ALL = {"all-linear": is_linear, "all-embedding": lambda module: isinstance(module, nn.Embedding)}
WEIGHT_READERS = (nn.MultiheadAttention,)
"""Modules that read a child ``nn.Linear``'s ``weight`` directly instead of calling it
(``nn.MultiheadAttention`` passes ``out_proj.weight`` to ``F.multi_head_attention_forward``): a TT layer
cannot stand in for that child."""
SPEC_KEYS = {
    "linear": {"kind", "in_shape", "out_shape", "rank", "order", "init"},
    "embedding": {"kind", "row_shape", "col_shape", "rank", "lookup", "order", "tensor_index_level",
                  "unique_rows", "init", "init_std"},
}


@dataclass
class ConversionReport:
    """Sizes before and after :func:`tensorize` (parameter counts and their ratios)."""

    params_dense_total: int
    params_total: int
    params_dense_layers: int
    params_layers: int
    compression_total: float
    compression_layers: float
    layers: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # module / parameter name -> why left dense
    fast_path_off: list[str] = field(default_factory=list)  # modules whose fused inference path is off

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def tensorize(model: nn.Module, spec: dict[str, dict[str, Any]] | str | list[str],
              **defaults: Any) -> ConversionReport:
    """Replace the modules of ``model`` that ``spec`` selects, in place, by ``TTLinear`` / ``TTMEmbedding``
    (``defaults``: entry values for every selected module, an entry's own keys win)."""
    if isinstance(spec, str):
        spec = [spec]
    if isinstance(spec, (list, tuple)):
        spec = {key: {} for key in spec}
    if not isinstance(spec, dict):
        raise TypeError(f"tensorize: spec must be a dict of module name or pattern -> entry, a pattern or a "
                        f"list of patterns, got {type(spec).__name__}")
    unknown = set(defaults) - set().union(*SPEC_KEYS.values())
    if unknown:
        raise ValueError(f"tensorize: unknown keyword(s) {sorted(unknown)}; allowed: "
                         f"{sorted(set().union(*SPEC_KEYS.values()))}")
    params_dense_total = _count(model)
    modules = dict(model.named_modules())
    replacements = {}
    selected, skipped = _select(modules, spec)
    if skipped:
        warnings.warn(f"tensorize: left out {sorted(skipped)}: " + "; ".join(sorted(set(skipped.values()))),
                      stacklevel=2)
    for name, (key, entry) in selected.items():
        entry = _check_entry(key, entry if entry is not None else {}, modules[name], defaults)
        replacements[name] = _build(name, modules[name], entry)
    _warn_about_tied_weights(modules, replacements)
    layers = {}
    params_dense_layers = params_layers = 0
    for name, new in replacements.items():
        dense = _count(modules[name])
        _set_submodule(model, name, new)
        params_dense_layers += dense
        params_layers += _count(new)
        layers[name] = _layer_summary(new, dense)
        if layers[name]["params"] > dense:
            warnings.warn(f"tensorize: layer {name!r} grows: its TT has {layers[name]['params']:,} "
                          f"parameters, its dense {type(modules[name]).__name__} {dense:,} (ranks "
                          f"{layers[name]['ranks']}; lower the rank or use more modes)", stacklevel=2)
    params_total = _count(model)
    fast_path_off = turn_off_fused_paths(model)
    return ConversionReport(
        params_dense_total=params_dense_total, params_total=params_total,
        params_dense_layers=params_dense_layers, params_layers=params_layers,
        compression_total=params_dense_total / params_total,
        compression_layers=params_dense_layers / params_layers if params_layers else math.inf,
        layers=layers, skipped=skipped, fast_path_off=fast_path_off)


def turn_off_fused_paths(model: nn.Module) -> list[str]:
    """Turn off PyTorch's fused inference path where it would read a TT layer's dense ``weight``.

    In eval mode without gradients, ``nn.TransformerEncoderLayer`` runs one fused kernel that reads
    ``linear1.weight`` and ``linear2.weight``, and ``nn.TransformerEncoder`` reads its first layer's
    (for a padding mask, through nested tensors). For each such layer with a replaced ``linear1`` or
    ``linear2`` this sets ``activation_relu_or_gelu = 0`` (the flag that path checks; the layer's own
    ``activation`` is unchanged) and ``use_nested_tensor = False`` on the encoders holding it: that layer
    runs its modules one by one, as in training; other layers and models keep the fused path.

    Args:
        model: a model after :func:`tensorize` (called by it).

    Returns:
        The names of the encoder layers and encoders changed, in ``model.named_modules()`` order.
    """
    changed, off = [], set()
    for name, module in model.named_modules():
        if isinstance(module, nn.TransformerEncoderLayer) and not all(
                isinstance(getattr(module, child, None), nn.Linear) for child in ("linear1", "linear2")):
            off.add(id(module))
            if module.activation_relu_or_gelu:
                module.activation_relu_or_gelu = 0
                changed.append(name)
    for name, module in model.named_modules():
        if (isinstance(module, nn.TransformerEncoder) and getattr(module, "use_nested_tensor", False)
                and any(id(layer) in off for layer in module.layers)):
            module.use_nested_tensor = False
            changed.append(name)
    return changed


def model_size(model: nn.Module) -> dict[str, float]:
    """The sizes of the current (possibly pruned) model against its dense equivalent, every parameter
    counted on both sides (a TT layer's bias with its cores and gates, as the dense layer's with its
    weight; the counts :func:`tensorize`'s report gives right after it).

    Returns:
        ``params_total`` (parameters now), ``params_dense_total`` (the dense equivalent: every TT / TTM
        layer counted as the layer it stands for), ``params_factorized_layers`` and ``params_dense_layers``
        (the TT / TTM layers now and their dense equivalents), ``compression_total`` and
        ``compression_layers`` (dense / now).
    """
    params_total = _count(model)
    tt_layers = tensorized_modules(model)
    params_layers = sum(_count(module) for _, module in tt_layers)
    dense_layers = sum(dense_equivalent(module) for _, module in tt_layers)
    return {
        "params_total": float(params_total),
        "params_dense_total": float(params_total - params_layers + dense_layers),
        "params_factorized_layers": float(params_layers),
        "params_dense_layers": float(dense_layers),
        "compression_total": (params_total - params_layers + dense_layers) / params_total,
        "compression_layers": dense_layers / params_layers if params_layers else (
            math.inf if dense_layers else 1.0),
    }


def dense_equivalent(module: nn.Module) -> int:
    """Parameters of the ``nn.Linear`` / ``nn.Embedding`` a TT / TTM module stands for."""
    if isinstance(module, TTMEmbedding):
        return module.num_embeddings * module.embedding_dim
    if isinstance(module, TTLinear):
        bias = module.out_features if module.bias is not None else 0
        return module.in_features * module.out_features + bias
    raise TypeError(f"dense_equivalent: {type(module).__name__} is neither TTLinear nor TTMEmbedding")


def _select(modules: dict[str, nn.Module],
            spec: dict[str, Any]) -> tuple[dict[str, tuple[str, Any]], dict[str, str]]:
    """``(selected, skipped)``: module name -> (the spec key that selects it, its entry), exact names winning
    over patterns; and module name -> why a pattern left it out (a child whose weight its parent reads)."""
    selected: dict[str, tuple[str, Any]] = {}
    read = _weights_read_by_parent(modules)
    exact = {key for key in spec if key in modules and key != ""}
    for key in exact & set(read):
        raise ValueError(f"tensorize: module {key!r} cannot be replaced: {read[key]}")
    skipped: dict[str, str] = {}
    for key, entry in spec.items():
        if key in exact:
            selected[key] = (key, entry)
            continue
        names = [name for name, module in modules.items() if name and _is_layer(module)
                 and _matches(key, name, module)]
        if not names:
            raise KeyError(f"tensorize: spec key {key!r} is no module name of the model and, as a pattern, "
                           f"selects no nn.Linear (or Conv1D) / nn.Embedding; names: {_some_names(modules)}")
        skipped.update((name, read[name]) for name in names if name in read)
        skipped.update(_dense_in_projections(modules, [name for name in names if name in read]))
        for name in names:
            if name in exact or name in read:
                continue
            if name in selected:
                raise ValueError(f"tensorize: module {name!r} is selected by both {selected[name][0]!r} and "
                                 f"{key!r}; name it exactly or narrow a pattern")
            selected[name] = (key, entry)
    return selected, skipped


def _warn_about_tied_weights(modules: dict[str, nn.Module], replaced: dict[str, nn.Module]) -> None:
    """Warn when a replaced module's weight is also another module's (tied, e.g. an output layer sharing the
    input embedding's table): the TT layer gets its own parameters and the other module keeps the dense
    weight alone, untied."""
    owners: dict[int, list[str]] = {}
    for name, module in modules.items():
        for param in module.parameters(recurse=False):
            owners.setdefault(id(param), []).append(name)
    for name in replaced:
        weight = getattr(modules[name], "weight", None)
        others = [o for o in owners.get(id(weight), []) if o != name and o not in replaced]
        if others:
            warnings.warn(f"tensorize: the weight of {name!r} is tied to {others}; the TT layer does not "
                          f"share it, so {others} keep{'s' if len(others) == 1 else ''} the dense weight, "
                          "untied (replace both, or neither)", stacklevel=3)


def _weights_read_by_parent(modules: dict[str, nn.Module]) -> dict[str, str]:
    """Names of the ``nn.Linear`` children of :data:`WEIGHT_READERS` modules, with the reason."""
    read = {}
    for name, module in modules.items():
        if isinstance(module, WEIGHT_READERS):
            for child_name, child in module.named_children():
                if isinstance(child, nn.Linear):
                    full = f"{name}.{child_name}" if name else child_name
                    read[full] = (f"{type(module).__name__} reads its weight directly instead of calling it, "
                                  "so a TT layer cannot stand in for it")
    return read


def _dense_in_projections(modules: dict[str, nn.Module], read: list[str]) -> dict[str, str]:
    """The Q/K/V projections of each ``nn.MultiheadAttention`` whose ``out_proj`` a pattern reached
    (``read``): ``<attention>.in_proj_weight`` (or ``q_proj_weight`` / ``k_proj_weight`` /
    ``v_proj_weight`` when its key and value sizes differ) -> why they stay dense."""
    found = {}
    for child in read:
        parent = child.rpartition(".")[0]
        attention = modules.get(parent)
        if not isinstance(attention, nn.MultiheadAttention):
            continue
        for param_name in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight"):
            if getattr(attention, param_name, None) is not None:
                found[f"{parent}.{param_name}" if parent else param_name] = (
                    "MultiheadAttention holds its Q/K/V projections as Parameters, not nn.Linear modules, so "
                    "they stay dense")
    return found


def _matches(key: str, name: str, module: nn.Module) -> bool:
    if key in ALL:
        return ALL[key](module)
    if key.startswith("re:"):
        try:
            return re.fullmatch(key[3:], name) is not None
        except re.error as error:
            raise ValueError(f"tensorize: spec key {key!r} is not a valid regular expression: "
                             f"{error}") from None
    return fnmatch.fnmatchcase(name, key)


def _some_names(modules: dict[str, nn.Module], shown: int = 12) -> str:
    names = [f"{name} ({type(m).__name__})" for name, m in modules.items()
             if name and _is_layer(m)]
    return ", ".join(names[:shown]) + (f", ... ({len(names)} in all)" if len(names) > shown else "") or "none"


def _check_entry(name: str, entry: Any, module: nn.Module, defaults: dict[str, Any]) -> dict[str, Any]:
    """The entry with its kind (read from the module where omitted) and the defaults its kind takes."""
    if not isinstance(entry, dict):
        raise ValueError(f"tensorize: spec[{name!r}] must be a dict, got {entry!r}")
    entry = {**({"kind": defaults["kind"]} if "kind" in defaults else {}), **entry}
    if "kind" not in entry:
        if not _is_layer(module):
            raise TypeError(f"tensorize: spec[{name!r}] selects a {type(module).__name__}, which is neither "
                            "nn.Linear (or Conv1D) nor nn.Embedding")
        entry = {**entry, "kind": "linear" if is_linear(module) else "embedding"}
    if entry["kind"] not in SPEC_KEYS:
        raise ValueError(f"tensorize: spec[{name!r}] needs 'kind' in {sorted(SPEC_KEYS)}, got {entry!r}")
    allowed = SPEC_KEYS[entry["kind"]]
    entry = {**{k: v for k, v in defaults.items() if k in allowed}, **entry}
    for key in entry:
        if key not in allowed:
            raise ValueError(f"tensorize: spec[{name!r}] has unknown key {key!r}; allowed: {sorted(allowed)}")
    if "rank" not in entry:
        raise ValueError(f"tensorize: spec[{name!r}] needs a 'rank'")
    if entry.get("init", DEFAULT_INIT) not in INITS:
        raise ValueError(f"tensorize: spec[{name!r}]['init']={entry['init']!r}, expected one of {INITS}")
    std = entry.get("init_std")
    if std is not None and not (isinstance(std, (int, float)) and not isinstance(std, bool)
                                and 0 < std < math.inf):
        raise ValueError(f"tensorize: spec[{name!r}]['init_std']={std!r}, expected a positive number or None")
    if entry["kind"] == "embedding" and entry.get("lookup", "optimized") not in LOOKUP_MODES:
        raise ValueError(f"tensorize: spec[{name!r}]['lookup']={entry['lookup']!r}, expected one of "
                         f"{LOOKUP_MODES}")
    return entry


def _build(name: str, module: nn.Module, entry: dict[str, Any]) -> nn.Module:
    order = int(entry.get("order", DEFAULT_ORDER))
    init = entry.get("init", DEFAULT_INIT)
    reads_values = init == "svd" or (init == "default" and isinstance(module, nn.Embedding)
                                     and entry.get("init_std") is None)
    if reads_values and getattr(module, "weight", None) is not None and module.weight.is_meta:
        raise ValueError(f"tensorize: spec[{name!r}] has init={init!r}, which reads the layer's weight, but "
                         "it is on the meta device (no values): load the weights first, or use "
                         "init='official'" + (" or give 'init_std'" if init == "default" else ""))
    if entry["kind"] == "linear":
        if not is_linear(module):
            raise TypeError(f"tensorize: spec[{name!r}] is 'linear' but the module is "
                            f"{type(module).__name__}")
        weight = module.weight if _is_conv1d(module) else module.weight.T  # (in, out)
        in_features, out_features = weight.shape
        in_shape = entry.get("in_shape") or factorize(in_features, order)
        out_shape = entry.get("out_shape") or factorize(out_features, order)
        if init == "svd":
            return TTLinear.from_weight(weight, module.bias, rank=entry["rank"], in_shape=list(in_shape),
                                        out_shape=list(out_shape))
        return TTLinear(in_features, out_features, in_shape=list(in_shape), out_shape=list(out_shape),
                        rank=entry["rank"], bias=module.bias is not None, init=init, device=weight.device,
                        dtype=weight.dtype)
    if not isinstance(module, nn.Embedding):
        raise TypeError(f"tensorize: spec[{name!r}] is 'embedding' but the module is {type(module).__name__}")
    ignored = {key: getattr(module, key) for key in ("max_norm", "scale_grad_by_freq", "sparse")
               if getattr(module, key) not in (None, False)}
    if ignored:
        warnings.warn(f"tensorize: embedding {name!r} has {ignored}, which TTMEmbedding does not apply (its "
                      "rows are products of cores: no row renormalization, frequency scaling or sparse "
                      "gradients)", stacklevel=3)
    row_shape = entry.get("row_shape") or factorize(module.num_embeddings, order, allow_larger=True)
    col_shape = entry.get("col_shape") or factorize(module.embedding_dim, order)
    if init == "svd":
        layer = TTMEmbedding.from_embedding(module, rank=entry["rank"], row_shape=list(row_shape),
                                            col_shape=list(col_shape),
                                            lookup=entry.get("lookup", "optimized"))
        layer.tensor_index_level = (layer.tensor_index_level if entry.get("tensor_index_level") is None
                                    else bool(entry["tensor_index_level"]))
        layer.unique_rows = (layer.unique_rows if entry.get("unique_rows") is None
                             else bool(entry["unique_rows"]))
        return layer
    return TTMEmbedding(module.num_embeddings, module.embedding_dim, row_shape=list(row_shape),
                        col_shape=list(col_shape), rank=entry["rank"], padding_idx=module.padding_idx,
                        lookup=entry.get("lookup", "optimized"),
                        tensor_index_level=entry.get("tensor_index_level"),
                        unique_rows=entry.get("unique_rows"),
                        init_std=_table_std(module, entry.get("init_std"), init),
                        init=init, device=module.weight.device, dtype=module.weight.dtype)


def _table_std(module: nn.Embedding, init_std: float | None, init: str) -> float:
    """The TTM table's std: ``init_std`` if given, else the scheme's (official: 1, default: the module's)."""
    if init_std is not None:
        return float(init_std)
    return 1.0 if init == "official" else float(module.weight.detach().float().std())


def _layer_summary(module: nn.Module, params_dense: int) -> dict[str, Any]:
    params = _count(module)
    if isinstance(module, TTMEmbedding):
        kind, shapes = "embedding", {"row_shape": list(module.row_shape), "col_shape": list(module.col_shape)}
    else:
        kind, shapes = "linear", {"in_shape": list(module.in_shape), "out_shape": list(module.out_shape)}
    summary = {"kind": kind, **shapes, "ranks": list(module.ranks), "params_dense": params_dense,
               "params": params, "compression": params_dense / params if params else math.inf}
    if module.reconstruction_error is not None:
        summary["reconstruction_error"] = module.reconstruction_error
    return summary


def _set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
