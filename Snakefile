# comera-bench pipeline: config -> grid of cells (one process each) -> merged tables -> figures,
# tables, claims -> device comparison -> `snakemake --report report.html`. See docs/pipeline.md.
# The entry point at the repository root: `snakemake --cores all figures` from here finds this file and its
# default profile (profiles/default); the rules, schemas and report captions are in workflow/.
# The embedded default, unless --configfile is given (Snakemake would deep-merge the two: a smaller
# config must not inherit the default's workloads and methods).
if not workflow.overwrite_configfiles:

    configfile: f"{workflow.basedir}/config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/microbench.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/compare.smk"
include: "workflow/rules/bench.smk"  # `snakemake bench`, not part of `all`


rule all:
    default_target: True
    input:
        rules.runs.input,
        rules.microbench.input,
        rules.figures.input,
        rules.compare.output,
    message:
        "all: every cell, micro-benchmark, table, figure, claim and the device comparison"
