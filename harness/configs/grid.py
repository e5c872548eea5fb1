"""The experiment grid of a pipeline config: one spec (docs/usage.md) per cell.

After the Snakefile's schema check, :func:`check_config` checks params by their owners and
:func:`expand_grid` makes the cells; plain Python, testable without Snakemake.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Hashable, Iterable
from pathlib import Path
from typing import Any

import yaml

from harness import settings
from harness import spec as specs
from harness.configs.yamlnum import NumberLoader
from harness.spec import MAX_MAGNITUDE, Spec, slug

LABEL_PATTERN = settings.LABEL_PATTERN
"""A device label (a results folder name); the schema's ``$defs.label`` pattern."""
DEVICE_ENV = "COMERA_BENCH_DEVICE"


class ConfigError(ValueError):
    """A config value the pipeline cannot run with; the message names the key."""


def device_label(config: dict[str, Any]) -> str:
    """The results folder name of this machine: ``device_name`` from the config, else "cpu" for CPU
    runs, else the slug of the first visible GPU's name (e.g. "nvidia-h200"; "cuda" where no GPU is
    visible, e.g. on a cluster's login node)."""
    if config.get("device_name"):
        return config["device_name"]
    if config["execution"]["device"] == "cpu":
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return slug(torch.cuda.get_device_name(0))
    return "cuda" if config["execution"]["device"].startswith("cuda") else "cpu"


def uses_gpu(config: dict[str, Any]) -> bool:
    """Whether the cells run on a GPU (execution.device cuda or cuda:N, or auto on a machine with one)."""
    device = config["execution"]["device"]
    if device != "auto":
        return device.startswith("cuda")
    import torch

    return torch.cuda.is_available()


def env_device_label() -> str | None:
    """The device label from the COMERA_BENCH_DEVICE environment variable (None when unset or empty);
    a value that is not a plain folder name raises ConfigError naming the variable and the value."""
    try:
        return settings.read(DEVICE_ENV)
    except settings.SettingError as err:
        raise ConfigError(str(err)) from None


class _StrictLoader(NumberLoader):
    """A YAML loader that rejects a key given twice in one mapping (numbers as
    :mod:`harness.configs.yamlnum`)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *anchor" may be overridden by own keys
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, Hashable):  # the base loader names it
                continue
            if key in seen:
                raise ConfigError(f"config file {self.name}: key {key!r} appears twice (lines {seen[key]} "
                                  f"and {line}); the second would silently replace the first")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


MAX_CONFIG_VALUES = 100_000
"""A config that expands to more values than this (YAML aliases nested into each other, an "alias bomb")
is refused before anything walks it."""


def _check_size(value: Any, path: str | os.PathLike) -> None:
    """ConfigError when ``value`` holds more than MAX_CONFIG_VALUES values once its aliases are expanded
    (counted without expanding: a walk that stops at the limit)."""
    stack, seen = [value], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > MAX_CONFIG_VALUES:
            raise ConfigError(f"config file {path}: more than {MAX_CONFIG_VALUES} values once its YAML "
                              "aliases are expanded; refused (nested aliases multiply)")
        if isinstance(item, dict):
            stack.extend(item.values())
            stack.extend(item.keys())
        elif isinstance(item, list):
            stack.extend(item)


def load_config_file(path: str | os.PathLike) -> Any:
    """A YAML (or JSON) config file; a duplicated key raises ConfigError naming the file and the key, and
    so does a file that expands to more than MAX_CONFIG_VALUES values."""
    with open(path, encoding="utf-8") as fh:
        loader = _StrictLoader(fh)
        loader.name = str(path)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    _check_size(data, path)
    return data


def _key(path: Iterable[Any]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "(top level)"


def _non_finite(value: Any, path: tuple = ()) -> tuple[tuple, float] | None:
    """The first NaN, infinite or too large (MAX_MAGNITUDE) number anywhere in ``value``: (its key path,
    the number), or None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not (
            math.isfinite(value) and abs(value) <= MAX_MAGNITUDE):
        return path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = _non_finite(v, (*path, k))
        if found:
            return found
    return None


