# `snakemake bench`: the performance targets of `comera-bench bench` on this machine, judged against the
# goals of harness/perf/goals.yaml -> results/<device>/bench.{parquet,md} (docs/performance.md), and the
# figure bench.{png,pdf} next to them (not declared: it is drawn after the table, and a figure that cannot
# be drawn must not make Snakemake delete the measured table). Not part of the default target: it wants
# the machine to itself for some minutes (its ratios are timings).


rule bench:
    input:
        goals=f"{REPO}/harness/perf/goals.yaml",
    output:
        parquet=f"{MERGED}/bench.parquet",
        md=f"{MERGED}/bench.md",
    log:
        f"{MERGED}/logs/bench.log",
    threads: TIMING_THREADS  # every core: no other job beside a timing (common.smk)
    resources:
        **({"gpu": 1} if ON_GPU else {}),
    params:
        wrapper=gpu_wrapper(),
        device="cuda" if ON_GPU else "cpu",
        threads=config["execution"]["threads"],
        threads_env=threads_env(),
    shell:
        "env {params.threads_env:q} {params.wrapper}comera-bench bench --device {params.device:q}"
        " --threads {params.threads:q}"
        " --goals {input.goals:q} --out {output.parquet:q} > {log:q} 2>&1"
