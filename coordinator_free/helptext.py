"""How every subcommand's --help is laid out: prose wrapped to the terminal, and the examples
it ends with kept as written (a leaf module: the peer's parser uses it too)."""

from __future__ import annotations

import argparse
import textwrap


class HelpFormatter(argparse.HelpFormatter):
    """Wraps each line of prose to the terminal; keeps indented lines (examples) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for line in text.splitlines():
            if not line.strip() or line[0].isspace():
                out.append(indent + line)
            else:
                out.append(
                    textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent)
                )
        return "\n".join(out)


def examples(*lines: str) -> dict:
    """``add_parser`` keywords ending a subcommand's --help with its examples (commands that
    run as written from the repository root; tests/test_docs_commands.py runs them)."""
    return {
        "epilog": "examples:\n" + "\n".join(f"  {line}" for line in lines),
        "formatter_class": HelpFormatter,
    }