def _schema(schema: dict[str, Any] | str | Path | None) -> dict[str, Any]:
    from harness.configs.schema import config_schema

    if isinstance(schema, dict):
        return schema
    return config_schema() if schema is None else yaml.safe_load(Path(schema).read_text())


def schema_error(config: dict[str, Any], schema: dict[str, Any] | str | Path | None = None) -> str | None:
    """The most relevant violation of ``config`` as "key a.b[0]: message", or None: a NaN or infinite
    number anywhere, else the JSON schema (a dict, a YAML file, default the config's:
    :func:`harness.configs.schema.config_schema`), where (unlike JSON schema's own rule) an integer field
    rejects a float such as 4.0."""
    import jsonschema

    found = _non_finite(config)
    if found:
        what = "a finite number" if isinstance(found[1], float) and not math.isfinite(found[1]) else \
            f"a number of size at most 2**32 ({MAX_MAGNITUDE})"
        shown = found[1] if isinstance(found[1], int) else f"{found[1]:.6g}"
        return f"key {_key(found[0])}: {shown} is not {what}"
    base = jsonschema.Draft202012Validator
    strict_int = base.TYPE_CHECKER.redefine(
        "integer", lambda _, v: isinstance(v, int) and not isinstance(v, bool))
    validator = jsonschema.validators.extend(base, type_checker=strict_int)(_schema(schema))
    error = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if error is None:
        return None
    message = error.message
    if error.validator == "pattern" and "title" in error.schema:
        message += f" ({error.schema['title']})"
    return f"key {_key(error.absolute_path)}: {message}"


def fill_defaults(config: dict[str, Any], schema: dict[str, Any] | str | Path | None = None) -> None:
    """Fill the schema's defaults into ``config`` in place, at every level (a valid config:
    :func:`schema_error` first), as ``snakemake.utils.validate`` does."""
    import copy

    import jsonschema

    base = jsonschema.Draft202012Validator

    def set_defaults(validator, properties, instance, sub):
        for prop, node in properties.items():
            if "default" in node and isinstance(instance, dict):
                instance.setdefault(prop, copy.deepcopy(node["default"]))
        yield from base.VALIDATORS["properties"](validator, properties, instance, sub)

    jsonschema.validators.extend(base, {"properties": set_defaults})(_schema(schema)).validate(config)


