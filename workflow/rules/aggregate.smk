# Per-cell files -> results/<device>/{runs,curves,microbench}.parquet (+ grid.json: every cell's spec).
# A truncated or foreign per-cell file fails the merge with its path in the message; so does a runs file
# whose row is not its grid cell's, run from the grid's spec (its cell and execution hashes; e.g. copied
# from another config).
localrules: merge_runs, merge_microbench


rule merge_runs:
    input:
        runs=RUN_FILES,
        curves=CURVE_FILES,
        specs=SPEC_FILES,
    output:
        runs=f"{MERGED}/runs.parquet",
        curves=f"{MERGED}/curves.parquet",
        grid=f"{MERGED}/grid.json",
    log:
        f"{MERGED}/logs/merge_runs.log",
    params:
        sweeps=json.dumps(SWEEPS, sort_keys=True),
        empty=["--allow-empty"] if config["only_finished"] else [],  # a run stopped before any cell ended
    shell:
        "(python -m harness.configs.grid --out {output.grid:q} --sweeps {params.sweeps:q} {input.specs:q}"
        " && comera-bench merge --kind runs {params.empty:q} --grid {output.grid:q} --out {output.runs:q} {input.runs:q}"
        " && comera-bench merge --kind curves {params.empty:q} --out {output.curves:q} {input.curves:q}) > {log:q} 2>&1"


rule merge_microbench:
    input:
        MICROBENCH_FILES,
    output:
        f"{MERGED}/microbench.parquet",
    log:
        f"{MERGED}/logs/merge_microbench.log",
    shell:  # a grid without micro-benchmarks gets an empty table
        "comera-bench merge --kind microbench --allow-empty --out {output:q} {input:q} > {log:q} 2>&1"
