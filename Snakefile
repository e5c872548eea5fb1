# comera-bench pipeline: config -> grid of cells (one process each) -> merged tables -> figures,
# tables, claims -> device comparison -> `snakemake --report report.html`. See README "Pipeline".
# The embedded default, unless --configfile is given (Snakemake would deep-merge the two: a smaller
# config must not inherit the default's workloads and methods).
if not workflow.overwrite_configfiles:

    configfile: f"{workflow.basedir}/config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/microbench.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/compare.smk"


rule all:
    default_target: True
    input:
        rules.runs.input,
        rules.microbench.input,
        rules.figures.input,
        rules.compare.output,
