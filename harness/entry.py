"""Entry point of the ``comera-bench`` command: the pipeline's packages are an extra of the project
(``pip install 'comera-bench[bench]'``); without them the command says so instead of a bare traceback."""
from __future__ import annotations

import os
import shutil
import sys

PROJECT_PACKAGES = ("comera", "baselines", "harness")
INSTALL_HINT = "pip install 'comera-bench[bench]' (or: bash scripts/setup.sh)"


def main(argv: list[str] | None = None) -> int:
    try:
        from harness.cli import main as cli_main
        return cli_main(argv)
    except BrokenPipeError:  # `comera-bench show ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except ModuleNotFoundError as error:
        missing = (error.name or "").partition(".")[0]
        if not missing or missing in PROJECT_PACKAGES:
            raise
        print(f"comera-bench: the Python package {missing!r} is missing; the comera-bench command needs the "
              f"pipeline extra 'bench': {INSTALL_HINT}. The library itself (import comera) needs torch "
              "only.", file=sys.stderr)
        return 2


def command_on_path(environ: dict[str, str] | None = None) -> None:
    """Where ``comera-bench`` is not on ``PATH`` but beside this interpreter (``.venv/bin/snakemake`` run
    with the venv not activated), put the interpreter's folder first on ``PATH`` (``environ``, default
    ``os.environ``), so that the pipeline's jobs find ``comera-bench`` and the venv's ``python``. An
    environment where the command is found stays as it is."""
    environ = os.environ if environ is None else environ
    folder = os.path.dirname(sys.executable)
    if shutil.which("comera-bench", path=environ.get("PATH")) is None and os.path.isfile(
            os.path.join(folder, "comera-bench")):
        environ["PATH"] = folder + os.pathsep + environ.get("PATH", "")


if __name__ == "__main__":
    sys.exit(main())
