"""Ten runs of a ~500 MB bundle on one virtual device: upstream's flow against the farm's.

    python bench/bench_upstream_flow.py [--runs 10] [--padding-mb 500]

Upstream's flow is the one of ExecuTorch's ``SimpleADB`` (examples/qualcomm/utils.py), one ``adb``
process per step, every run: ``adb shell rm -rf`` the workspace and ``mkdir -p`` it, one ``adb push``
per artifact, ``adb shell`` the runner command, ``adb pull`` the output folder. The farm's flow:
``farm.execute.deploy.deploy`` (pushes only what the device lacks: the first run everything, then nothing) and
``farm.execute.run.run`` (runner, outputs read back over sync), in one process.

The run: the fake ``qnn_llama_runner`` of tests/support/devices.py (a Python script that writes its
outputs and exits; no model is loaded) on a bundle of small fake .pte files plus a ``padding.bin`` of
--padding-mb MiB that brings the bundle to the size of a real one: a measure of the flow's overhead,
not of inference. Both flows run the same runner command line (``farm.execute.runprofile.build_command``).
Runs are interleaved (upstream run i, farm run i, ...). Files live in a temp dir under /tmp, removed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MB = 1 << 20


def _make_bundle(root: Path, padding_mb: int):
    from farm.bundle import manifest as bundle_mod
    from farm.bundle.manifest import describe_file
    from tests.support.devices import make_qnn_bundle

    manifest = make_qnn_bundle(root, name="upstream-flow", archs=("v75",))
    with open(root / "padding.bin", "wb") as f:
        for _ in range(padding_mb):
            f.write(os.urandom(MB))
    time.sleep(1.1)  # settled, so its digest is cached once computed (farm.bundle.manifest.RACY_NS)
    bundle = bundle_mod.load(manifest)
    bundle.files.append(describe_file(root, root / "padding.bin", role="other"))
    bundle.write(manifest)
    return bundle_mod.load(manifest, verify=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--padding-mb", type=int, default=500)
    args = parser.parse_args()

    from farm.device.adb_server import adb_binary
    from farm.device.discovery import find_device
    from farm.execute.deploy import deploy
    from farm.execute.run import new_out_name, run
    from farm.execute.runprofile import RunRequest, build_command
    from farm.virtual import VirtualDeviceSpec, VirtualFarm

    tmp = Path(tempfile.mkdtemp(prefix="bench-upstream-", dir="/tmp"))
    if shutil.disk_usage(tmp).free < 4 * args.padding_mb * MB:
        raise SystemExit(f"{tmp}: needs {4 * args.padding_mb} MiB free")
    try:
        bundle = _make_bundle(tmp / "bundle", args.padding_mb)
        files = bundle.files_for("v75")
        total = sum(f.size for f in files)
        request = RunRequest(prompts=["What is the capital of France?"])
        with VirtualFarm(home=tmp / "farm") as vf:
            (dev,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
            device = find_device([vf.adb_server], dev.serial)
            upstream_ws = f"{device.workspace}/upstream-ws"
            env = vf.server.env()

            def adb(*argv: str) -> None:
                subprocess.run([adb_binary(), "-P", str(vf.adb_server.port), "-s", dev.serial, *argv],
                               check=True, env=env, capture_output=True, timeout=600)

            def upstream(i: int) -> None:
                adb("shell", f"rm -rf {upstream_ws}")
                adb("shell", f"mkdir -p {upstream_ws}")
                for f in files:
                    adb("push", str(f.path), f"{upstream_ws}/{f.name}")
                command = build_command(bundle, request, upstream_ws, new_out_name())
                adb("shell", f"chmod 755 {upstream_ws}/{bundle.runner} && {command.shell}")
                out = tmp / "upstream-out" / str(i)
                out.mkdir(parents=True)
                adb("pull", "-a", command.out_dir, str(out))
                if not list(out.rglob("outputs.txt")):
                    raise SystemExit(f"upstream run {i}: no outputs pulled")

            def farm(i: int) -> None:
                deploy(device, bundle, timeout=120)
                result = run(device, bundle, request, timeout=120, local_dir=tmp / "farm-out" / str(i))
                if result.exit_code != 0 or not result.text:
                    raise SystemExit(f"farm run {i}: exit {result.exit_code}, no outputs")

            device.shell(f"rm -rf {device.workspace}/{bundle.name}", timeout=60, check=True)
            times: dict[str, list[float]] = {"upstream (SimpleADB)": [], "farm (deploy + run)": []}
            for i in range(args.runs):
                for (label, fn) in zip(times, (upstream, farm)):
                    started = time.perf_counter()
                    fn(i)
                    times[label].append(time.perf_counter() - started)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"{args.runs} runs of a {total / MB:.0f} MiB bundle ({len(files)} files, fake qnn runner + "
          f"{args.padding_mb} MiB padding) on one virtual device, interleaved")
    print(f"  {'flow':<22} {'total s':>8} {'run 1 s':>8} {'runs 2.. median s':>18}")
    for label, ts in times.items():
        print(f"  {label:<22} {sum(ts):8.2f} {ts[0]:8.3f} {statistics.median(ts[1:] or ts):18.3f}")
    up, fa = (sum(ts) for ts in times.values())
    steady = statistics.median(a / b for a, b in zip(*(ts[1:] for ts in times.values())))
    print(f"summary: upstream / farm wall time over {args.runs} runs {up / fa:.1f}x "
          f"(per warm run {steady:.1f}x; the farm pushed the bundle once, upstream {args.runs} times)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
