# Config validation (config files re-read for duplicated keys, the COMERA_BENCH_DEVICE variable, numbers
# in exponent notation made numbers, JSON schema with defaults, then the methods' and workloads' own
# checks) and the grid, all before any job is scheduled.
import json
import os
import shlex
import sys
import time

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

REPO = workflow.basedir  # the checkout: its Snakefile is at the root
sys.path.insert(0, REPO)  # the harness package of this checkout, even if not installed
from harness.configs import grid as _grid
from harness.results import lock as _lock
from harness.data import cache as _cache
from harness.core import stops as _stops
from harness.configs import yamlnum as _yamlnum


def _validate_config():
    """The checks that need no torch come first, so a bad value fails fast."""
    schema = f"{REPO}/workflow/schemas/config.schema.yaml"
    try:
        # Snakemake's own loader lets a repeated key win silently and reads YAML 1.1: the files again
        documents = [_grid.load_config_file(path) for path in workflow.configfiles]
        _grid.env_device_label()
        # lr: 1e-3 is a number, a quoted "1e5" stays text (as the files say, read as YAML 1.2)
        _yamlnum.numbers_as_in(config, _yamlnum.merged(documents))
        error = _grid.schema_error(config, schema)
        if error:
            raise _grid.ConfigError(error)
        validate(config, schema)  # fills the defaults
        _grid.check_config(config)
    except _grid.ConfigError as err:
        raise WorkflowError(f"invalid config: {err}")


_validate_config()

# The label is derived once (by the first Snakemake process) and inherited by every job's own
# Snakemake process through the environment, so a cluster job on another node writes the same paths.
DEVICE = config["device_name"] or _grid.env_device_label() or _grid.device_label(config)
os.environ[_grid.DEVICE_ENV] = DEVICE
# A job's own process (exec'd by its shell: the train and timing rules) ends when this Snakemake
# process dies, even by SIGKILL (harness/core/stops.py), so no cell runs on and writes a row later.
os.environ[_stops.PARENT_ENV] = str(os.getpid())
RESULTS = config["results_dir"]
# Derived data (tokenizers, tokenized tensors) is cached in the results folder, not the cwd: every job inherits it
os.environ.setdefault(_cache.CACHE_ENV, f"{RESULTS}/cache")
FIGURES = config["figures_dir"]
CELLS = f"{RESULTS}/runs/{DEVICE}"
MERGED = f"{RESULTS}/{DEVICE}"
GRID, SWEEPS = _grid.expand_grid(config)
MICROBENCH = config["microbench"]["specs"]
# only_finished (a stopped run's tables): the grid is the cells whose files exist, and no rule runs a
# cell (no timing group, no solo cell), so Snakemake takes those files as they are.
if config["only_finished"]:
    GRID = _grid.finished(GRID, CELLS)
    SWEEPS = {rid: point for rid, point in SWEEPS.items() if rid in GRID}
    MICROBENCH = {name: spec for name, spec in MICROBENCH.items()
                  if os.path.isfile(f"{CELLS}/microbench/{name}.microbench.parquet")}
GROUPS = _grid.timing_groups(GRID) if not config["only_finished"] else {}  # group -> cells, timed in rounds
GROUPED = {rid for ids in GROUPS.values() for rid in ids}
SOLO = [rid for rid in GRID if rid not in GROUPED] if not config["only_finished"] else []  # timed alone
SPEC_FILES = expand(f"{CELLS}/{{run_id}}.spec.json", run_id=GRID)
RUN_FILES = expand(f"{CELLS}/{{run_id}}.runs.parquet", run_id=GRID)
CURVE_FILES = expand(f"{CELLS}/{{run_id}}.curves.parquet", run_id=GRID)
MICROBENCH_FILES = expand(f"{CELLS}/microbench/{{name}}.microbench.parquet", name=MICROBENCH)
ON_GPU = _grid.uses_gpu(config)
# Each finished cell prints "cells N of M done ... about T left" (harness/running/eta.py): the first
# Snakemake process records when the run started and the grid's size; every job inherits both.
from harness.running import eta as _eta

os.environ.setdefault(_eta.STARTED_ENV, str(time.time()))
os.environ.setdefault(_eta.CELLS_ENV, str(len(GRID)))


def spec_json(run_id):
    """A cell's spec as canonical JSON (the rule's params: a changed spec re-runs only its cell)."""
    return json.dumps(GRID[run_id], sort_keys=True)


def gpu_wrapper():
    """Locally, a GPU job takes a free GPU by file lock; under SLURM it keeps CUDA_VISIBLE_DEVICES."""
    if not ON_GPU:
        return ""
    count = config["execution"]["gpus"]
    return (f"python -m harness.running.gpus --lock-dir {shlex.quote(f'{RESULTS}/.gpu-locks')}"
            + (f" --count {count}" if count else "") + " -- ")


# One pipeline at a time per results folder (harness/results/lock.py): taken when the first job is about to
# start (never for dry runs, never in the per-job Snakemake processes), released at the end. A stop
# (SIGTERM, SIGINT, SIGHUP) reaches every job's processes at once, so the pipeline ends within seconds
# (harness/core/stops.py; docs/pipeline.md, "Stopping, resuming, unlocking").
onstart:
    try:
        _lock.acquire(RESULTS)
    except _lock.LockError as err:
        raise WorkflowError(str(err))
    _stops.forward_stops()
    from harness.core import timing as _timing

    _busy = _timing.busy_warning(config["execution"]["threads"])
    if _busy:
        logger.warning(f"comera-bench: warning: {_busy}")


onsuccess:
    _lock.release(RESULTS)
    if os.path.exists(f"{MERGED}/runs.parquet"):
        from harness.reports import noisy as _noisy

        _settings = {"results_dir": RESULTS, "figures_dir": FIGURES}
        if config["device_name"]:
            _settings["device_name"] = DEVICE
        _configfiles = [os.path.normpath(path) for path in workflow.configfiles]
        _summary = _noisy.summary([f"{MERGED}/runs.parquet"], CELLS, settings=_settings, configfiles=_configfiles)
        if _summary:
            logger.warning(f"comera-bench: {_summary}")
        if workflow.overwrite_configfiles or _settings != {"results_dir": "results", "figures_dir": "figures"}:
            logger.warning(f"comera-bench: {_noisy.report_hint(configfiles=_configfiles, settings=_settings)}")


onerror:
    _lock.release(RESULTS)


wildcard_constraints:
    run_id="[A-Za-z0-9._-]+",
    name="[A-Za-z0-9._-]+",
