# One job per grid cell: write its spec (params = the spec, so a changed cell re-runs alone), then run
# it in its own process. The runner writes both files atomically, also for a failed cell (status
# oom | diverged | error | timeout); a runner killed by a signal (the OOM killer's SIGKILL) gets its row
# from its supervising parent (`--isolate`, harness/supervise.py). Either way the job succeeds, the
# cell is done and the tables go on; to run a failed cell again, delete its files (README "Pipeline").
localrules: cell_spec, runs


rule cell_spec:
    output:
        f"{CELLS}/{{run_id}}.spec.json",
    params:
        spec=lambda w: spec_json(w.run_id),
    shell:
        "printf '%s\\n' {params.spec:q} > {output:q}"


rule train:
    input:
        spec=f"{CELLS}/{{run_id}}.spec.json",
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
        "{params.wrapper}comera-bench run --isolate --spec {input.spec:q} --runs-out {output.runs:q}"
        " --curves-out {output.curves:q} --log {log:q}"


rule runs:
    input:
        RUN_FILES,
        CURVE_FILES,
