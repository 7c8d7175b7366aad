"""The shell commands of README.md and docs/*.md, as the docs-command tests run them.

A command is a line of a fenced code block that starts with `cfree ` (or `$ cfree `), with its
backslash continuations joined. A line such as `cfree plan: error: ...` (the command's name
ends in a colon) is output, not a command: when it follows a command in the same block, that
command is expected to fail with this message. A trailing `# exit N` comment states the exit
status a command is expected to end with.

A block whose every line is a `cfree` command or one of a few file-handling shell commands
(`head`, `mv`, `rm`, `printf`, `mkdir`, `cp`, `for`) is a script: its other lines run too, in
order, because the `cfree` commands after them depend on them (a log cut short, keys copied to
hosts). In other blocks only the `cfree` commands run (the docker, scp and firewall lines
around them need other machines).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHELL_HELPERS = {"head", "mv", "rm", "printf", "mkdir", "cp", "for"}
_FENCE = re.compile(r"^\s*```")
_EXIT = re.compile(r"#\s*exit\s+(\d+)\b")


@dataclass
class DocCommand:
    doc: str  # path relative to the repository, e.g. "docs/lab.md"
    line: int  # 1-based line of the command's first line
    text: str  # the command as written, continuations joined, without prompt or comment
    block: int  # index of the fenced block within its file
    is_cfree: bool = True
    expect_exit: int | None = 0  # None: any non-zero status
    expect_stderr: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def argv(self) -> list[str]:
        """The arguments after `cfree` (only for cfree commands)."""
        words = shlex.split(self.text, comments=True)
        assert words and words[0] == "cfree", self.text
        return words[1:]


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _blocks(text: str):
    """(first line number, lines) of every fenced code block."""
    inside, start, lines = False, 0, []
    for no, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            if inside:
                yield start, lines
                inside, lines = False, []
            else:
                inside, start = True, no + 1
        elif inside:
            lines.append(line)


def _logical_lines(start: int, lines: list[str]):
    """(line number, text) with backslash continuations joined."""
    i = 0
    while i < len(lines):
        no, text = start + i, lines[i]
        while text.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text.rstrip()[:-1].rstrip() + " " + lines[i].strip()
        yield no, text
        i += 1


_OUTPUT = re.compile(r"^cfree(?: [a-z0-9][a-z0-9-]*){1,2}:(?:\s|$)")


def _is_output(text: str) -> bool:
    """`cfree plan: error: ...`, `cfree lab up: error: ...`: what a command printed."""
    return bool(_OUTPUT.match(text))


def _strip_comment(text: str) -> str:
    """The command without its trailing `# ...` comment (quotes respected)."""
    out, quote = [], None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            break
        out.append(ch)
    return "".join(out).rstrip()


def commands_of(path: Path) -> list[DocCommand]:
    doc = path.relative_to(REPO).as_posix()
    found: list[DocCommand] = []
    for index, (start, lines) in enumerate(_blocks(path.read_text())):
        entries = []
        for no, raw in _logical_lines(start, lines):
            text = raw.strip()
            if text.startswith("$ "):
                text = text[2:].strip()
            entries.append((no, text))
        cmds = [(no, t) for no, t in entries if t.startswith("cfree ") and not _is_output(t)]
        if not cmds:
            continue
        code = [(no, t) for no, t in entries if t and not t.startswith("#")]
        script = all(
            (t.startswith("cfree ") and not _is_output(t)) or t.split()[0] in SHELL_HELPERS
            for no, t in code
            if not _is_output(t) and t != "..."
        ) and any(t.split()[0] in SHELL_HELPERS for _, t in code)
        previous: DocCommand | None = None
        for no, text in entries:
            if _is_output(text):
                if previous is not None and ": error:" in text:
                    previous.expect_exit = None
                    previous.expect_stderr.append(text)
                continue
            is_cfree = text.startswith("cfree ")
            if not text or text.startswith("#") or not (is_cfree or script):
                previous = None
                continue
            exit_status = _EXIT.search(text)
            cmd = DocCommand(doc, no, _strip_comment(text), index, is_cfree)
            if exit_status:
                cmd.expect_exit = int(exit_status.group(1))
            found.append(cmd)
            previous = cmd
    return found


def all_commands() -> list[DocCommand]:
    return [c for path in doc_files() for c in commands_of(path)]


if __name__ == "__main__":
    for c in all_commands():
        flag = "" if c.is_cfree else "(sh) "
        print(f"{c.where:22} b{c.block:<2} exit={c.expect_exit} {flag}{c.text}")
        for e in c.expect_stderr:
            print(f"{'':26} stderr: {e}")
