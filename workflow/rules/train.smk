# One job per grid cell: write its spec (params = the spec, so a changed cell re-runs alone), then run
# it in its own process. The runner writes both files atomically, also for a failed cell (status
# oom | diverged | error | timeout); a runner killed by a signal (the OOM killer's SIGKILL) gets its row
# from its supervising parent (`--isolate`, harness/running/supervise.py). Either way the job succeeds, the
# cell is done and the tables go on; to run a failed cell again, delete its files (docs/pipeline.md). A
# size-matched cell (method param match_run) reads the runs file of the cell it matches: an input, so it runs
# after it, and again when that cell ran again.
localrules: cell_spec, runs


rule cell_spec:
    output:
        f"{CELLS}/{{run_id}}.spec.json",
    log:
        f"{CELLS}/logs/{{run_id}}.spec.log",
    params:
        spec=lambda w: spec_json(w.run_id),
    shell:
        "printf '%s\\n' {params.spec:q} > {output:q} 2> {log:q}"


import re as _re

rule train:
    wildcard_constraints:
        run_id="|".join(map(_re.escape, SOLO)) or "(?!)",
    input:
        spec=f"{CELLS}/{{run_id}}.spec.json",
        matched=lambda w: [f"{CELLS}/{MATCHED[w.run_id]}.runs.parquet"] if w.run_id in MATCHED else [],
    output:
        runs=f"{CELLS}/{{run_id}}.runs.parquet",
        curves=f"{CELLS}/{{run_id}}.curves.parquet",
    log:
        f"{CELLS}/logs/{{run_id}}.log",
    threads: config["execution"]["threads"]
    resources:
        **({"gpu": 1} if ON_GPU else {}),
    params:
        wrapper=gpu_wrapper(),
    shell:
        "exec {params.wrapper}comera-bench run --isolate --spec {input.spec:q} --runs-out {output.runs:q}"
        " --curves-out {output.curves:q} --log {log:q}"


rule runs:
    input:
        RUN_FILES,
        CURVE_FILES,
    message:
        f"runs: every cell of the grid ({len(GRID)}) in {CELLS}"


# The timing cells of one group (same workload, sweep point, batch size and seed; harness/running/group.py)
# run as one job: every cell in its own process, taking turns round by round, so that a change of the
# machine's load hits every method alike; the job claims every core (TIMING_THREADS), so no other job runs
# beside it. A changed or missing cell re-runs its whole group: ratios come only from cells timed together.
for _group, _ids in GROUPS.items():

    rule:
        name:
            f"time_{_group}"
        input:
            [f"{CELLS}/{rid}.spec.json" for rid in _ids],
        output:
            [f"{CELLS}/{rid}.{kind}.parquet" for rid in _ids for kind in ("runs", "curves")],
        log:
            [f"{CELLS}/logs/{rid}.log" for rid in _ids],
        threads: TIMING_THREADS
        resources:
            **({"gpu": 1} if ON_GPU else {}),
        params:
            wrapper=gpu_wrapper(),
            threads_env=threads_env(),
            cells=[arg for rid in _ids for arg in ("--cell", f"{CELLS}/{rid}.spec.json",
                   f"{CELLS}/{rid}.runs.parquet", f"{CELLS}/{rid}.curves.parquet", f"{CELLS}/logs/{rid}.log")],
            rounds=config["execution"]["rounds"],
        shell:
            "exec env {params.threads_env:q} {params.wrapper}python -m harness.running.group"
            " --rounds {params.rounds:q} {params.cells:q}"