def _method_refs(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": ref} if isinstance(ref, str) else dict(ref) for ref in workload["methods"]]


def sections(workload: dict[str, Any]) -> list[tuple[str, str, dict[str, Any], dict[str, Any], str]]:
    """``(purpose, config key, section, workload params, run_id suffix)`` of a workload: its own cells
    ("timing": short runs for time and memory) and, when it has a ``quality`` block, the cells of that
    block ("quality": trained long enough to compare accuracy and rank adaptation; its ``params``
    override the workload's); each once per point of the workload's ``sweep`` (param -> values; the
    point's params override both, the suffix names it, e.g. "_seq_len512")."""
    keys = sorted(workload.get("sweep", {}))
    points = [dict(zip(keys, values))
              for values in itertools.product(*(workload["sweep"][k] for k in keys))] if keys else [{}]
    out = []
    for point in points:
        suffix = "".join(f"_{k}{v}" for k, v in point.items())
        out.append(("timing", "", workload, {**workload["params"], **point}, suffix))
        quality = workload.get("quality")
        if quality:
            out.append(("quality", ".quality", quality, {**workload["params"], **quality["params"], **point},
                        suffix))
    return out


def module_of(name: str, workload: dict[str, Any]) -> str:
    """The workload module a config entry runs: its key ``workload``, else the entry's name."""
    return workload.get("workload", name)


def check_config(config: dict[str, Any], missing: list[str] | None = None) -> None:
    """Cross-key checks the JSON schema cannot express, plus the methods' and workloads' own parameter
    checks (``baselines.check_params``, ``harness.workloads.check_params``). Raises ConfigError naming
    the key. With a ``missing`` list (a dry run: the plan needs no data), a data path that does not exist
    is appended to it, naming the key, instead of raised."""
    from harness.plugins import PluginError
    from harness.configs import microbench_spec

    try:
        import baselines
        import harness.workloads as workloads
    except PluginError as err:
        raise ConfigError(str(err)) from err
    for name, entry in config["methods"].items():
        if entry["method"] not in baselines.METHODS:
            raise ConfigError(f"config key methods.{name}.method: unknown method {entry['method']!r}; known "
                              f"methods: {list(baselines.METHODS)}")
        for key, values in entry["sweep"].items():
            if key in entry["params"]:
                raise ConfigError(f"config key methods.{name}.sweep.{key}: also set in methods.{name}.params")
            for value in values:
                _checked(baselines.check_params, entry["method"], {**entry["params"], key: value},
                         f"methods.{name}.sweep.{key}")
        _checked(baselines.check_params, entry["method"], entry["params"], f"methods.{name}.params")
        if entry.get("match"):
            matched = config["methods"].get(entry["match"])
            if matched is None or not matched["uses_target"] or matched["sweep"] or entry["uses_target"]:
                raise ConfigError(
                    f"config key methods.{name}.match: {entry['match']!r} must name a method configuration "
                    "with uses_target and no sweep (one to match per target), and this one must have no "
                    f"uses_target; defined: {sorted(config['methods'])}")
            _checked(baselines.check_params, entry["method"], {**entry["params"], specs.MATCH_PARAM: "cell"},
                     f"methods.{name}.match (method {entry['method']!r} takes no param match_run)")
    for wname, workload in config["workloads"].items():
        module = module_of(wname, workload)
        if module not in workloads.WORKLOADS:
            where = f"workloads.{wname}" + (".workload" if "workload" in workload else "")
            raise ConfigError(f"config key {where}: unknown workload {module!r}; known: "
                              f"{list(workloads.WORKLOADS)}")
        for purpose, key, section, params, _ in sections(workload):
            _checked(workloads.check_params, module, params, f"workloads.{wname}{key}.params", missing)
            budget = section["budget"]
            if budget["max_steps_per_epoch"] is not None and (
                    budget["warmup_steps"] >= budget["epochs"] * budget["max_steps_per_epoch"]):
                raise ConfigError(
                    f"config key workloads.{wname}{key}.budget.warmup_steps: {budget['warmup_steps']} "
                    f"warm-up step(s) of {budget['epochs'] * budget['max_steps_per_epoch']} leave no "
                    "timed step")
            for i, ref in enumerate(_method_refs(section)):
                if ref["name"] not in config["methods"]:
                    raise ConfigError(
                        f"config key workloads.{wname}{key}.methods[{i}]: unknown method configuration "
                        f"{ref['name']!r}; defined in methods: {sorted(config['methods'])}")
                _check_method_on_workload(config["methods"][ref["name"]], ref["name"], module,
                                          f"workloads.{wname}{key}.methods[{i}]")
                if purpose == "timing":
                    _check_periodic(config, ref["name"], budget, f"workloads.{wname}{key}.budget")
                if config["methods"][ref["name"]].get("match"):
                    _matched_ref(config, section, ref, f"workloads.{wname}{key}.methods[{i}]", key)
    for name, spec in config["microbench"]["specs"].items():
        try:
            microbench_spec.check_spec(spec, source=f"spec {name}")
        except ValueError as err:
            raise ConfigError(f"config key microbench.specs.{name}: {err}") from err


def _check_method_on_workload(entry: dict[str, Any], name: str, workload: str, key: str) -> None:
    """ConfigError naming ``key``, the method configuration ``name`` and ``workload`` when a variant of the
    configuration needs what the workload does not offer (``baselines.workload_needs``,
    ``harness.workloads.features``): every such cell would end as an error row after it ran."""
    import baselines
    import harness.workloads as workloads

    offered = workloads.features(workload)
    for _, params, _ in _variants(entry):
        if entry.get("match"):  # the grid fills the matched cell's run_id in
            params = {**params, specs.MATCH_PARAM: entry["match"]}
        needs = baselines.workload_needs(entry["method"], baselines.check_params(entry["method"], params))
        for feature, why in needs.items():
            if feature not in offered:
                raise ConfigError(
                    f"config key {key}: method configuration {name!r} (method {entry['method']!r}) cannot "
                    f"run on workload {workload!r}: {why}, and workload {workload!r} offers no {feature} "
                    f"(its module defines no {workloads.FEATURES[feature]}; docs/workloads.md); leave "
                    f"{name!r} out of this workload's methods")


def _check_periodic(config: dict[str, Any], name: str, budget: dict[str, Any], key: str) -> None:
    """ConfigError when a timing cell of method configuration ``name`` with ``budget`` could time some
    periodic work of its method (``baselines.periodic``) neither in rounds of whole periods, nor on a
    counted step of its schedule, nor forced (harness.core.timing.plan_periodic): its mean step time
    would leave that work out. Budgets of full epochs (steps unknown before the data) are not checked."""
    import baselines
    from harness.core import timing

    if budget["max_steps_per_epoch"] is None:
        return
    entry, execution = config["methods"][name], config["execution"]
    total, warmup = budget["epochs"] * budget["max_steps_per_epoch"], budget["warmup_steps"]
    interleaved = bool(execution.get("interleave", True))
    for variant, params, _ in _variants(entry):
        works = baselines.periodic(entry["method"], params)
        periods = {w.every for w in works.values() if w.every > 1}
        rounds = timing.round_bounds(warmup, total, execution.get("rounds", 5), 2 if interleaved else 1,
                                     next(iter(periods)) if len(periods) == 1 else None)
        plans = timing.plan_periodic(rounds, total, interleaved,
                                     {n: (w.every, w.phase, w.forceable) for n, w in works.items()})
        for work, plan in plans.items():
            if plan.how == timing.NOT_TIMED:
                raise ConfigError(
                    f"config key {key}: method {name!r} ({entry['method']}, variant {variant}) does its "
                    f"{work!r} every {plan.every} steps; {total} steps with {warmup} of warm-up "
                    f"({execution.get('rounds', 5)} rounds) give it no counted step and it cannot be made "
                    "to run it off its schedule, so the step times would leave it out: give at least "
                    f"{2 * (plan.every + 1) + warmup} steps (max_steps_per_epoch x epochs), or change the "
                    "period")


def _matched_ref(config: dict[str, Any], section: dict[str, Any], ref: dict[str, Any], where: str,
                 key: str) -> tuple[dict[str, Any], list[float]]:
    """(the reference to the configuration a ``match`` entry matches, the targets matched) in one block;
    ConfigError naming ``where`` when it is no quality block, the matched configuration is not in it, or a
    target is not one of its targets."""
    wanted = config["methods"][ref["name"]]["match"]
    if key != ".quality":
        raise ConfigError(f"config key {where}: {ref['name']!r} matches {wanted!r}'s reached size: it runs "
                          "in quality blocks only (the cell it matches must finish first)")
    found = [r for r in _method_refs(section) if r["name"] == wanted]
    if not found:
        raise ConfigError(f"config key {where}: {ref['name']!r} matches {wanted!r}, which this block does "
                          "not run; add it to its methods")
    theirs = [t for t in found[0].get("targets", section["targets"]) if t is not None]
    targets = [t for t in ref.get("targets", theirs) if t is not None]
    if not targets or set(targets) - set(theirs):
        raise ConfigError(f"config key {where}: targets {targets} must be among {wanted!r}'s targets here "
                          f"{theirs} (none given: all of them)")
    return found[0], targets


def _checked(check, name: str, params: dict[str, Any], key: str, missing: list[str] | None = None
             ) -> dict[str, Any]:
    try:
        checked = check(name, dict(params))
    except (ValueError, TypeError, KeyError, FileNotFoundError) as err:
        raise ConfigError(f"config key {key}: {err}") from err
    _check_paths(checked, key, missing)
    return checked


def _check_paths(params: dict[str, Any], key: str, missing: list[str] | None = None) -> None:
    """A data path given in the params must exist (keys ending in ``path`` or ``dir``, except cache
    folders the workload creates itself); with a ``missing`` list, one that does not is noted there."""
    for name, value in params.items():
        if (isinstance(value, str) and value and re.search(r"(path|dir|file)$", name)
                and "cache" not in name and not os.path.exists(value)):
            error = f"config key {key}.{name}: path {value!r} does not exist"
            if missing is None:
                raise ConfigError(error)
            if error not in missing:
                missing.append(error)


def _variants(entry: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(variant, params, sweep point) of a method configuration, one per point of its sweep."""
    sweep = entry["sweep"]
    if not sweep:
        return [(entry["variant"], dict(entry["params"]), {})]
    keys = sorted(sweep)
    out = []
    for values in itertools.product(*(sweep[k] for k in keys)):
        point = dict(zip(keys, values))
        suffix = "-".join(f"{k}{v}" for k, v in point.items())
        out.append((f"{entry['variant']}-{suffix}", {**entry["params"], **point}, point))
    return out


def expand_grid(config: dict[str, Any]) -> tuple[dict[str, Spec], dict[str, dict[str, Any]]]:
    """(run_id -> spec, run_id -> sweep point) for workload x section (timing, quality) x method/variant
    (x sweep point) x batch size x target x seed x cuda_graph x compile x matmul_precision; cells outside
    any sweep have no sweep point. Every spec is made by :func:`harness.spec.make`, as ``comera-bench run``
    makes one from the same options (same run_id and hashes); quality cells have purpose "quality" and a
    run_id ending in ``_quality``."""
    execution = config["execution"]
    if execution["threads"] == "auto":  # the pipeline decides it first: harness.running.threads.resolve
        raise ConfigError("config key execution.threads: 'auto' is resolved to a number before the grid is "
                          "expanded")
    grid: dict[str, Spec] = {}
    sweeps: dict[str, dict[str, Any]] = {}
    checks = specs.registry_checks()
    for wname, workload in config["workloads"].items():
        for purpose, key, section, workload_params, suffix in sections(workload):
            for ref in _method_refs(section):
                graphs = ref.get("cuda_graph", section.get("cuda_graph", workload.get(
                    "cuda_graph", execution["cuda_graph"])))
                entry = config["methods"][ref["name"]]
                targets = ref.get("targets", section["targets"]) if entry["uses_target"] else [None]
                matched = None
                if entry.get("match"):  # one cell per target of the cells it matches, named after them
                    matched, targets = _matched_ref(config, section, ref, f"workloads.{wname}{key}.methods",
                                                    key)
                batches = ref.get("batch_sizes", section["batch_sizes"])
                compiles = (execution["compile"] if isinstance(execution["compile"], list)
                            else [execution["compile"]])
                precisions = ref.get("matmul_precision", execution["matmul_precision"])
                seeds = section.get("seeds", config["seeds"])
                for ((variant, params, point), batch, target, seed, graph, compiled,
                     precision) in itertools.product(_variants(entry), batches, targets, seeds, graphs,
                                                     compiles, precisions):
                    timed = purpose == "timing"
                    grouped = timed and execution["interleave"]
                    group = slug(f"{wname}{suffix}_b{batch}_s{seed}") if grouped else None
                    raw = {
                        "purpose": purpose, "workload": module_of(wname, workload),
                        "workload_params": dict(workload_params), "method": entry["method"],
                        "variant": variant, "method_params": params, "batch_size": batch,
                        "target_ratio": target, "seed": seed,
                        "budget": dict(section["budget"]),
                        "execution": {"device": execution["device"], "num_threads": execution["threads"],
                                      "cuda_graph": graph, "compile": compiled, "matmul_precision": precision,
                                      "rounds": execution["rounds"], "timing_group": group},
                    }
                    if matched is not None:
                        source = config["methods"][entry["match"]]
                        raw["method_params"] = {**params, specs.MATCH_PARAM: specs.run_id(
                            {**raw, "method": source["method"], "variant": source["variant"]}, suffix, wname)}
                        raw["target_ratio"] = None
                    rid = raw["run_id"] = specs.run_id(raw, suffix, wname)
                    where = f"config key workloads.{wname}{key}"
                    if len(rid) > specs.MAX_RUN_ID:  # it names files: keep well below 255 bytes
                        raise ConfigError(f"{where}: cell name {rid!r} is {len(rid)} characters (at most "
                                          f"{specs.MAX_RUN_ID}); shorten the variant or the sweep values")
                    try:
                        spec = specs.make(raw, checks)
                    except ValueError as err:
                        raise ConfigError(f"{where}: cell {rid}: {err}") from err
                    if spec.run_id in grid:
                        raise ConfigError(f"config key workloads.{wname}{key}.methods: cell {spec.run_id} "
                                          "appears twice (same method/variant/batch/target/seed)")
                    grid[spec.run_id] = spec
                    if point:
                        sweeps[spec.run_id] = point
    for rid, spec in grid.items():
        source = spec.method_params.get(specs.MATCH_PARAM)
        if source is not None and source not in grid:
            raise ConfigError(f"config key methods.*.match: cell {rid} matches cell {source}, which the grid "
                              "does not have (it needs the same batch size, seed and execution settings)")
    return _alone_untimed_in_groups(grid), sweeps


def _alone_untimed_in_groups(grid: dict[str, Spec]) -> dict[str, Spec]:
    """A timing cell alone in its timing group is timed alone: its spec names no group (else its row would
    say it missed its group's rounds)."""
    sizes: dict[str, int] = {}
    for spec in grid.values():
        group = spec.execution.timing_group
        if group:
            sizes[group] = sizes.get(group, 0) + 1
    alone = {rid for rid, spec in grid.items() if sizes.get(spec.execution.timing_group, 0) == 1}
    return {rid: spec.with_execution(timing_group=None) if rid in alone else spec
            for rid, spec in grid.items()}


def timing_groups(grid: dict[str, Spec]) -> dict[str, list[str]]:
    """timing group -> its run_ids (in grid order), for the groups of at least two cells; a timing
    cell alone in its group is timed alone."""
    groups: dict[str, list[str]] = {}
    for rid, spec in grid.items():
        group = spec.execution.timing_group
        if group:
            groups.setdefault(group, []).append(rid)
    return {g: ids for g, ids in groups.items() if len(ids) > 1}


def finished(grid: dict[str, Spec], cells_dir: str | Path) -> dict[str, Spec]:
    """The cells of ``grid`` whose spec, runs and curves files are all in ``cells_dir`` (the cells a
    stopped pipeline finished: a cell's files are written atomically, and a job stopped before its end
    leaves none), in grid order."""
    return {rid: spec for rid, spec in grid.items()
            if all((Path(cells_dir) / f"{rid}.{kind}").is_file()
                   for kind in ("spec.json", "runs.parquet", "curves.parquet"))}


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.configs.grid --out grid.json --sweeps JSON SPEC.json...``: the grid file the
    figures read (every cell's spec, and the sweep point of the cells that belong to a sweep)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m harness.configs.grid",
                                 description=main.__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sweeps", default="{}", help="JSON: run_id -> sweep point")
    ap.add_argument("specs", nargs="*")
    args = ap.parse_args(argv)
    cells = {}
    for path in args.specs:
        spec = json.loads(Path(path).read_text())
        cells[spec["run_id"]] = spec
    grid = {"cells": cells, "sweeps": json.loads(args.sweeps)}
    Path(args.out).write_text(json.dumps(grid, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
