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
    results.write_parquet_atomic(results.to_frame([row], "runs"),
                                 folder / f"{run_id}.runs.parquet", kind="runs")
    results.write_parquet_atomic(results.empty_frame("curves"), folder / f"{run_id}.curves.parquet",
                                 kind="curves")


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
                                      config_args=["results_dir=out", "execution={threads: 1}"],
                                      directory="/w d")
    assert command == ["snakemake", "--cores", "1", "figures", "--directory", "/w d", "--configfile",
                       "/c/tiny.yaml", "--config", "results_dir=out", "execution={threads: 1}"]
    assert noisy.as_typed(command, {"COMERA_BENCH_DEVICE": "my gpu"}) == (
        "COMERA_BENCH_DEVICE='my gpu' snakemake --cores 1 figures --directory '/w d' --configfile "
        "/c/tiny.yaml --config results_dir=out 'execution={threads: 1}'")


def test_delete_stays_inside_the_folder_whatever_a_stored_run_id_says(tmp_path, capsys):
    """A row whose stored run_id climbs out of the folder (``../../x``) names no file to delete: the runs
    file two levels up stays, the message says nothing was removed."""
    cells = tmp_path / "results" / "runs" / "cpu"
    _cell(tmp_path, "x", "stable")  # the file the stored run_id points at
    _cell(cells, "b", "noisy: CPU pressure 40% (> 25%)")
    row = results.read_parquet(cells / "b.runs.parquet", "runs").assign(run_id="../../../x")
    results.write_parquet_atomic(row, cells / "b.runs.parquet", kind="runs")
    assert cli.main(["noisy", str(cells), "--delete"]) == 0
    assert (tmp_path / "x.runs.parquet").exists() and (tmp_path / "x.curves.parquet").exists()
    err = capsys.readouterr().err
    assert "removed nothing; no cell will be timed again" in err
    assert "refused: run_id '../../../x' is not a plain file name" in err


def test_delete_on_a_top_folder_or_a_merged_table_says_what_it_did(tmp_path, capsys):
    top = tmp_path / "results"
    _cell(top / "runs" / "cpu", "b", "noisy: CPU pressure 40% (> 25%)")
    _cell(top / "runs" / "cpu", "a", "stable")
    merged = tmp_path / "runs.parquet"
    noisy_row = results.read_parquet(top / "runs" / "cpu" / "b.runs.parquet", "runs")
    results.write_parquet_atomic(noisy_row, merged, kind="runs")
    assert cli.main(["noisy", str(merged), "--delete"]) == 0
    err = capsys.readouterr().err
    assert f"{merged} is a runs table, not a folder of per-cell files: nothing deleted" in err
    assert "removed nothing; no cell will be timed again" in err
    assert (top / "runs" / "cpu" / "b.runs.parquet").exists()
    assert cli.main(["noisy", str(top), "--delete"]) == 0  # the folder above results/runs/<device>
    assert "removed 2 file(s) of 1 cell(s)" in capsys.readouterr().err
    assert sorted(p.name for p in (top / "runs" / "cpu").iterdir()) == ["a.curves.parquet", "a.runs.parquet"]


def test_delete_leaves_another_devices_stable_cells_of_the_same_run_id(tmp_path, capsys):
    """Two device folders holding the same cells: only the files whose own row is noisy go, the other
    device's stable measurements of the same run_ids stay."""
    mine, other = tmp_path / "runs" / "cpu-mini", tmp_path / "runs" / "cpu-other"
    for run_id in "ab":
        _cell(mine, run_id, "noisy: CPU pressure 40% (> 25%)")
        _cell(other, run_id, "stable")
    for folder, name in ((mine, "mini"), (other, "other")):
        for path in folder.glob("*.runs.parquet"):
            row = results.read_parquet(path, "runs").assign(device_name=name, hostname=name)
            results.write_parquet_atomic(row, path, kind="runs")
    assert cli.main(["noisy", str(tmp_path / "runs"), "--delete"]) == 0
    assert "removed 4 file(s) of 2 cell(s)" in capsys.readouterr().err
    assert list(mine.iterdir()) == []
    assert sorted(p.name for p in other.iterdir()) == sorted(
        f"{r}.{k}.parquet" for r in "ab" for k in ("runs", "curves"))


def test_delete_takes_only_the_listed_devices_row(tmp_path):
    """A file whose row is noisy but of a device not listed stays (the caller's list is per device)."""
    mine, other = tmp_path / "cpu-mini", tmp_path / "cpu-other"
    _cell(mine, "b", "noisy: CPU pressure 40% (> 25%)")
    _cell(other, "b", "noisy: CPU pressure 40% (> 25%)")
    path = other / "b.runs.parquet"
    results.write_parquet_atomic(results.read_parquet(path, "runs").assign(device_name="other"), path,
                                 kind="runs")
    removed, notes = noisy.delete_cells([tmp_path], noisy.noisy_cells([mine]))
    assert sorted(removed) == [mine / "b.curves.parquet", mine / "b.runs.parquet"]
    assert path.exists() and any(f"{path} left" in n for n in notes)
