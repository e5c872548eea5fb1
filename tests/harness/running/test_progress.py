"""Progress lines of a cell whose stderr is not a terminal (a pipeline cell's log)."""
import io

from harness.running import progress


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_lines_at_steady_rate_with_eta():
    out, clock = io.StringIO(), FakeClock()
    log = progress.StepLog(10, "cell", out, every_s=15.0, now=clock)
    for _ in range(10):
        clock.t += 4.0  # 4 s a step: a line every 4th step (16 s), and after the last
        log.update()
    lines = out.getvalue().splitlines()
    assert lines == ["cell: step 4 of 10, elapsed 16s, ETA 24s",
                     "cell: step 8 of 10, elapsed 32s, ETA 8s",
                     "cell: step 10 of 10, elapsed 40s, ETA 0s"]


def test_a_resumed_cell_counts_from_its_checkpoint_and_its_eta_from_its_own_steps():
    out, clock = io.StringIO(), FakeClock()
    log = progress.StepLog(100, "cell", out, every_s=15.0, now=clock, start=90)
    for _ in range(10):
        clock.t += 4.0
        log.update()
    assert out.getvalue().splitlines() == ["cell: step 94 of 100, elapsed 16s, ETA 24s",
                                           "cell: step 98 of 100, elapsed 32s, ETA 8s",
                                           "cell: step 100 of 100, elapsed 40s, ETA 0s"]


def test_slow_steps_log_every_step():
    out, clock = io.StringIO(), FakeClock()
    log = progress.StepLog(100, "c", out, every_s=15.0, now=clock)
    for _ in range(3):
        clock.t += 70.0
        log.update()
    assert out.getvalue().splitlines()[-1] == "c: step 3 of 100, elapsed 3m30s, ETA 1h53m"


def test_eta_leaves_out_the_start_and_a_wait_says_how_long_no_step_finished():
    """A timing-group cell: 40 s of start-up before its first step, then 2 s steps. Its ETA follows the
    steps' rate; while it waits for its group (no step for 30 s) the line says so instead of an ETA."""
    out, clock = io.StringIO(), FakeClock()
    log = progress.StepLog(20, "cell", out, every_s=15.0, now=clock)
    clock.t = 40.0
    log.update()
    for _ in range(8):
        clock.t += 2.0
        log.update()  # step 9 at 56 s: a line (16 s since the last)
    clock.t += 30.0
    log.write()  # as the heartbeat writes it, 30 s after step 9
    assert out.getvalue().splitlines() == ["cell: step 1 of 20, elapsed 40s, ETA 12m40s",
                                           "cell: step 9 of 20, elapsed 56s, ETA 22s",
                                           "cell: step 9 of 20, elapsed 1m26s, no step finished for 30s"]


def test_not_a_terminal_gives_lines_with_a_heartbeat(monkeypatch):
    monkeypatch.setattr("sys.stderr", io.StringIO())
    log = progress.progress(5, "c", None)
    assert isinstance(log, progress.StepLog) and log._thread is not None and log._thread.daemon
    log.close()
    assert not log._thread.is_alive()
    assert not isinstance(progress.progress(5, "c", True), progress.StepLog)


def test_a_line_at_least_every_30_s_also_while_one_step_runs_long():
    """The log's promise: a line every LOG_EVERY_S (<= 30 s), also when no step ends meanwhile (a long
    step, an evaluation, a wait for the timing group), here at 1/100 of the time scale."""
    assert progress.LOG_EVERY_S <= 30
    import time

    out = io.StringIO()
    log = progress.StepLog(100, "cell", out, every_s=0.05, heartbeat=True)
    log.update()
    time.sleep(0.5)  # the second step takes ten periods
    log.close()
    lines = out.getvalue().splitlines()
    heartbeats = [line for line in lines if ", no step finished for " in line]  # beside the first step's
    assert len(heartbeats) >= 4 and all(line.startswith("cell: step 1 of 100, elapsed ")
                                        for line in lines), lines
    count = len(lines)
    time.sleep(0.15)
    assert len(out.getvalue().splitlines()) == count  # closed: no more lines


def test_clock():
    assert [progress.clock(s) for s in (0, 59.6, 61, 3725)] == ["0s", "1m00s", "1m01s", "1h02m"]


def test_pipeline_line_counts_cells_and_extrapolates_this_runs_rate(tmp_path, monkeypatch):
    import os

    from harness.running import eta

    for name, mtime in (("old", 100.0), ("a", 1010.0), ("b", 1040.0)):  # one from an earlier run, two now
        path = tmp_path / f"{name}.runs.parquet"
        path.write_bytes(b"")
        os.utime(path, (mtime, mtime))
    assert eta.cells_progress(tmp_path, 10, 1000.0, 1060.0) == (
        "comera-bench: cells 3 of 10 done (2 in this run, 1m00s); about 3m30s left at this run's rate "
        "(cells differ: a rough guide)")  # 7 cells left at 30 s each
    assert eta.cells_progress(tmp_path, 10, 2000.0, 2060.0) == "comera-bench: cells 3 of 10 done"
    copied = tmp_path / "copied.runs.parquet"  # from a machine whose clock is an hour ahead
    copied.write_bytes(b"")
    os.utime(copied, (4660.0, 4660.0))
    assert eta.cells_progress(tmp_path, 10, 1000.0, 1060.0).startswith(
        "comera-bench: cells 4 of 10 done (2 in this run, 1m00s)")
    copied.unlink()
    monkeypatch.delenv(eta.STARTED_ENV, raising=False)
    assert eta.pipeline_line(tmp_path) == ""  # not in a pipeline run
    monkeypatch.setenv(eta.STARTED_ENV, "1000")
    monkeypatch.setenv(eta.CELLS_ENV, "10")
    assert eta.pipeline_line(tmp_path).startswith("comera-bench: cells 3 of 10 done (2 in this run")


def test_the_time_left_counts_jobs_run_side_by_side(tmp_path):
    """Two quality cells of 60 s each run side by side (`--cores 2`), both done at 60 s: the rate is 2 cells
    a minute, so the 8 left take about 4 minutes, not the 8 their durations add up to."""
    import os

    from harness.running import eta

    for name in ("a", "b"):
        path = tmp_path / f"{name}.runs.parquet"
        path.write_bytes(b"")
        os.utime(path, (1060.0, 1060.0))
    assert "about 4m00s left" in eta.cells_progress(tmp_path, 10, 1000.0, 1060.0)
