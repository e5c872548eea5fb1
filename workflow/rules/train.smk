# One job per grid cell: write its spec (params = the spec, so a changed cell re-runs alone), then run
# it in its own process. The runner writes both files atomically, also for a failed cell (status
# oom | diverged | error | timeout); a killed runner leaves neither, so the job fails and re-runs.
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
        "{params.wrapper}comera-bench run --spec {input.spec:q} --runs-out {output.runs:q}"
        " --curves-out {output.curves:q} > {log:q} 2>&1"
        " || (test -s {output.runs:q} && test -s {output.curves:q})"


rule runs:
    input:
        RUN_FILES,
        CURVE_FILES,
