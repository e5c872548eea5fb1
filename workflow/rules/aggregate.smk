# Per-cell files -> results/<device>/{runs,curves,microbench}.parquet (+ grid.json: every cell's spec).
# A truncated or foreign per-cell file fails the merge with its path in the message.
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
    params:
        sweeps=json.dumps(SWEEPS, sort_keys=True),
    shell:
        "comera-bench merge --kind runs --out {output.runs:q} {input.runs:q}"
        " && comera-bench merge --kind curves --out {output.curves:q} {input.curves:q}"
        " && python -m harness.grid --out {output.grid:q} --sweeps {params.sweeps:q} {input.specs:q}"


rule merge_microbench:
    input:
        MICROBENCH_FILES,
    output:
        f"{MERGED}/microbench.parquet",
    shell:
        "comera-bench merge --kind microbench --out {output:q} {input:q}"
