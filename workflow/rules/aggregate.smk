# Per-cell files -> results/<device>/{runs,curves,microbench}.parquet (+ grid.json: every cell's spec).
# A truncated or foreign per-cell file fails the merge with its path in the message; so does a runs or
# curves file whose rows are not its grid cell's, run from the grid's spec (its cell and execution hashes;
# e.g. copied from another config), and a runs file of a timing group from another host or device than the
# group's others.
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
    run:  # not a shell command: it would name every cell's files, one log line of thousands of characters
        merge_cells(input, output, params, log[0])


def merge_cells(input, output, params, log):
    """The grid file, then the runs and curves tables (``comera-bench merge``), stopping at the first
    failure; their messages go to ``log``, and a failure raises naming it with its last lines."""
    import contextlib
    from harness import results as _results

    steps = [(_grid.main, ["--out", output.grid, "--sweeps", params.sweeps, *input.specs]),
             (_results.cli_merge, ["--kind", "runs", *params.empty, "--grid", output.grid, "--out",
                                   output.runs, *input.runs]),
             (_results.cli_merge, ["--kind", "curves", *params.empty, "--grid", output.grid, "--out",
                                   output.curves, *input.curves])]
    with open(log, "w") as fh, contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
        failed = next((code for step, argv in steps if (code := step(argv))), 0)
    if failed:
        tail = "".join(open(log).readlines()[-5:])
        raise WorkflowError(f"merge_runs failed (exit status {failed}); {log}:\n{tail}")


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
