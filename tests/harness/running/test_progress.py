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


def test_slow_steps_log_every_step():
    out, clock = io.StringIO(), FakeClock()
    log = progress.StepLog(100, "c", out, every_s=15.0, now=clock)
    for _ in range(3):
        clock.t += 70.0
        log.update()
    assert out.getvalue().splitlines()[-1] == "c: step 3 of 100, elapsed 3m30s, ETA 1h53m"


def test_not_a_terminal_gives_lines(monkeypatch):
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert isinstance(progress.progress(5, "c", None), progress.StepLog)
    assert not isinstance(progress.progress(5, "c", True), progress.StepLog)


def test_clock():
    assert [progress.clock(s) for s in (0, 59.6, 61, 3725)] == ["0s", "1m00s", "1m01s", "1h02m"]
