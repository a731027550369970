"""How a run's frames are shown on a terminal: tokens as they arrive, tool calls, results.

Frames are for display only, and shown as text: what a run waits for is handed to the
callers' handlers, which look it up in the store (see `waiting`).

The text shown is what `TextAssembler` says each run's text is. When a step's next
attempt starts (a `retrying` marker), what its failed attempt streamed is void:

- on a terminal it is taken back: the cursor goes up to the line that text began on,
  the screen is cleared from there down, and what stands is printed again; a line then
  says the step is retried. Text printed before something else wrote to the terminal
  (a prompt, a warning), or more of it than the screen holds, cannot be taken back: it
  is then treated as below.
- elsewhere (a pipe, a file) nothing printed can be taken back: a line says the step
  is retried and that what it streamed above is void, and only the text that stands
  follows it.

A tool call's arguments, as the model writes them (`tool_call_delta` frames), grow on a
line of their own, `… refund {"order_id": "42", …`, printed as they came; the call's
`→` line follows once the model's reply is in. They are not the run's text: a marker
takes none of them back.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import click
from rich.cells import cell_len
from rich.text import Text

from ..streams.base import Frame
from ..streams.text import TextAssembler, is_attempt_marker
from .common import out
from .text import json_text, visible

CSI = "\x1b["  # the only escape sequences printed are these, the CLI's own
TAB = 8
# The parts that show arguments being written go under this key, which is no run's: the
# redraw of a run's text leaves them as they are.
DRAFTS = "\x00arguments"


def follow(
    frames: Iterable[Frame],
    on_approval: Callable[[Frame], None],
    on_question: Callable[[Frame], None],
    *,
    quiet: bool,
    screen: Screen | None = None,
) -> None:
    """Print frames as they arrive; hand approval requests to `on_approval` and
    questions to `on_question`."""
    screen = screen or Screen()
    for frame in frames:
        kind = frame.get("type")
        if kind in ("approval_request", "question"):
            if not quiet:
                screen.show(frame)
                screen.interrupt()  # the handler prints, and may ask
            (on_approval if kind == "approval_request" else on_question)(frame)
        elif not quiet:
            screen.show(frame)
    if not quiet:
        screen.finish()


@dataclass(frozen=True)
class _Part:
    """A run's text, or (`text` None) a frame that starts a line of its own: `line`, if
    it is shown."""

    run: str = ""
    text: str | None = None
    line: Text | None = None


# What a part prints: its plain text (escapes and all), and the styled line it is.
_Piece = tuple[str, Text | None]


class _Layout:
    """Parts laid out as printed: text as it comes, each line on a line of its own."""

    def __init__(self, *, keep: bool = True) -> None:
        self.keep = keep
        self.pieces: list[_Piece] = []
        self.at_line_start = True

    def add(self, part: _Part) -> list[_Piece]:
        new: list[_Piece] = []
        if part.text is not None:
            if part.text:
                new.append((visible(part.text, keep="\n\t"), None))
                self.at_line_start = part.text.endswith("\n")
        else:
            if not self.at_line_start:
                new.append(("\n", None))
            if part.line is not None:
                new.append((part.line.plain + "\n", part.line))
            self.at_line_start = True
        if self.keep:
            self.pieces += new
        return new

    @property
    def plain(self) -> str:
        return "".join(plain for plain, _ in self.pieces)


class Screen:
    """Shows frames as `TextAssembler` reads them: a void attempt's text is taken back.

    `terminal` (default: whether stdout is a terminal) says whether the cursor can go
    back over what was printed; `size` gives the terminal's (columns, lines).
    """

    def __init__(
        self,
        *,
        terminal: bool | None = None,
        size: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self.terminal = is_terminal() if terminal is None else terminal
        self._size = size or shutil.get_terminal_size
        self._texts: dict[str, TextAssembler] = {}
        # Per run: the text a reader has now (pieces, joined when needed), and how much
        # of it was printed before the last interruption (it can no longer be erased).
        self._shown: dict[str, list[str]] = {}
        self._kept: dict[str, int] = {}
        # On a terminal: what was printed since the last interruption.
        self._parts: list[_Part] = []
        self._layout = _Layout(keep=self.terminal)
        # The call whose arguments the last line printed is growing with, if any.
        self._drafting: tuple[str, str, object] | None = None

    def show(self, frame: Frame) -> None:
        """Take the next frame of the stream."""
        run = str(frame.get("run_id", ""))
        texts = self._texts.get(run)
        if texts is None:
            texts = self._texts[run] = TextAssembler(run)
        dropped = texts.dropped
        texts.feed(frame)
        kind = frame.get("type")
        if kind == "tool_call_delta":
            self._draft(run, frame)
            return
        if self._drafting is not None:
            self._drafting = None
            self._add(_Part(DRAFTS))  # what follows starts a line of its own
        if kind == "text_delta":
            text = frame.get("text")
            if texts.dropped == dropped and isinstance(text, str):
                self._add_text(run, text)  # it stands, as it came (no need to ask)
            else:
                self._catch_up(run)
            return
        marker = frame if is_attempt_marker(frame) else None
        self._catch_up(run, marker)
        if marker is None and kind not in ("approval_request", "question"):
            self._add(_Part(line=_line(frame)))

    def _draft(self, run: str, frame: Frame) -> None:
        """Print the next piece of a call's arguments, after the ones before it."""
        piece = frame.get("args_delta")
        if not isinstance(piece, str) or not piece:
            return
        call = (run, str(frame.get("call_id", "")), frame.get("attempt"))
        if self._drafting != call:
            self._drafting = call
            if not self._layout.at_line_start:
                self._add(_Part(DRAFTS, "\n"))
            self._add(_Part(DRAFTS, f"… {frame.get('name', '')} "))
        self._add(_Part(DRAFTS, piece))

    def interrupt(self) -> None:
        """Something else is about to write to the terminal: end the line, and keep
        what was printed (the cursor can no longer find its way back over it)."""
        if not self._layout.at_line_start:
            self._write("\n")
        for run, pieces in self._shown.items():
            self._kept[run] = sum(map(len, pieces))
        self._parts = []
        self._layout = _Layout(keep=self.terminal)

    def aside(self) -> None:
        """A warning is about to go to stderr: on a terminal, that is an interruption
        (stderr is likely the same screen); elsewhere stdout is not the warning's."""
        if self.terminal:
            self.interrupt()

    def finish(self) -> None:
        """The stream ended: every run's text as `TextAssembler` has it."""
        for run in list(self._texts):
            self._catch_up(run)

    def _shown_text(self, run: str) -> str:
        pieces = self._shown.setdefault(run, [])
        if len(pieces) > 1:
            pieces[:] = ["".join(pieces)]
        return pieces[0] if pieces else ""

    def _catch_up(self, run: str, marker: Frame | None = None) -> None:
        """Make what the reader has of `run`'s text what `TextAssembler` says it is."""
        standing = self._texts[run].text
        shown = self._shown_text(run)
        same = _common_prefix(shown, standing)
        if same == len(shown):  # nothing to take back
            if marker is not None:
                self._add(_Part(line=_retried(marker, void=False)))
            self._add_text(run, standing[same:])
            return
        if self.terminal and self._erase(run, same, standing, marker):
            return
        self._add(_Part(line=_retried(marker, void=True)))
        self._shown[run] = [standing[:same]]
        self.interrupt()  # what is printed no longer matches the text: keep it as it is
        self._add_text(run, standing[same:])

    def _erase(self, run: str, same: int, standing: str, marker: Frame | None) -> bool:
        """Take back what was printed of `run`'s text after its first `same` characters,
        and print what stands; False (and nothing done) when the cursor cannot go back
        that far."""
        at = self._kept.get(run, 0)
        if same < at:
            return False
        rest = standing[same:]
        parts: list[_Part] = []
        for part in self._parts:
            if part.text is None or part.run != run or at + len(part.text) <= same:
                if part.text is not None and part.run == run:
                    at += len(part.text)
                parts.append(part)
                continue
            cut, at = max(0, same - at), at + len(part.text)
            kept = part.text[:cut] + rest
            rest = ""
            if kept:
                parts.append(_Part(run, kept))
        if rest:
            parts.append(_Part(run, rest))
        if marker is not None:
            parts.append(_Part(line=_retried(marker, void=False)))
        layout = _Layout()
        for part in parts:
            layout.add(part)
        printed, redrawn = self._layout.plain, layout.plain
        # Back to the start of the line where the two first differ; reprint from there.
        start = printed.rfind("\n", 0, _common_prefix(printed, redrawn)) + 1
        columns, lines = self._size()
        up = rows(printed[start:], max(1, columns))
        if up >= max(1, lines):
            return False  # its first line has scrolled off the screen
        self._write("\r" + (f"{CSI}{up}A" if up else "") + f"{CSI}J")
        offset = 0
        for plain, line in layout.pieces:
            if offset + len(plain) > start:
                self._print((plain, line), max(0, start - offset))
            offset += len(plain)
        self._parts, self._layout = parts, layout
        self._shown[run] = [standing]
        return True

    def _add_text(self, run: str, text: str) -> None:
        if text:
            self._shown.setdefault(run, []).append(text)
            self._add(_Part(run, text))

    def _add(self, part: _Part) -> None:
        if self.terminal:
            self._parts.append(part)
        for piece in self._layout.add(part):
            self._print(piece)

    def _print(self, piece: _Piece, start: int = 0) -> None:
        plain, line = piece
        if line is not None and start < len(line.plain):
            out.print(line[start:])
        else:
            self._write(plain[start:])

    @staticmethod
    def _write(text: str) -> None:
        click.echo(text, nl=False, color=True)  # `color`: never strip the CLI's own
        sys.stdout.flush()


