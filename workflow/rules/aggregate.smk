# Per-cell files -> results/<device>/{runs,curves,microbench}.parquet (+ grid.json: every cell's spec).
# A truncated or foreign per-cell file fails the merge with its path in the message; so does a runs file
# without exactly one row, a runs or curves file whose rows are not its grid cell's, run from the grid's
# spec (its cell and execution hashes; e.g. copied from another config), and a runs file of a timing group
# from another host or device than the group's others.
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
    message:
        f"merge_runs: the files of {len(GRID)} cells in {CELLS} -> {MERGED}/runs.parquet, curves.parquet, "
        "grid.json"
    log:
        f"{MERGED}/logs/merge_runs.log",
    params:
        sweeps=json.dumps(SWEEPS, sort_keys=True),
        empty=["--allow-empty"] if config["only_finished"] else [],  # a run stopped before any cell ended
        cells=lambda w, input: os.path.dirname(input.specs[0]) if input.specs else CELLS,
        run_ids=list(GRID),  # each cell named once; the command finds its three files in CELLS
    shell:  # a shell command, not a `run:` block, which Snakemake runs in a second Snakemake process
        "python -m harness.configs.merge_cells --cells {params.cells:q} --sweeps {params.sweeps:q} {params.empty}"
        " --grid-out {output.grid:q} --runs-out {output.runs:q} --curves-out {output.curves:q}"
        " {params.run_ids:q} > {log:q} 2>&1 || {{ status=$?; tail -n 5 {log:q} >&2; exit $status; }}"


rule merge_microbench:
    input:
        MICROBENCH_FILES,
    output:
        f"{MERGED}/microbench.parquet",
    message:
        f"merge_microbench: {len(MICROBENCH)} micro-benchmark file(s) -> {MERGED}/microbench.parquet"
    log:
        f"{MERGED}/logs/merge_microbench.log",
    shell:  # a grid without micro-benchmarks gets an empty table
        "comera-bench merge --kind microbench --allow-empty --out {output:q} {input:q} > {log:q} 2>&1"
