"""``--help`` in gflags' layout, so that a host runner's help reads as a phone's qnn_llama_runner's does.

qnn_llama_runner v1.0.1 links gflags v2.2.2-47 (third-party/gflags at a738fdf); its --help
(src/gflags_reporting.cc, ShowUsageWithFlagsMatching and DescribeOneFlag) prints to stdout:

    PROG: USAGE                                   (USAGE: "Warning: SetUsageMessage() never called")
    <blank line> "  Flags from FILE:"             once per defining file, files and flags sorted by name;
                                                  two more blank lines before a file of another directory
    "    -name (description) type: T default: V"  one entry per flag, wrapped below 80 columns

and exits 1. An entry breaks at the last whitespace that keeps its line under 80 characters and
continues on lines indented by six; "type: T", "default: V" and (for a flag given on the command line)
"currently: V" are each moved to a new line when they would not fit. String values are quoted; a
double is printed as %.17g. This module is the layout only (no flag parsing): farm/runner/cli.py
describes its flags with it.
"""

from __future__ import annotations

from typing import NamedTuple


LINE_LENGTH = 80  # gflags' kLineLength: lines stay shorter than this
CONTINUATION = "\n      "
NO_USAGE = "Warning: SetUsageMessage() never called"


class FlagInfo(NamedTuple):
    """What gflags knows of one flag (its CommandLineFlagInfo). A NamedTuple, not a dataclass: the
    runner's zygote client imports this module, and dataclasses costs it ~0.1 s of start-up."""

    name: str
    type: str  # bool, int32, int64, uint64, double, string
    default: object
    description: str
    filename: str

    def value_text(self, value: object) -> str:
        """A value as gflags' FlagValue::ToString prints it."""
        if self.type == "bool":
            return "true" if value else "false"
        if self.type == "double":
            return "%.17g" % float(value)
        return str(value)


def _add(piece: str, out: list[str], column: int) -> int:
    """gflags' AddString: ``piece`` after a space, or on a continuation line if it would reach 80."""
    if column + 1 + len(piece) >= LINE_LENGTH:
        out.append(CONTINUATION)
        column = len(CONTINUATION) - 1
    else:
        out.append(" ")
        column += 1
    out.append(piece)
    return column + len(piece)


def _quoted(flag: FlagInfo, label: str, value: object) -> str:
    text = flag.value_text(value)
    return f'{label}: "{text}"' if flag.type == "string" else f"{label}: {text}"


def describe_flag(flag: FlagInfo, current: object = None, is_default: bool = True) -> str:
    """One flag's entry, ending in a newline (gflags' DescribeOneFlag)."""
    rest = f"    -{flag.name} ({flag.description})"
    out: list[str] = []
    column = 0
    while True:
        newline = rest.find("\n")
        if newline < 0 and column + len(rest) < LINE_LENGTH:
            out.append(rest)  # the remainder fits on this line
            column += len(rest)
            break
        if 0 <= newline < LINE_LENGTH - column:
            out.append(rest[:newline])
            rest = rest[newline + 1 :]
        else:
            # The last whitespace that keeps this line under 80 characters.
            cut = LINE_LENGTH - column - 1
            while cut > 0 and not rest[cut].isspace():
                cut -= 1
            if cut <= 0:  # one unbreakable word: the rest goes out whole
                out.append(rest)
                column = LINE_LENGTH
                break
            out.append(rest[:cut])
            column += cut
            while cut < len(rest) and rest[cut].isspace():
                cut += 1
            rest = rest[cut:]
        if not rest:
            break
        out.append(CONTINUATION)
        column = len(CONTINUATION) - 1
    column = _add(f"type: {flag.type}", out, column)
    column = _add(_quoted(flag, "default", flag.default), out, column)
    if not is_default:
        _add(_quoted(flag, "currently", current), out, column)
    return "".join(out) + "\n"


def _dirname(filename: str) -> str:
    return filename.rsplit("/", 1)[0] if "/" in filename else ""


def usage(prog: str, flags: list[FlagInfo], given: dict[str, object] | None = None,
          message: str = NO_USAGE) -> str:
    """The whole ``--help`` text (gflags' ShowUsageWithFlagsMatching with no restriction).
    ``given``: the flags set on the command line and their values (printed as "currently")."""
    given = given or {}
    lines = [f"{prog.rsplit('/', 1)[-1]}: {message}\n"]
    last_file: str | None = None
    first_directory = True
    for flag in sorted(flags, key=lambda f: (f.filename, f.name)):
        if flag.filename != last_file:
            if _dirname(flag.filename) != _dirname(last_file or ""):
                if not first_directory:
                    lines.append("\n\n")  # blank lines between directories
                first_directory = False
            lines.append(f"\n  Flags from {flag.filename}:\n")
            last_file = flag.filename
        lines.append(describe_flag(flag, given.get(flag.name), flag.name not in given))
    return "".join(lines)
