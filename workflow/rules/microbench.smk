# Micro-benchmarks (Fig 5 TTM lookups, TT layer timings): one job per named spec in config microbench.specs.
localrules: microbench_spec, microbench


rule microbench_spec:
    output:
        f"{CELLS}/microbench/{{name}}.spec.json",
    log:
        f"{CELLS}/logs/microbench_{{name}}.spec.log",
    params:
        spec=lambda w: json.dumps(MICROBENCH[w.name], sort_keys=True),
    shell:
        "printf '%s\\n' {params.spec:q} > {output:q} 2> {log:q}"


rule microbench_cell:
    input:
        spec=f"{CELLS}/microbench/{{name}}.spec.json",
    output:
        f"{CELLS}/microbench/{{name}}.microbench.parquet",
    log:
        f"{CELLS}/logs/microbench_{{name}}.log",
    threads: TIMING_THREADS  # every core: no other job beside a timing (common.smk)
    resources:
        **({"gpu": 1} if ON_GPU else {}),
    params:
        wrapper=gpu_wrapper(),
        threads_env=threads_env(),
    shell:
        "env {params.threads_env:q} {params.wrapper}comera-bench microbench --spec {input.spec:q}"
        " --out {output:q} > {log:q} 2>&1"


rule microbench:
    input:
        MICROBENCH_FILES,
    message:
        f"microbench: {len(MICROBENCH)} micro-benchmark spec(s)"
