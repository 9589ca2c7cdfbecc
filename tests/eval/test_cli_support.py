"""eval.cli_support: one error surface (one red line, exit 2; tracebacks only for bugs or with --debug). An error is
classified by its type alone (`eval.errors`), never by the source line that raised it."""

from __future__ import annotations

import contextlib
import io

import pytest
import typer

from eval.cli_support import run_main, run_typer, split_debug
from eval.errors import (
    EXIT_INCOMPLETE,
    EXIT_INTERNAL,
    EXIT_USER_ERROR,
    IncompleteJob,
    InputError,
    ModelNotFound,
    UnknownName,
    loading_model,
)


def _app(exc: BaseException) -> typer.Typer:
    app = typer.Typer(add_completion=False)

    @app.command()
    def go(n: int = typer.Option(1, "--n")) -> None:
        raise exc

    @app.command()
    def ok() -> None:
        print("fine")

    return app


def _raising(exc: BaseException):
    def main(argv):
        raise exc

    return main


def _run(fn, *argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = fn(list(argv))
    return code, out.getvalue(), err.getvalue()


def _lines(text: str) -> list[str]:
    return [x for x in text.splitlines() if x.strip()]


@pytest.fixture(autouse=True)
def _no_debug_env(monkeypatch):
    monkeypatch.delenv("PSR_DEBUG", raising=False)


def test_known_error_is_one_line_with_the_fix_and_exit_2():
    app = _app(InputError("runs/a.parquet: column missing", fix="rescore the run"))
    code, _, err = _run(lambda a: run_typer(app, a), "go")
    assert code == EXIT_USER_ERROR
    assert _lines(err) == ["error: runs/a.parquet: column missing (rescore the run)"]


def test_debug_flag_and_env_show_the_traceback(monkeypatch):
    app = _app(InputError("bad"))
    code, _, err = _run(lambda a: run_typer(app, a), "go", "--debug")
    assert code == EXIT_USER_ERROR and "Traceback" in err and _lines(err)[-1] == "error: bad"
    monkeypatch.setenv("PSR_DEBUG", "1")
    code, _, err = _run(lambda a: run_typer(app, a), "go")
    assert code == EXIT_USER_ERROR and "Traceback" in err
    assert split_debug(["go", "--", "--debug"]) == (["go", "--", "--debug"], True)  # env on; after -- is data


def test_a_bug_shows_its_traceback_and_exits_non_zero():
    app = _app(ZeroDivisionError("division by zero"))
    code, _, err = _run(lambda a: run_typer(app, a), "go")
    assert code == EXIT_INTERNAL
    assert "Traceback" in err and "ZeroDivisionError" in err and "a bug in the toolkit" in _lines(err)[-1]


def test_library_value_error_is_a_bug_but_a_typed_toolkit_check_is_not(tmp_path):
    def lib(argv):
        import numpy as np

        np.zeros(3).reshape(2, 2)  # a ValueError from a library (or a failing call in our code): a bug

    def check(argv):
        from eval.features import write_meta

        write_meta(tmp_path, "s", kind="bogus", dim=1, model="m")  # the toolkit raises InputError

    code, _, err = _run(lambda a: run_main(lib, a))
    assert code == EXIT_INTERNAL and "Traceback" in err
    code, _, err = _run(lambda a: run_main(check, a))
    assert code == EXIT_USER_ERROR
    assert _lines(err) == ["error: space kind must be one of ('visual', 'semantic', 'prefix'), got 'bogus'"]


def test_the_type_decides_not_the_raising_line():
    """A plain ``ValueError`` is a bug even when a ``raise`` statement of toolkit code throws it; a typed error keeps
    its built-in base (a caller's ``except KeyError`` still works) and prints its message unquoted."""
    code, _, err = _run(lambda a: run_main(_raising(ValueError("a check that forgot its type")), a))
    assert code == EXIT_INTERNAL and "Traceback" in err
    e = UnknownName("unknown pool 'x'")
    assert isinstance(e, KeyError) and isinstance(e, ValueError) and str(e) == "unknown pool 'x'"
    code, _, err = _run(lambda a: run_main(_raising(e), a))
    assert code == EXIT_USER_ERROR and _lines(err) == ["error: unknown pool 'x'"]


def test_exit_code_comes_with_the_type():
    """`IncompleteJob` exits 3; a class outside eval.errors that declares ``exit_code`` (prompts.PromptError: prompts
    imports nothing of the toolkit) is reported as one line too."""
    from prompts.templates import PromptError

    code, _, err = _run(lambda a: run_main(_raising(IncompleteJob("3 queries left")), a))
    assert code == EXIT_INCOMPLETE and _lines(err) == ["error: 3 queries left"]
    code, _, err = _run(lambda a: run_main(_raising(PromptError("template 'x': bad")), a))
    assert code == EXIT_USER_ERROR and _lines(err) == ["error: template 'x': bad"]


def test_loading_model_names_the_model_the_option_and_the_fix(tmp_path, monkeypatch):
    def load(model, **kw):
        with loading_model(model, **kw):
            raise OSError(f"{model} does not appear to have a file named config.json")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFound) as e:
        load("org/model", flag="--base-model", packaged="packaged:mini")
    assert str(e.value) == ("org/model is not in the local cache and the hub is unreachable (pass --base-model "
                            "packaged:mini or a local path)")
    with pytest.raises(ModelNotFound, match="as --model"):
        load("org/model")
    with pytest.raises(ModelNotFound, match="is not a loadable model folder"):
        load(str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(ModelNotFound, match="neither a local path nor a model id"):
        load("org/model")
    with pytest.raises(InputError, match="mine"), loading_model("org/model"):
        raise InputError("mine")  # the toolkit's own errors pass through


def test_missing_file_names_the_path(tmp_path):
    def main(argv):
        open(tmp_path / "nope.jsonl").close()

    code, _, err = _run(lambda a: run_main(main, a))
    assert code == EXIT_USER_ERROR
    assert _lines(err) == [f"error: {tmp_path / 'nope.jsonl'}: No such file or directory (check the path)"]


def test_usage_errors_and_help_keep_typer_behaviour():
    app = _app(InputError("x"))
    code, out, err = _run(lambda a: run_typer(app, a), "go", "--n", "abc")
    assert code == 2 and "Invalid value" in err and "Traceback" not in err
    code, out, _ = _run(lambda a: run_typer(app, a), "ok")
    assert code == 0 and out.strip() == "fine"
    code, out, _ = _run(lambda a: run_typer(app, a), "--help")
    assert code == 0 and "go" in out


def test_an_installed_app_reports_errors_however_it_is_invoked():
    """`install` puts the error surface in the app's command group: typer's CliRunner (and any script calling the
    app) sees the one line and exit code 2 too, and --debug before the command turns the traceback on."""
    from typer.testing import CliRunner

    from eval.cli_support import install

    app = _app(InputError("bad input", fix="fix it"))
    install(app)
    res = CliRunner().invoke(app, ["go"])
    assert res.exit_code == EXIT_USER_ERROR and _lines(res.output) == ["error: bad input (fix it)"]
    res = CliRunner().invoke(app, ["--debug", "go"])
    assert res.exit_code == EXIT_USER_ERROR and "Traceback" in res.output
    res = CliRunner().invoke(_installed(ZeroDivisionError("x")), ["go"])
    assert res.exit_code == EXIT_INTERNAL and "Traceback" in res.output


def _installed(exc):
    from eval.cli_support import install

    app = _app(exc)
    install(app)
    return app
