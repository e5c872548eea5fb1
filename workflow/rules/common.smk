# Config validation (config files re-read for duplicated keys, the COMERA_BENCH_DEVICE variable, numbers
# in exponent notation made numbers, JSON schema with defaults, then the methods' and workloads' own
# checks) and the grid, all before any job is scheduled.
import json
import os
import shlex
import sys
import time

from snakemake.exceptions import WorkflowError

REPO = workflow.basedir  # the checkout: its Snakefile is at the root
sys.path.insert(0, REPO)  # the harness package of this checkout, even if not installed
from harness import running as _running
from harness.configs import grid as _grid
from harness import entry as _entry
from harness.results import lock as _lock
from harness.results import mtimes as _mtimes
from harness.data import cache as _cache
from harness.core import stops as _stops
from harness.configs import yamlnum as _yamlnum


def _validate_config():
    """The checks that need no torch come first, so a bad value fails fast."""
    try:
        # Snakemake's own loader lets a repeated key win silently and reads YAML 1.1: the files again
        documents = [_grid.load_config_file(path) for path in workflow.configfiles]
        _grid.env_device_label()
        # lr: 1e-3 is a number, a quoted "1e5" stays text (as the files say, read as YAML 1.2)
        _yamlnum.numbers_as_in(config, _yamlnum.merged(documents))
        # --config execution='{threads: 1}': a number, not the string Snakemake's base loader makes of it
        _yamlnum.typed_config_args(config, workflow.config_settings.config_args)
        error = _grid.schema_error(config)  # workflow/schemas/config.schema.yaml + harness/spec.py's keys
        if error:
            raise _grid.ConfigError(error)
        _grid.fill_defaults(config)
        # a dry run plans without the data (config/paper.yaml before fetching it): a note per missing path
        missing = [] if workflow.dryrun or getattr(workflow.output_settings, "dryrun", False) else None
        _grid.check_config(config, missing)
    except _grid.ConfigError as err:
        raise WorkflowError(f"invalid config: {err}")
    for note in missing or ():
        logger.warning(f"comera-bench: note: {note} (a dry run plans without it; a run needs it)")
    try:
        _running.check_environment()  # every cell reads them: a bad value fails here, not in each cell
    except ValueError as err:
        raise WorkflowError(f"invalid environment: {err}")


_validate_config()

# The label is derived once (by the first Snakemake process) and inherited by every job's own
# Snakemake process through the environment, so a cluster job on another node writes the same paths.
DEVICE_FROM_ENV = _grid.env_device_label()  # the user's, before this process sets it for its jobs
DEVICE = config["device_name"] or DEVICE_FROM_ENV or _grid.device_label(config)
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
# threads: auto -> a number, decided once by the first Snakemake process (harness/running/threads.py)
from harness.core import timing as _timing
from harness.running import threads as _threads

try:  # a bad COMERA_BENCH_THREADS (harness/settings.py) is named, not a traceback
    config["execution"]["threads"], THREADS_WHY = _threads.resolve(config["execution"]["threads"], CELLS,
                                                                   _timing.load_avg_1m())
except ValueError as _err:
    raise WorkflowError(f"invalid environment: {_err}")
if THREADS_WHY:
    os.environ[_threads.THREADS_ENV] = str(config["execution"]["threads"])
# Jobs that measure time (the timing groups, the micro-benchmarks, `bench`) claim every core Snakemake was
# given (`threads:` above --cores is cut to --cores), so no other job runs beside them; a quality cell takes
# its torch threads, so `--cores N` runs N / threads of them side by side (docs/pipeline.md, "Jobs side by
# side"). Under a cluster executor (no local cores) every job has its own allocation of the execution's
# threads.
CORES = workflow.resource_settings.cores if workflow.local_exec else None
TIMING_THREADS = CORES or config["execution"]["threads"]


def threads_env():
    """`env` arguments setting the thread variables Snakemake derives from a job's `threads:`
    (OMP_NUM_THREADS and the like) to the execution's threads: a job that claims every core to be alone
    runs with the threads it would have had otherwise, so what it measures does not change."""
    count = config["execution"]["threads"]
    names = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
    return [f"{name}={count}" for name in names]


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
# a size-matched cell (method param match_run) runs after the cell it matches: that cell's runs file is an input
from harness.spec import MATCH_PARAM as _MATCH

MATCHED = {rid: spec.method_params[_MATCH] for rid, spec in GRID.items() if spec.method_params.get(_MATCH)}
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

# Set by hand to something else, they would fail every cell's job after its row was written (check_config
# checks the other variables every cell reads).
try:
    _eta.pipeline_env()
except ValueError as _err:
    raise WorkflowError(f"invalid environment: {_err}")
# Jobs call `comera-bench` and `python`. Started as `.venv/bin/snakemake` with the venv not activated,
# PATH has neither (every job would fail, "comera-bench: not found"): the venv's folder goes first then.
_entry.command_on_path()


