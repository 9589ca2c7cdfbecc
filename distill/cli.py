"""Command line of the `distill` package: ``python -m distill <command> [--config PRESET] [--<field-name> VALUE ...]``.

Every command is one stage of the recipe with a config dataclass, parsed by `transformers.HfArgumentParser`
(`distill.config.parse`): ``--config`` reads the stage's section of a preset (``configs/distill/*.yaml``) and
``--<field-name> VALUE`` (or ``--<field_name>``) overrides any field (``python -m distill <command> --help``).
``train`` is parsed by `trl.TrlParser` (`distill.train_args`): TRL's flags, and ``--config`` a preset or a flat
TRL-style YAML.
Every stage checks ``--data`` and its output before it runs (`distill.outputs`: ``--overwrite`` replaces an output
this toolkit did not write for the stage; never an input). Errors print one line (`eval.cli_support`; ``--debug``
shows the traceback). Exit codes: 0 done, 1 check failed (``validate``), 2 bad input.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import asdict, is_dataclass

from distill.stages import COMMANDS, config_class, runner


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [__doc__.strip(), "", "commands:"]
    lines += [f"  {name.ljust(width)}  {c.help}" for name, c in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m distill ARGV``: the exit code; errors print one line (`eval.cli_support.run_main`)."""
    from eval.cli_support import run_main

    return run_main(_main, argv)


def _main(argv: list[str]) -> int:
    from distill.config import parse
    from distill.outputs import stage_output, with_overwrite
    from eval.errors import EXIT_CHECK_FAILED, EXIT_USER_ERROR

    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return EXIT_USER_ERROR
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if command == "recipe":
        from distill.recipe import main as recipe_main
        return recipe_main(rest)
    if command == "train":
        from distill.train import main as train_main
        return train_main(rest)
    cls = config_class(command)
    rest, overwrite = with_overwrite(cls, rest)
    cfg = parse(cls, COMMANDS[command].section, rest, prog=f"python -m distill {command}",
                description=COMMANDS[command].help + "\n\n" + (cls.__doc__ or ""))
    with stage_output(command, cfg, overwrite):
        result = runner(command)(cfg)
    if is_dataclass(result):
        result = asdict(result)
    if command == "validate":
        shown = {k: v for k, v in result.items() if k != "rejections"}
        print(json.dumps(shown, indent=2))
        for r in result["rejections"][:20]:
            print(f"{r['query_id']}: " + "; ".join(f"{x['code']}: {x['detail']}" for x in r["reasons"]))
        return EXIT_CHECK_FAILED if result["rejected"] else 0
    print(json.dumps(result, indent=2, default=str))
    return 0
