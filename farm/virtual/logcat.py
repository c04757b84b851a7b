"""``logcat`` and ``log`` of a virtual device, run inside it (``/system/bin/logcat`` and ``/system/bin/log``
exec ``python -S -m farm.virtual.logcat logcat|log ARGS``). They talk to the device's logd
(farm/virtual/logd.py) over ``/dev/socket/logd``; the filtering and the output formats are logcat's
own (liblog's logprint.cpp), so a script that parses a phone's ``logcat -v threadtime`` parses these.

logcat: ``-d`` dump and exit, ``-c`` clear, ``-b BUF`` (main, system, crash, all, default; repeatable,
comma lists), ``-v FORMAT`` (threadtime [default], brief, time, tag, process, raw), ``-t N|TIME``
(the last N lines or those since TIME, implies -d), ``-T N|TIME`` (same, then follows), ``-s`` (``*:S``),
``-g`` (buffer sizes), ``-f FILE``, ``--pid=N``, and filter specs ``TAG[:PRIO]`` (``*:S`` silences
the rest; ``ANDROID_LOG_TAGS`` when none is given). Without -d it follows until killed.
log (toybox): ``log [-b BUFFER] [-p PRI] [-t TAG] MESSAGE...``.

Standard library only (-S): this is every logcat's start-up.
"""

from __future__ import annotations

import getopt
import json
import os
import sys
import time

from farm.virtual.logwire import BUFFERS, DEFAULT_BUFFERS, PRIORITIES, connect

SOCKET_ENV = "PTEFARM_LOGD_SOCKET"
DEFAULT_SOCKET = "/dev/socket/logd"
FORMATS = ("threadtime", "brief", "time", "tag", "process", "raw", "long")
# -v modifiers a script may pass; accepted, and the ones that change nothing here are ignored.
MODIFIERS = ("color", "descriptive", "epoch", "monotonic", "printable", "uid", "usec", "UTC", "year",
             "zone", "nsec")


class Usage(Exception):
    """Bad arguments: logcat's message, exit 1."""


def _socket() -> str:
    return os.environ.get(SOCKET_ENV, DEFAULT_SOCKET)


def logd_request(request: dict):
    """The daemon's answers to one request, one dict per line."""
    with connect(_socket()) as sock:
        sock.sendall(json.dumps(request).encode() + b"\n")
        if request.get("follow"):
            sock.settimeout(None)
        with sock.makefile("rb") as f:
            for line in f:
                answer = json.loads(line)
                if "error" in answer:
                    raise Usage(answer["error"])
                yield answer


# --- filters (logprint.cpp: android_log_addFilterRule) ---------------------------------------------
def priority(letter: str) -> int:
    """V D I W E F S (any case) or 2-8 -> Android's priority."""
    if len(letter) == 1 and letter.upper() in PRIORITIES[2:]:
        return PRIORITIES.index(letter.upper())
    if letter.isdigit() and 2 <= int(letter) <= 8:
        return int(letter)
    raise Usage(f"Invalid filter expression priority '{letter}'")


class Filter:
    def __init__(self) -> None:
        self.default = 2           # *:V
        self.tags: dict[str, int] = {}

    def add(self, spec: str) -> None:
        """``TAG:PRIO``; ``TAG`` alone is ``TAG:V``, ``*`` alone is ``*:D`` (as logprint does)."""
        tag, colon, prio = spec.rpartition(":")
        if not colon:
            tag, prio = spec, ""
        if not tag:
            raise Usage(f"Invalid filter expression '{spec}'")
        level = priority(prio) if prio else (3 if tag == "*" else 2)
        if tag == "*":
            self.default = level
        else:
            self.tags[tag] = level

    def shows(self, tag: str, prio: int) -> bool:
        return prio >= self.tags.get(tag, self.default)


# --- formats (logprint.cpp: android_log_formatLogLine) ----------------------------------------------
def format_entry(e: dict, fmt: str) -> str:
    when = e["time"]
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(when)) + f".{int(when % 1 * 1000):03d}"
    p = PRIORITIES[e["prio"]]
    tag = e["tag"]
    if fmt == "long":
        return f"[ {stamp} {e['pid']:5d}:{e['tid']:5d} {p}/{tag:<8s} ]\n{e['msg']}\n\n"
    prefix, suffix = {
        "threadtime": (f"{stamp} {e['pid']:5d} {e['tid']:5d} {p} {tag:<8s}: ", ""),
        "brief": (f"{p}/{tag:<8s}({e['pid']:5d}): ", ""),
        "time": (f"{stamp} {p}/{tag:<8s}({e['pid']:5d}): ", ""),
        "tag": (f"{p}/{tag:<8s}: ", ""),
        "process": (f"{p}({e['pid']:5d}) ", f"  ({tag})"),
        "raw": ("", ""),
    }[fmt]
    # One output line per line of the message, each with the prefix.
    return "".join(f"{prefix}{line}{suffix}\n" for line in e["msg"].split("\n"))


