"""Run ``python -m forecasters`` commands in one process of the vLLM venv (the import of vllm is paid once).

usage: python vllm_cli_driver.py '<json list of argument lists>'   (each list is one ``forecasters`` command line)
Each command goes through the same typer app as ``python -m forecasters``; the exit codes are printed as JSON.
"""

import json
import sys


def main() -> None:
    from forecasters.cli import app

    codes = []
    for argv in json.loads(sys.argv[1]):
        try:  # without standalone mode, click returns a command's exit code instead of raising SystemExit
            codes.append(int(app(argv, standalone_mode=False) or 0))
        except SystemExit as e:
            codes.append(int(e.code or 0))
    print("EXIT_CODES " + json.dumps(codes), flush=True)


if __name__ == "__main__":  # vLLM may spawn workers: keep engine construction under the guard
    main()
