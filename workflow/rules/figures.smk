# Tables, figures and the claims file from results/<device>/ (one device per call; see compare.smk for
# several). Every output is in the report (`snakemake --report report.html`) with its caption.
localrules: tables, plots, claims, figures

# Only the figures the grid can feed are drawn; the overview names the others (harness/reports/feeds.py).
from harness.reports import feeds as _feeds

NOT_DRAWN = list(_feeds.unfed({rid: spec.to_dict() for rid, spec in GRID.items()}, SWEEPS, MICROBENCH))
PLOTS = [p for p in _feeds.NEEDS if p not in NOT_DRAWN]
TABLES = ["overview", "table1_ranks", "table2_dlrm", "table_mnli_size", "table_runs"]
MERGED_FILES = [f"{MERGED}/runs.parquet", f"{MERGED}/curves.parquet", f"{MERGED}/grid.json",
                f"{MERGED}/microbench.parquet"]


rule tables:
    input:
        MERGED_FILES,
    output:
        md=[f"{FIGURES}/{t}.md" for t in TABLES],
        html=[report(f"{FIGURES}/{t}.html", caption=f"../report/{t}.rst",
                     category="Run" if t == "overview" else "Tables",
                     labels=None if t == "overview" else _feeds.report_labels(t)) for t in TABLES],
        csv=[f"{FIGURES}/{t}.csv" for t in TABLES],
    message:
        f"tables: {', '.join(TABLES)} of {MERGED} -> {FIGURES}/ (.md, .html, .csv)"
    log:
        f"{MERGED}/logs/tables.log",
    params:
        device=DEVICE,
        merged=lambda w, input: os.path.dirname(input[0]),
        out=lambda w, output: os.path.dirname(output.md[0]),
        not_drawn=NOT_DRAWN,
    shell:
        "python -m harness.reports.tables --results {params.merged:q} --device-label {params.device:q}"
        " --out {params.out:q} --not-drawn {params.not_drawn:q} > {log:q} 2>&1"


rule plots:
    input:
        MERGED_FILES,
    output:
        png=[report(f"{FIGURES}/{p}.png", caption=f"../report/{p}.rst", category="Figures",
                    labels=_feeds.report_labels(p, "figure")) for p in PLOTS],
        pdf=[f"{FIGURES}/{p}.pdf" for p in PLOTS],
        notes=[f"{FIGURES}/{p}.md" for p in PLOTS],  # what a figure's footer leaves out: model, settings, how
        notes_html=[report(f"{FIGURES}/{p}.html", caption=f"../report/{p}.rst", category="Figures",
                           labels=_feeds.report_labels(p, "notes")) for p in PLOTS],
    message:
        f"plots: {len(PLOTS)} figures of {MERGED} -> {FIGURES}/ (.png, .pdf, notes .md/.html)"
    log:
        f"{MERGED}/logs/plots.log",
    params:
        device=DEVICE,
        merged=lambda w, input: os.path.dirname(input[0]),
        out=lambda w, output: os.path.dirname(output.png[0]),
        not_drawn=NOT_DRAWN,
    shell:
        "python -m harness.reports.figures --results {params.merged:q} --device-label {params.device:q}"
        " --out {params.out:q} --not-drawn {params.not_drawn:q} > {log:q} 2>&1"


rule claims:
    input:
        MERGED_FILES,
    output:
        md=f"{FIGURES}/claims.md",
        html=report(f"{FIGURES}/claims.html", caption="../report/claims.rst", category="Claims"),
    message:
        f"claims: the paper's claims judged on {MERGED} -> {FIGURES}/claims.md, claims.html"
    log:
        f"{MERGED}/logs/claims.log",
    params:
        device=DEVICE,
        merged=lambda w, input: os.path.dirname(input[0]),
    shell:
        "python -m harness.reports.claims --results {params.merged:q} --device-label {params.device:q}"
        " --out {output.md:q} > {log:q} 2>&1"


# Every cell file too: Snakemake never looks behind an existing merged table for a missing input (a
# new cell when .snakemake/ is absent, e.g. results copied in, or a cell file deleted to re-run it);
# only a target without outputs, like this one, asks for missing inputs to be built. The new cells
# then make the merge, and so the tables, figures and claims, re-run.
rule figures:
    input:
        rules.runs.input,
        rules.microbench.input,
        rules.tables.output,
        rules.plots.output,
        rules.claims.output,
    message:
        f"figures: the tables, figures and claims of {len(GRID)} cells are in {FIGURES}/"
