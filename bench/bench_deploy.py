"""First deploy of a 1 GiB bundle against `adb push` of the same files to the same virtual device;
redeploy of the unchanged bundle; peak RSS of the deploying process.

    python bench/bench_deploy.py [--pte-mb 800] [--lib-mb 96,64,48,16] [--rounds 5] [--link-mbps R]
                                 [--target KEY=LIMIT]

The bundle is synthetic (random bytes: one .pte and a few libraries, a manifest with their sha256) in a
temporary directory under /tmp, deleted at the end. Each round runs, interleaved so drift on a shared
host hits every method alike, against an emptied device directory each time:

- ``adb push``: the bundled adb binary pushing every file in one command (one sync session);
- ``deploy, digests cached``: ``farm.execute.deploy.deploy`` in a fresh process whose bundle was verified first
  (``bundle.load(verify=True)``, untimed), as the pytest plugin calls it (one verify before any lease,
  then a deploy per device that takes the verify's digests);
- ``farm deploy``: ``bundle.load`` (sizes and paths) and ``deploy`` both timed, nothing hashed before: each
  pushed file is hashed as it is streamed and checked at the end of its push (one read of the bundle),
  as ``farm deploy`` and ``farm run`` do;
- ``verify, then deploy``: ``load(verify=True)`` and ``deploy`` both timed: the bundle read twice, once
  to hash it and once to push it (what ``farm deploy`` did before it checked in the push);
- redeploy (in the "cached" process, right after its first deploy): nothing to push.

Every row pushes whole files (``chunking=PLAIN``): this bench measures the push path against adb's;
a chunked deploy's cold and delta costs are bench_delta_deploy.py's.

Unthrottled, the virtual device's side of every push (a Python process writing the file) shares the
host's cores with the pushing process, so whatever the host spends beside the send (hashing a new
bundle) costs wall time that on a phone it would not. ``--link-mbps R`` puts every method behind the
virtual device's link fault at R MB/s (one cable for all its streams, as a phone's USB link: ~35-40 MB/s
for USB 2, a few hundred for USB 3), where the link, not the host's CPU, sets the pace.

Deploy times are taken inside the child (no interpreter start-up), adb's as its whole process. Peak RSS
is the child's own ``ru_maxrss`` (``os.wait4``), interpreter and imports included. MB/s are best-of;
the ratios are medians of per-round ratios, quoted with their spread (min-max) over the rounds.

Targets: ``farm deploy`` >= 0.85x adb push, a deploy with the digests cached >= 0.9x, a redeploy in
< 1 % of the first deploy's time, peak RSS < 200 MB (medians over rounds; the RSS the highest); one
line each says met or MISSED (``--target KEY=LIMIT`` sets one for a run), and the bench exits 1 when
one is missed. Ends with one summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import Spread, Target, add_target_option, judge, print_verdicts, targets_met  # noqa: E402
from benchlib import with_overrides  # noqa: E402

MB = 1 << 20
TARGETS = (
    Target("farm_deploy", "farm deploy of a new bundle (verified in the push), x adb push", ">=", 0.85,
           "x", ".2f"),
    Target("cached", "deploy with the digests cached, x adb push", ">=", 0.9, "x", ".2f"),
    Target("redeploy", "redeploy time, % of the first deploy's", "<", 1.0, " %", ".2f"),
    Target("rss", "peak RSS", "<", 200, " MB", ".0f"),
)


def _child(manifest: str, port: int, serial: str, mode: str) -> None:
    """Runs in the child process: one deploy (and, for "cached", a redeploy); JSON on stdout."""
    from farm.bundle import manifest as bundle_mod
    from farm.config import AdbServerAddress
    from farm.device.discovery import find_device
    from farm.execute.chunking import PLAIN
    from farm.execute.deploy import deploy

    device = find_device([AdbServerAddress("127.0.0.1", port)], serial)
    started = time.perf_counter()
    if mode == "stream":
        bundle = bundle_mod.load(manifest)
    else:
        bundle = bundle_mod.load(manifest, verify=True)
    if mode == "cached":
        started = time.perf_counter()  # the verify is not part of this row
    report = deploy(device, bundle, timeout=120, chunking=PLAIN)
    seconds = time.perf_counter() - started
    result = {"seconds": seconds, "bytes": report.bytes_pushed}
    if mode == "cached":
        again_started = time.perf_counter()
        again = deploy(device, bundle, timeout=120, chunking=PLAIN)
        result.update(redeploy_s=time.perf_counter() - again_started, redeploy_bytes=again.bytes_pushed)
    print(json.dumps(result))


def _run_child(args: list[str]) -> tuple[dict, int]:
    """(its JSON, its peak RSS in bytes)."""
    proc = subprocess.Popen([sys.executable, __file__, "--child", *args], stdout=subprocess.PIPE)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"deploy child {args} exited {proc.returncode}")
    return json.loads(out), usage.ru_maxrss * 1024  # KiB on Linux


def _make_bundle(root: Path, sizes: dict[str, int]):
    from farm.bundle.manifest import Bundle, Mode, describe_file

    chunk = os.urandom(MB)
    for name, size in sizes.items():
        with open(root / name, "wb") as f:
            for i in range(size // MB):  # fresh random bytes per MiB: nothing compresses
                f.write(chunk if i % 2 else os.urandom(MB))
    time.sleep(1.1)  # settled files: their digests may be cached (farm.bundle.manifest.RACY_NS)
    files = [describe_file(root, root / name, role="pte" if name.endswith(".pte") else "other")
             for name in sizes]
    bundle = Bundle(name="bench-deploy", runner_dialect="host", tokenizer=next(iter(sizes)),
                    files=files, modes={"kv": Mode(next(iter(sizes)), 0, 1)})
    bundle.write(root / "manifest.json")
    return bundle


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pte-mb", type=int, default=800)
    parser.add_argument("--lib-mb", default="96,64,48,16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--link-mbps", type=float, default=None,
                        help="the virtual device's link at this rate (MB/s) for every method")
    add_target_option(parser, TARGETS)
    parser.add_argument("--child", nargs=4, metavar=("MANIFEST", "PORT", "SERIAL", "MODE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        manifest, port, serial, mode = args.child
        _child(manifest, int(port), serial, mode)
        return 0
    targets = with_overrides(TARGETS, args.target)

    from farm.device.adb_server import adb_binary
    from farm.device.discovery import find_device
    from farm.virtual import VirtualDeviceSpec, VirtualFarm

    sizes = {"model.pte": args.pte_mb * MB}
    sizes.update({f"lib{i}.so": int(mb) * MB for i, mb in enumerate(args.lib_mb.split(","))})
    total = sum(sizes.values())
    tmp = Path(tempfile.mkdtemp(prefix="bench-deploy-", dir="/tmp"))
    if shutil.disk_usage(tmp).free < 4 * total:
        raise SystemExit(f"{tmp}: needs {4 * total >> 20} MiB free (bundle, device copy, adb copy)")
    try:
        src = tmp / "bundle"
        src.mkdir()
        _make_bundle(src, sizes)
        with VirtualFarm(home=tmp / "farm") as vf:
            (dev,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
            if args.link_mbps:
                vf.set_faults(dev.serial, slow_bytes_per_s=int(args.link_mbps * 1e6))
            device = find_device([vf.adb_server], dev.serial)
            ws = f"{device.workspace}/bench-deploy"
            adb_dir = f"{device.workspace}/adb-push"
            port = str(vf.adb_server.port)

            def wipe() -> None:
                device.shell(f"rm -rf {ws} {adb_dir}", timeout=60, check=True)

            def adb_push() -> tuple[float, int]:
                device.shell(f"mkdir -p {adb_dir}", timeout=60, check=True)
                started = time.perf_counter()
                subprocess.run([adb_binary(), "-P", port, "-s", dev.serial, "push",
                                *(str(src / n) for n in sizes), adb_dir + "/"], check=True,
                               env=vf.server.env(), capture_output=True, timeout=600)
                seconds = time.perf_counter() - started
                du = device.shell(f"cat {adb_dir}/* | wc -c", timeout=60, check=True).out
                if int(du) != total:
                    raise SystemExit(f"adb push wrote {du.strip()} bytes, not {total}")
                return seconds, 0

            rows: dict[str, list[float]] = {}
            rss: dict[str, list[int]] = {}
            redeploy: list[float] = []
            manifest = str(src / "manifest.json")
            for _ in range(args.rounds):
                wipe()
                rows.setdefault("adb push", []).append(adb_push()[0])
                for mode, label in (("cached", "deploy, digests cached"),
                                    ("stream", "farm deploy"),
                                    ("verify", "verify, then deploy")):
                    wipe()
                    result, peak = _run_child([manifest, port, dev.serial, mode])
                    if result["bytes"] != total:
                        raise SystemExit(f"{label}: pushed {result['bytes']} bytes, not {total}")
                    rows.setdefault(label, []).append(result["seconds"])
                    rss.setdefault(label, []).append(peak)
                    if mode == "cached":
                        if result["redeploy_bytes"] != 0:
                            raise SystemExit(f"redeploy pushed {result['redeploy_bytes']} bytes")
                        redeploy.append(result["redeploy_s"] / result["seconds"])
                        rows.setdefault("redeploy (unchanged)", []).append(result["redeploy_s"])
            wipe()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    adb = rows["adb push"]
    print(f"deploy of {total / MB:.0f} MiB ({len(sizes)} files: "
          f"{', '.join(f'{n} {s // MB} MiB' for n, s in sizes.items())}) to one virtual device, "
          f"{args.rounds} interleaved rounds, "
          + (f"link {args.link_mbps:g} MB/s (the virtual device's link fault)" if args.link_mbps
             else "unthrottled (the device's side shares the host's cores)"))
    def x_adb(label: str) -> Spread:  # per round: the rounds interleave, so each shares its load
        return Spread.of(a / t for a, t in zip(adb, rows[label]))

    print(f"  {'method':<24} {'best MB/s':>10} {'x adb median (min-max)':>23} {'peak RSS':>9}   runs")
    for label, times in rows.items():
        runs = ", ".join(f"{t:.3f}s" for t in times)
        if label == "redeploy (unchanged)":
            print(f"  {label:<24} {'0 bytes':>10} {'':>23} {'':>9}   {runs}")
            continue
        peak = f"{max(rss[label]) / MB:.0f} MB" if label in rss else ""
        print(f"  {label:<24} {total / 1e6 / min(times):10.1f} {x_adb(label).format():>23} {peak:>9}"
              f"   {runs}")
    cached, stream = x_adb("deploy, digests cached"), x_adb("farm deploy")
    twice = x_adb("verify, then deploy")
    again = Spread.of(100 * r for r in redeploy)
    peak_mb = max(max(v) for v in rss.values()) / MB
    verdicts = judge([(targets["farm_deploy"], stream.median), (targets["cached"], cached.median),
                      (targets["redeploy"], again.median), (targets["rss"], peak_mb)])
    code = print_verdicts(verdicts)
    print(f"summary: farm deploy of a new bundle (verified in the push) x{stream.format()} adb push "
          f"throughput (verify, then deploy x{twice.format()}), a deploy with the digests cached "
          f"x{cached.format()}, redeploy 0 bytes in {again.format()} % of the first deploy's time, "
          f"peak RSS {peak_mb:.0f} MB; median (min-max) of {args.rounds} round(s); {targets_met(verdicts)}")
    return code


if __name__ == "__main__":
    sys.exit(main())