def parse_time(value: str) -> float:
    """-t/-T's time: ``MM-DD HH:MM:SS.mmm`` (this year), ``YYYY-MM-DD HH:MM:SS.mmm`` or epoch seconds."""
    try:
        if " " not in value and "-" not in value:
            return float(value)
        day, _, clock = value.strip().partition(" ")
        if day.count("-") == 1:
            day = f"{time.localtime().tm_year}-{day}"
        whole, _, frac = clock.partition(".")
        base = time.mktime(time.strptime(f"{day} {whole}", "%Y-%m-%d %H:%M:%S"))
        return base + (float(f"0.{frac}") if frac else 0.0)
    except ValueError:
        raise Usage(f"unable to parse time '{value}'") from None


def _count_or_time(value: str) -> dict:
    return {"tail": int(value)} if value.isdigit() else {"since": parse_time(value)}


def logcat(argv: list[str]) -> int:
    try:
        opts, specs = getopt.gnu_getopt(argv, "cdgsb:v:t:T:f:", ["pid=", "buffer=", "format=",
                                                                  "clear", "dump"])
    except getopt.GetoptError as e:
        raise Usage(str(e)) from None
    buffers: list[str] = []
    fmt = "threadtime"
    dump = clear = sizes = False
    window: dict = {}
    pid: int | None = None
    out_path: str | None = None
    filt = Filter()
    silent = False
    for opt, value in opts:
        if opt in ("-d", "--dump"):
            dump = True
        elif opt in ("-c", "--clear"):
            clear = True
        elif opt == "-g":
            sizes = True
        elif opt == "-s":
            silent = True
        elif opt in ("-b", "--buffer"):
            for name in value.split(","):
                if name == "all":
                    buffers += list(BUFFERS)
                elif name == "default":
                    buffers += list(DEFAULT_BUFFERS)
                elif name in BUFFERS:
                    buffers.append(name)
                elif name in ("radio", "events", "kernel", "stats", "security"):
                    continue  # buffers a phone has and this device never writes: empty here
                else:
                    raise Usage(f"unknown buffer '{name}'")
        elif opt in ("-v", "--format"):
            for word in value.split(","):
                if word in FORMATS:
                    fmt = word
                elif word not in MODIFIERS:
                    raise Usage(f"Invalid parameter '{word}' to -v")
        elif opt == "-t":
            window = _count_or_time(value)
            dump = True
        elif opt == "-T":
            window = _count_or_time(value)
        elif opt == "--pid":
            if not value.isdigit():
                raise Usage(f"--pid={value}: not a process id")
            pid = int(value)
        elif opt == "-f":
            out_path = value
    buffers = list(dict.fromkeys(buffers)) or list(DEFAULT_BUFFERS)
    if silent:
        filt.default = 8
    if not specs and os.environ.get("ANDROID_LOG_TAGS"):
        specs = os.environ["ANDROID_LOG_TAGS"].split()
    for spec in specs:
        filt.add(spec)
    if clear:
        for _ in logd_request({"op": "clear", "buffers": buffers}):
            pass
        return 0
    if sizes:
        for answer in logd_request({"op": "size", "buffers": buffers}):
            limit = answer["limit"] // 1024
            for name, used in answer["sizes"].items():
                print(f"{name}: ring buffer is {limit} KiB ({(used + 1023) // 1024} KiB consumed), "
                      f"max entry is 5120 B, max payload is 4068 B")
        return 0
    out = open(out_path, "a", encoding="utf-8") if out_path else sys.stdout  # noqa: SIM115
    seen: set[str] = set()
    try:
        for e in logd_request({"op": "read", "buffers": buffers, "follow": not dump, **window}):
            if pid is not None and e["pid"] != pid:
                continue
            if not filt.shows(e["tag"], e["prio"]):
                continue
            if e["buffer"] not in seen:
                seen.add(e["buffer"])
                out.write(f"--------- beginning of {e['buffer']}\n")
            out.write(format_entry(e, fmt))
            if not dump:
                out.flush()
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def log(argv: list[str]) -> int:
    """toybox's log: ``-p`` priority (letter or name), ``-t`` tag (default "log"), ``-b`` buffer."""
    try:
        opts, words = getopt.getopt(argv, "b:p:t:")
    except getopt.GetoptError as e:
        raise Usage(str(e)) from None
    tag, prio, buffer = "log", 4, "main"
    for opt, value in opts:
        if opt == "-t":
            tag = value
        elif opt == "-p":
            prio = priority(value[:1])
        elif opt == "-b":
            if value not in BUFFERS:
                raise Usage(f"unknown buffer '{value}'")
            buffer = value
    message = " ".join(words) if words else sys.stdin.read().rstrip("\n")
    for _ in logd_request({"op": "write", "buffer": buffer, "prio": prio, "tag": tag, "msg": message,
                       "pid": os.getpid(), "tid": os.getpid()}):
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    tool, args = (argv[0], argv[1:]) if argv else ("logcat", [])
    try:
        return log(args) if tool == "log" else logcat(args)
    except Usage as e:
        print(f"{tool}: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `logcat | head`
        return 0
    except OSError as e:
        print(f"{tool}: cannot reach logd at {_socket()}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
