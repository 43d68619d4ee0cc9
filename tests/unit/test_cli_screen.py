"""What the CLI prints for people carries no control character a terminal would act on."""

from __future__ import annotations

import json

import pytest

from corral.services.cli import main, screen


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        pytest.param("plain text, tabs\tand\nlines", "plain text, tabs\tand\nlines", id="kept"),
        pytest.param("q\x1b[2J\x1b[Hx", "q\\u001b[2J\\u001b[Hx", id="clear-screen"),
        pytest.param("title\x1b]0;owned\x07", "title\\u001b]0;owned\\u0007", id="retitle"),
        pytest.param("a\rforged line", "a\\u000dforged line", id="carriage-return"),
        pytest.param("c1\x9bx", "c1\\u009bx", id="c1-csi"),
        pytest.param("abc\u202efed", "abc\\u202efed", id="right-to-left-override"),
        pytest.param("gpu ☃ ü", "gpu ☃ ü", id="printable-unicode"),
    ],
)
def test_escape(text: str, shown: str) -> None:
    assert screen.escape(text) == shown


def test_json_escaped_reads_back_the_same() -> None:
    text = "q\x1b[2J\u202e\x85\x7f"
    assert json.loads(screen.escape(json.dumps(text, ensure_ascii=False))) == text


def test_the_cli_escapes_what_it_prints(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main.main(["queue", "apply", "/nonexistent/a\x1b[2Jb.toml"])
    err = capsys.readouterr().err
    assert "\x1b" not in err and "a\\u001b[2Jb.toml" in err


def test_progress_bars_on_the_standard_error_keep_their_carriage_return() -> None:
    # tqdm redraws its line with "\r"; escaped, the bar printed as one long line of "\u000d".
    assert screen.escape("\r 50%|#####     |\x1b[2J", carriage_return=True) == "\r 50%|#####     |\\u001b[2J"
