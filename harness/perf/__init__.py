"""The performance targets of ``comera-bench bench``, measured and judged against harness/perf/goals.yaml.

:mod:`.bench` is the command; :mod:`.layers` runs targets 1 and 3, :mod:`.steps` with :mod:`.worker` 2 and
4, :mod:`.plans` 5; :mod:`.targets` runs them, :mod:`.report` and :mod:`.figure` show them. Targets and
goals: docs/performance.md; timing: docs/measurement.md; the bounds: docs/design-notes.md.
"""