def spec_json(run_id):
    """A cell's spec as canonical JSON (the rule's params: a changed spec re-runs only its cell)."""
    return json.dumps(GRID[run_id].to_dict(), sort_keys=True)


def gpu_wrapper():
    """Locally, a GPU job takes a free GPU by file lock; under SLURM it keeps CUDA_VISIBLE_DEVICES."""
    if not ON_GPU:
        return ""
    count = config["execution"]["gpus"]
    return (f"python -m harness.running.gpus --lock-dir {shlex.quote(f'{RESULTS}/.gpu-locks')}"
            + (f" --count {count}" if count else "") + " -- ")


def run_options():
    """This run's options as a later command must repeat them (the report, the re-time hint, the busy
    warning's command): --directory, --configfile (relative to the folder the command was typed in
    where that is this folder, else absolute), --config as given, COMERA_BENCH_DEVICE."""
    directory = os.getcwd() if workflow.overwrite_workdir else None  # --directory: then every path absolute
    files = [os.path.abspath(path) for path in workflow.overwrite_configfiles or ()]
    if not directory:
        files = [os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path for path in files]
    return {"configfiles": files, "config_args": list(workflow.config_settings.config_args or ()),
            "directory": directory, "env": {_grid.DEVICE_ENV: DEVICE_FROM_ENV} if DEVICE_FROM_ENV else {}}


def command_line(arguments, config_args=()):
    """``snakemake <arguments>`` with this run's options and then ``config_args`` (one --config: a second
    one would replace the first), as a shell line."""
    from harness.reports import noisy as _noisy

    options = run_options()
    env = options.pop("env")
    options["config_args"] += list(config_args)
    return _noisy.as_typed(_noisy.snakemake_command(arguments, **options), env)


# The options of the last pipeline that finished in this folder (.snakemake/comera-bench-last-run.json), so
# that a report asked for without them (the default config's figures absent) says what to type. Explicit
# options always win; the default run stays the default.
LAST_RUN = ".snakemake/comera-bench-last-run.json"


def _report_without_options():
    """`snakemake --report ...` without --configfile/--config whose figures do not exist: a WorkflowError
    naming the command of the last run here, instead of Snakemake's "marked for report but does not exist"."""
    asked = any(arg == "--report" or arg.startswith("--report=") for arg in sys.argv[1:])
    if not asked or workflow.overwrite_configfiles or workflow.config_settings.config_args:
        return
    if os.path.exists(f"{FIGURES}/overview.html") or not os.path.exists(LAST_RUN):
        return
    try:
        last = json.loads(open(LAST_RUN).read())
    except (OSError, ValueError):
        return
    raise WorkflowError(f"no report of the default config here ({FIGURES}/overview.html does not exist); the "
                        f"last pipeline in this folder ran with other options. Its report: {last['report']}")


_report_without_options()


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
    # A folder copied from a machine whose clock is ahead: its files set to just before this run's start
    # (harness/results/mtimes.py), else Snakemake deletes every new output older than its copied input.
    _future = _mtimes.reset_future(RESULTS, to=_eta.pipeline_env()[0] - 1.0)
    if _future:
        logger.warning(f"comera-bench: warning: {_mtimes.warning(RESULTS, _future)}")

    _count = config["execution"]["threads"]
    if THREADS_WHY and not ON_GPU:
        logger.warning(f"comera-bench: torch threads per cell: {THREADS_WHY}")
    # the run's own --cores: timing jobs still run alone, quality cells of one thread side by side
    _one_thread = command_line(["--cores", str(CORES or 1), "figures"], ["execution={threads: 1}"])
    _busy = _timing.busy_warning(_count, command=_one_thread if _count > 1 and not ON_GPU else "")
    if _busy:
        logger.warning(f"comera-bench: warning: {_busy}")


onsuccess:
    _lock.release(RESULTS)
    if os.path.exists(f"{MERGED}/runs.parquet"):
        from harness.reports import noisy as _noisy

        _options = run_options()
        _cells = os.path.abspath(CELLS) if _options["directory"] else CELLS  # typed where the run was started
        _summary = _noisy.summary([f"{MERGED}/runs.parquet"], _cells, **_options)
        if _summary:
            logger.warning(f"comera-bench: {_summary}")
        _report = command_line(["--report", "report.html", "figures"])  # with the run's options, if any
        logger.warning(f"comera-bench: The HTML report of this run: {_report}")
        try:
            os.makedirs(os.path.dirname(LAST_RUN), exist_ok=True)
            with open(LAST_RUN, "w") as _fh:
                json.dump({"report": _report, "figures_dir": FIGURES, "results_dir": RESULTS}, _fh)
        except OSError:
            pass


onerror:
    _lock.release(RESULTS)


wildcard_constraints:
    run_id="[A-Za-z0-9._-]+",
    name="[A-Za-z0-9._-]+",
