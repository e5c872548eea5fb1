"""`comera-bench noisy`: the ok timing cells that are not stable, named with their reason; --delete
removes their per-cell files so the pipeline times them (and their groups) again."""
from __future__ import annotations

from harness import cli, results
from harness.reports import noisy


def _cell(folder, run_id, quality, purpose="timing", status="ok"):
    row = {c: None for c in results.RUNS_COLUMNS}
    row.update(run_id=run_id, workload="toy", method="dense", variant="", batch_size=4, seed=0, status=status,
               error="", purpose=purpose, timing_quality=quality)
    for kind in ("runs", "curves"):
        (folder / f"{run_id}.{kind}.parquet").parent.mkdir(parents=True, exist_ok=True)
    results.write_parquet_atomic(results.to_frame([row], "runs"), folder / f"{run_id}.runs.parquet", kind="runs")
    results.write_parquet_atomic(results.empty_frame("curves"), folder / f"{run_id}.curves.parquet", kind="curves")


def test_noisy_lists_and_deletes(tmp_path, capsys):
    cells = tmp_path / "runs" / "cpu"
    _cell(cells, "a", "stable")
    _cell(cells, "b", "noisy: CPU pressure 40% (> 25%)")
    _cell(cells, "c", "noisy: 3 timed steps (< 5)", purpose="quality")  # not a timing cell
    _cell(cells, "d", None, status="error")                              # failed: not a timing question
    assert noisy.noisy_cells([cells]).run_id.tolist() == ["b"]
    text = noisy.summary([cells], str(cells))
    assert "b: CPU pressure 40% (> 25%)" in text and f"comera-bench noisy {cells} --delete" in text
    assert cli.main(["noisy", str(cells), "--delete"]) == 0
    assert "b\tCPU pressure 40% (> 25%)" in capsys.readouterr().out
    assert sorted(p.name for p in cells.iterdir()) == sorted(
        f"{r}.{k}.parquet" for r in "acd" for k in ("runs", "curves"))
    assert noisy.summary([cells], str(cells)) == ""


def test_the_hint_repeats_the_config_and_folders_of_the_run(tmp_path):
    """Following the hint re-times the deleted cells of this config, not the default grid in ./results."""
    cells = tmp_path / "my results" / "runs" / "cpu"
    _cell(cells, "b", "noisy: CPU pressure 40% (> 25%)")
    text = noisy.summary([cells], str(cells), configfiles=["config/tiny.yaml", "my cfg.yaml"],
                         settings={"results_dir": str(tmp_path / "my results"), "figures_dir": "figs"})
    hint = text.splitlines()[-1]
    assert hint.endswith(f"snakemake --cores 1 figures --configfile config/tiny.yaml 'my cfg.yaml' --config "
                         f"'results_dir={tmp_path}/my results' figures_dir=figs")
    assert f"comera-bench noisy '{cells}' --delete && " in hint


def test_a_folder_without_results_is_named(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert cli.main(["noisy", str(tmp_path / "empty"), "--delete"]) == 1
    assert f"no results in {tmp_path / 'empty'}" in capsys.readouterr().err


def test_the_commands_repeat_directory_config_args_and_the_device_variable():
    """What the pipeline prints is what to type: its --directory, --configfile, one --config with the values
    given (then the hint's own), and COMERA_BENCH_DEVICE when the user set it."""
    command = noisy.snakemake_command(["--cores", "1", "figures"], configfiles=["/c/tiny.yaml"],
                                      config_args=["results_dir=out", "execution={threads: 1}"], directory="/w d")
    assert command == ["snakemake", "--cores", "1", "figures", "--directory", "/w d", "--configfile", "/c/tiny.yaml",
                       "--config", "results_dir=out", "execution={threads: 1}"]
    assert noisy.as_typed(command, {"COMERA_BENCH_DEVICE": "my gpu"}) == (
        "COMERA_BENCH_DEVICE='my gpu' snakemake --cores 1 figures --directory '/w d' --configfile /c/tiny.yaml "
        "--config results_dir=out 'execution={threads: 1}'")
