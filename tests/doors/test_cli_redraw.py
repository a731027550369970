"""What a reader of the CLI sees when a step's attempt is void: taken back on a terminal,
set apart by a line elsewhere, and never shown as part of the answer."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from agent_jobs.cli.frames import Screen, follow, rows
from tests.doors.test_cli import CLI, agent_jobs
from tests.support import encryption as test_encryption

ESC = "\x1b"
VOID = "; what it streamed above is void"


def delta(text: str, run: str = "r1", **tags: Any) -> dict[str, Any]:
    return {"type": "text_delta", "run_id": run, "text": text, **tags}


def marker(step: str, attempt: int, run: str = "r1") -> dict[str, Any]:
    return {"type": "status", "run_id": run, "status": "retrying", "step": step, "attempt": attempt}


def frame(type: str, run: str = "r1", **fields: Any) -> dict[str, Any]:
    return {"type": type, "run_id": run, **fields}


def retried(step: str, attempt: int, *, void: bool = False) -> str:
    return f"… {step} is retried (attempt {attempt})" + (VOID if void else "")


class Vt100:
    """The little of a VT100 the CLI may use: text that wraps (the cursor stays on a
    full row until the next character), CR, LF (as CR LF, the tty's onlcr), tabs,
    cursor up (never above the screen's top row), erase below; colours are ignored.
    Any other escape sequence fails the test."""

    def __init__(self, columns: int = 80, lines: int = 24) -> None:
        self.columns, self.lines = columns, lines
        self.grid: list[list[str]] = [[]]
        self.row = self.col = 0  # col == columns: the row is full, the wrap is pending
        self.top = 0  # the screen's top row; those above have scrolled off

    def feed(self, data: str) -> Vt100:
        i = 0
        while i < len(data):
            char = data[i]
            if char == ESC:
                found = re.match(r"\x1b\[([0-9;]*)([A-Za-z])", data[i:])
                assert found, f"not a CSI sequence: {data[i : i + 8]!r}"
                self._csi(found.group(1), found.group(2))
                i += found.end()
                continue
            if char == "\r":
                self.col = 0
            elif char == "\n":
                self._down()
            elif char == "\t":
                if self.col < self.columns:
                    self.col = min((self.col // 8 + 1) * 8, self.columns - 1)
            else:
                self._put(char)
            i += 1
        return self

    def _csi(self, params: str, final: str) -> None:
        if final == "m":
            return
        if final == "A":
            self.row = max(self.top, self.row - int(params or 1))
            self.col = min(self.col, self.columns - 1)
        elif final == "J" and params in ("", "0"):
            del self.grid[self.row][self.col :]
            del self.grid[self.row + 1 :]
        else:
            raise AssertionError(f"unexpected escape sequence CSI {params}{final}")

    def _down(self) -> None:
        self.row, self.col = self.row + 1, 0
        while len(self.grid) <= self.row:
            self.grid.append([])
        self.top = max(self.top, self.row - self.lines + 1)

    def _put(self, char: str) -> None:
        width = 0 if unicodedata.combining(char) else 1
        if unicodedata.east_asian_width(char) in "WF":
            width = 2
        if not width:
            return
        if self.col + width > self.columns:
            self._down()
        line = self.grid[self.row]
        line.extend(" " * (self.col + width - len(line)))
        line[self.col] = char
        if width == 2:
            line[self.col + 1] = ""
        self.col += width

    @property
    def text(self) -> str:
        """The screen and its scrollback, as a reader sees them."""
        shown = ["".join(line).rstrip() for line in self.grid]
        while shown and not shown[-1]:
            shown.pop()
        return "\n".join(shown)


def render(
    frames: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    *,
    terminal: bool,
    columns: int = 80,
    lines: int = 24,
    on_approval: Any = None,
) -> str:
    """What the CLI prints for `frames`, as `tail` and `run` follow them."""
    capsys.readouterr()
    screen = Screen(terminal=terminal, size=lambda: (columns, lines))
    follow(frames, on_approval or (lambda f: None), lambda f: None, quiet=False, screen=screen)
    return capsys.readouterr().out


def on_screen(printed: str, columns: int = 80, lines: int = 24) -> str:
    return Vt100(columns, lines).feed(printed).text


def own_sequences(printed: str) -> list[str]:
    """Every escape sequence printed: each must be the CLI's own cursor control."""
    found = re.findall(r"\x1b\[[0-9;]*[A-Za-z]", printed)
    assert printed.count(ESC) == len(found)
    assert all(re.fullmatch(r"\x1b\[(\d+A|J)", seq) for seq in found), found
    return found


ONE_ATTEMPT = [
    frame("status", status="running"),
    delta("Checking "),
    delta("both.\n"),
    frame("tool_call", call_id="c1", tool="lookup", args={"id": 42}, status="ok"),
    frame("tool_result", call_id="c1", tool="lookup", result={"ok": True}, status="ok"),
    delta("Done."),
    frame("done", output="Checking both.\nDone."),
]
ONE_ATTEMPT_SHOWN = (
    'Checking both.\n→ lookup({"id": 42}) ok\n← lookup ok: {"ok": true}\nDone.\n✓ done r1\n'
)


def test_one_attempt_is_printed_as_it_streams(capsys: pytest.CaptureFixture[str]) -> None:
    assert render(ONE_ATTEMPT, capsys, terminal=False) == ONE_ATTEMPT_SHOWN
    printed = render(ONE_ATTEMPT, capsys, terminal=True)
    assert printed == ONE_ATTEMPT_SHOWN  # nothing to take back: not one escape sequence
    assert on_screen(printed) == ONE_ATTEMPT_SHOWN.rstrip("\n")


VOID_ATTEMPT = [
    delta("Checking. "),  # model:1, finished
    frame("tool_call", call_id="c1", tool="lookup", args={}, status="ok"),
    frame("tool_result", call_id="c1", tool="lookup", result=1, status="ok"),
    delta("The order "),  # model:2, attempt 1: its worker dies here
    delta("is lo"),
    marker("model:2", 2),
    delta("Order 42 "),
    delta("shipped."),
    frame("done", output="Order 42 shipped."),
]
BEFORE = "Checking. \n→ lookup({}) ok\n← lookup ok: 1\n"


def test_off_a_terminal_a_line_sets_the_void_attempt_apart(
    capsys: pytest.CaptureFixture[str],
) -> None:
    printed = render(VOID_ATTEMPT, capsys, terminal=False)
    assert printed == (
        BEFORE
        + "The order is lo\n"
        + retried("model:2", 2, void=True)
        + "\nOrder 42 shipped.\n✓ done r1\n"
    )
    after = printed.split(VOID, 1)[1]
    assert "The order" not in after and "is lo" not in after


def test_on_a_terminal_the_void_attempt_is_erased(capsys: pytest.CaptureFixture[str]) -> None:
    printed = render(VOID_ATTEMPT, capsys, terminal=True)
    assert own_sequences(printed) == ["\x1b[J"]  # back to the row's start: no row up
    assert on_screen(printed) == on_screen(
        BEFORE + retried("model:2", 2) + "\nOrder 42 shipped.\n✓ done r1"
    )


def test_on_a_terminal_void_text_over_wrapped_rows_is_erased_to_its_first_row(
    capsys: pytest.CaptureFixture[str],
) -> None:
    columns = 12
    frames = [
        delta("Plan: "),  # the attempt's text begins mid-row
        delta("a" * 6),  # fills that row exactly: the wrap is pending
        delta("b" * 12 + "\n"),  # a full row, then a newline
        delta("\tc\tdd界界界\n"),  # tabs, and a wide character that does not fit
        delta("\x1b[2J" * 2),  # escaped, so twice as wide as it came
        marker("model:1", 2),
        delta("Plan: ok"),
    ]
    printed = render(frames, capsys, terminal=True, columns=columns)
    own_sequences(printed)  # the text's own `\x1b[2J` is shown escaped, as text
    assert "\x1b[5A" in printed  # up five rows: the whole attempt, wrapped as it was
    assert on_screen(printed, columns) == on_screen(retried("model:1", 2) + "\nPlan: ok", columns)

    plain = render(frames, capsys, terminal=False, columns=columns)
    assert ESC not in plain
    assert plain.endswith(retried("model:1", 2, void=True) + "\nPlan: ok")


def test_void_text_taller_than_the_screen_is_set_apart_instead(
    capsys: pytest.CaptureFixture[str],
) -> None:
    frames = [delta("line\n" * 5), marker("model:1", 2), delta("answer")]
    printed = render(frames, capsys, terminal=True, lines=4)
    own_sequences(printed)
    assert ESC not in printed  # its first row has scrolled off: nothing is erased
    assert (
        on_screen(printed, lines=4) == "line\n" * 5 + retried("model:1", 2, void=True) + "\nanswer"
    )


def test_runs_sharing_a_stream_each_lose_only_their_own_void_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    frames = [
        delta("parent ", run="p"),
        delta("child partial", run="c"),  # the child's attempt 1, on the parent's row
        delta("answer ", run="p"),
        marker("model:1", 2, run="c"),
        delta("child final", run="c"),
        frame("done", run="p"),
    ]
    plain = render(frames, capsys, terminal=False)
    assert plain == (
        "parent child partialanswer \n"
        + retried("model:1", 2, void=True)
        + "\nchild final\n✓ done p\n"
    )
    printed = render(frames, capsys, terminal=True)
    assert on_screen(printed) == on_screen(
        "parent answer \n" + retried("model:1", 2) + "\nchild final\n✓ done p"
    )


def test_a_marker_for_a_step_with_no_text_voids_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    frames = [
        frame("status", status="running"),
        marker("model:1", 2),  # attempt 1 died before its first token
        delta("a2 "),
        marker("model:1", 3),
        marker("model:1", 4),  # attempt 3 streamed nothing either
        delta("final"),
    ]
    plain = render(frames, capsys, terminal=False)
    assert plain == "\n".join(
        [
            retried("model:1", 2),
            "a2 ",
            retried("model:1", 3, void=True),
            retried("model:1", 4),
            "final",
        ]
    )
    printed = render(frames, capsys, terminal=True)
    assert on_screen(printed) == "\n".join(
        [retried("model:1", 2), retried("model:1", 3), retried("model:1", 4), "final"]
    )


def test_a_superseded_attempt_still_streaming_is_never_shown(
    capsys: pytest.CaptureFixture[str],
) -> None:
    frames = [
        delta("stale ", step="model:1", attempt=1),
        marker("model:1", 2),
        delta("fresh", step="model:1", attempt=2),
        delta(" late", step="model:1", attempt=1),  # it lost its lease but streams on
        delta(" on", step="model:1", attempt=2),
    ]
    plain = render(frames, capsys, terminal=False)
    assert plain == "stale \n" + retried("model:1", 2, void=True) + "\nfresh on"
    printed = render(frames, capsys, terminal=True)
    assert "late" not in printed
    assert on_screen(printed) == retried("model:1", 2) + "\nfresh on"


def test_what_a_handler_printed_is_never_erased(capsys: pytest.CaptureFixture[str]) -> None:
    frames = [
        delta("child partial", run="c"),
        frame("approval_request", run="p", call_id="c1"),
        marker("model:1", 2, run="c"),
        delta("child final", run="c"),
    ]
    printed = render(
        frames, capsys, terminal=True, on_approval=lambda f: print("? approve c1", flush=True)
    )
    assert ESC not in printed
    assert on_screen(printed) == "\n".join(
        ["child partial", "? approve c1", retried("model:1", 2, void=True), "child final"]
    )


@pytest.mark.parametrize(
    "text",
    [
        "",
        "abc",
        "a" * 10,
        "a" * 10 + "\n",
        "a" * 11,
        "a" * 30,
        "\n\n",
        "abcdefghi界",
        "界" * 5 + "x",
        "\t\t\tx",
        "e\u0301" * 12,
        "x" * 9 + "\t" + "y",
    ],
)
def test_rows_go_back_exactly_to_where_the_text_began(text: str) -> None:
    terminal = Vt100(columns=10).feed("before\n")
    up = rows(text, 10)
    terminal.feed(text).feed("\r" + (f"\x1b[{up}A" if up else "") + "\x1b[J")
    assert (terminal.row, terminal.col, terminal.text) == (1, 0, "before")


FLAKY_APP = """
from agent_jobs import AgentApp, ScriptedModel
from agent_jobs.errors import ModelError


class Flaky:
    '''Streams part of a reply, then the connection drops; the retry answers.'''

    name = "flaky"

    def __init__(self):
        self.calls = 0
        self.then = ScriptedModel([{"text": "Order 42 has shipped."}])

    def run_turn(self, request, sink):
        self.calls += 1
        if self.calls == 1:
            sink.text("The order ")
            sink.text("is lo")
            raise ModelError("the connection dropped", kind="connection")
        return self.then.run_turn(request, sink)


app = AgentApp()
app.agent("flaky", model=Flaky())
"""


def _flaky_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "flakyapp.py").write_text(FLAKY_APP)
    return {
        "AGENT_JOBS_APP": "flakyapp:app",
        "PYTHONPATH": str(tmp_path),
        "AGENT_JOBS_MODEL_RETRY_BASE_DELAY": "0.01",
    }


def test_run_sets_a_retried_model_steps_void_text_apart(tmp_path: Path) -> None:
    done = agent_jobs(
        "run", "Where is 42?", "--agent", "flaky", cwd=tmp_path, env=_flaky_env(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.split(retried("model:1", 2, void=True) + "\n")
    assert before == "The order is lo\n"
    assert after.startswith("Order 42 has shipped.\n✓ done ")


def test_run_on_a_terminal_erases_a_retried_model_steps_void_text(tmp_path: Path) -> None:
    environment = test_encryption.bare_environ()
    environment |= _flaky_env(tmp_path) | {"TERM": "xterm", "COLUMNS": "80", "LINES": "24"}
    master, slave = pty.openpty()
    with subprocess.Popen(
        [*CLI, "run", "Where is 42?", "--agent", "flaky"],
        cwd=tmp_path,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.PIPE,
    ) as proc:
        os.close(slave)
        printed = b""
        try:
            while select.select([master], [], [], 60)[0]:
                chunk = os.read(master, 4096)
                if not chunk:
                    break
                printed += chunk
        except OSError:  # EIO: the command has ended, and with it the terminal
            pass
        finally:
            os.close(master)
        _, errors = proc.communicate(timeout=60)
    assert proc.returncode == 0, errors
    shown = on_screen(printed.decode())
    assert "is lo" not in shown
    assert shown.startswith(retried("model:1", 2) + "\nOrder 42 has shipped.\n✓ done ")


def test_run_json_prints_the_finished_run_alone(tmp_path: Path) -> None:
    done = agent_jobs(
        "run", "Where is 42?", "--agent", "flaky", "--json", cwd=tmp_path, env=_flaky_env(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == "Order 42 has shipped."


# --- a tool call's arguments as the model writes them -----------------------------------


def args(call_id: str, name: str, piece: str, offset: int, **tags: Any) -> dict[str, Any]:
    return frame(
        "tool_call_delta", call_id=call_id, name=name, args_delta=piece, offset=offset, **tags
    )


WRITING = [
    delta("Refunding "),
    delta("it."),
    args("c1", "refund", '{"order_id": "4', 0),
    args("c1", "refund", '2", "amount": 5}', 15),
    args("c2", "lookup", '{"id": 7}', 0),
    frame(
        "tool_call", call_id="c1", tool="refund", args={"order_id": "42", "amount": 5}, status="?"
    ),
    frame("tool_call", call_id="c2", tool="lookup", args={"id": 7}, status="ok"),
    frame("done", output="Refunding it."),
]
WRITING_SHOWN = (
    "Refunding it.\n"
    '… refund {"order_id": "42", "amount": 5}\n'
    '… lookup {"id": 7}\n'
    '→ refund({"order_id": "42", "amount": 5}) ?\n'
    '→ lookup({"id": 7}) ok\n'
    "✓ done r1\n"
)


@pytest.mark.parametrize("terminal", [False, True])
def test_arguments_grow_on_a_line_of_their_own_before_the_call(
    capsys: pytest.CaptureFixture[str], terminal: bool
) -> None:
    printed = render(WRITING, capsys, terminal=terminal)
    assert printed == WRITING_SHOWN
    if terminal:
        assert on_screen(printed) == WRITING_SHOWN.rstrip("\n")


def test_arguments_are_printed_literally(capsys: pytest.CaptureFixture[str]) -> None:
    hostile = '{"note": "[bold red]x[/] \x1b[2J\u202e"}'
    printed = render([args("c1", "[b]refund[/b]", hostile, 0), delta("ok")], capsys, terminal=False)
    assert printed == ('… [b]refund[/b] {"note": "[bold red]x[/] \\x1b[2J\\u202e"}\nok')


def test_a_retried_steps_text_is_taken_back_but_not_the_arguments_it_wrote(
    capsys: pytest.CaptureFixture[str],
) -> None:
    frames = [
        delta("The order "),  # model:1, attempt 1: its worker dies mid-arguments
        args("c1", "refund", '{"order', 0),
        marker("model:1", 2),
        delta("Order 42. "),
        args("c1", "refund", '{"order_id": "42"}', 0),
        frame("tool_call", call_id="c1", tool="refund", args={"order_id": "42"}, status="ok"),
    ]
    printed = render(frames, capsys, terminal=False)
    assert printed == (
        "The order \n"
        '… refund {"order\n'
        + retried("model:1", 2, void=True)
        + "\nOrder 42. \n"
        + '… refund {"order_id": "42"}\n'
        + '→ refund({"order_id": "42"}) ok\n'
    )
