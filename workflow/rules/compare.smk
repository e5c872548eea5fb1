# The same grid from several result folders (this machine + compare.dirs) side by side, with the
# paper's RTX 3090 / RTX 4090 numbers as two more devices (harness/reports/reference/paper.yaml).
localrules: compare, report

COMPARE_DIRS = [MERGED] + [d for d in config["compare"]["dirs"] if d.rstrip("/") != MERGED]
COMPARE_OUT = f"{FIGURES}/compare"


rule compare:
    input:
        [f"{d}/runs.parquet" for d in COMPARE_DIRS],
    output:
        md=f"{COMPARE_OUT}/compare.md",
        html=report(f"{COMPARE_OUT}/compare.html", caption="../report/compare.rst", category="Compare"),
        csv=f"{COMPARE_OUT}/compare.csv",
        ratios=f"{COMPARE_OUT}/compare_ratios.csv",
        png=report(f"{COMPARE_OUT}/compare_time_memory.png", caption="../report/compare_fig.rst",
                   category="Compare"),
        pdf=f"{COMPARE_OUT}/compare_time_memory.pdf",
    message:
        f"compare: {', '.join(COMPARE_DIRS)} side by side -> {COMPARE_OUT}/"
    params:
        dirs=COMPARE_DIRS,
        out=lambda w, output: os.path.dirname(output.md),
    log:
        f"{MERGED}/logs/compare.log",
    shell:
        "python -m harness.reports.compare {params.dirs:q} --out {params.out:q} > {log:q} 2>&1"


rule report:
    input:
        rules.figures.input,
        rules.compare.output,
    output:
        "report.html",
    message:
        "report: snakemake --report report.html"
    log:
        f"{MERGED}/logs/report.log",
    params:
        snakefile=workflow.main_snakefile,
        configs=["--configfile", *map(str, workflow.overwrite_configfiles)] if workflow.overwrite_configfiles
        else [],
    shell:  # the report is Snakemake's own command: run from this job (docs/architecture.md)
        "snakemake --snakefile {params.snakefile:q} --nolock --report {output:q} {params.configs:q} > {log:q} 2>&1"