def is_terminal() -> bool:
    """Whether stdout is a terminal that can move its cursor."""
    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):  # no stdout, or a closed one
        return False
    return tty and os.environ.get("TERM") != "dumb"


def rows(text: str, columns: int) -> int:
    """How many rows below its first the cursor is once `text` is printed from the start
    of a row, on a terminal `columns` wide (it wraps as the terminal does: a full row
    leaves the cursor on it until the next character)."""
    row = column = 0
    for char in text:
        if char == "\n":
            row, column = row + 1, 0
        elif char == "\t":
            if column < columns:
                column = min((column // TAB + 1) * TAB, columns - 1)
        else:
            width = cell_len(char)
            if width and column + width > columns:
                row, column = row + 1, 0
            column += width
    return row


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        middle = (low + high) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle
    return low


def _retried(marker: Frame | None, *, void: bool) -> Text:
    if marker is None:
        said = "… a step is retried"
    else:
        said = f"… {marker.get('step')} is retried (attempt {marker.get('attempt')})"
    if void:
        said += "; what it streamed above is void"
    return Text(visible(said), style="yellow")


def _line(frame: Frame) -> Text | None:
    kind = frame.get("type")
    tool = visible(frame.get("tool", ""))
    status = visible(frame.get("status", ""))
    if kind == "tool_call":
        return Text(f"→ {tool}({json_text(frame.get('args'))}) {status}", style="dim")
    if kind == "tool_result":
        error = frame.get("error")
        shown = visible(error) if error else json_text(frame.get("result"))
        return Text(f"← {tool} {status}: {shown}", style="dim")
    if kind == "outcome_unknown":
        # Display only: `agent-jobs reconcile` checks the call against the store.
        said = f"? {tool}: its worker died while it ran; how it ended is unknown"
        ask = f"agent-jobs reconcile {frame.get('run_id', '')} {frame.get('call_id', '')} "
        ask += "(--succeeded JSON | --failed MESSAGE | --retry)"
        return Text(visible(f"{said}: {ask}"), style="yellow")
    if kind == "timer":
        said = f"… sleeping until {visible(frame.get('wake_at', ''))}"
        if frame.get("reason"):
            said += f" ({visible(frame.get('reason'))})"
        return Text(said + "; a message wakes it sooner", style="dim")
    if kind == "error":
        failed = f"run failed ({frame.get('error_type')}): {frame.get('error')}"
        return Text(visible(failed), style="red")
    if kind == "done":
        return Text.assemble(("✓ done", "green"), " ", (visible(frame.get("run_id", "")), "dim"))
    return None
