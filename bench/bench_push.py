"""Push throughput to one virtual device: `adb push` (subprocess), adbutils `sync.push`, the farm's
`Device.push` and a cold `farm.execute.deploy` of a one-file bundle (push to a temp name, mv, stat, record),
side by side.

    python bench/bench_push.py [--size-mb 200] [--repeat 3]

Prints MB/s of each method (best of --repeat) and their ratios to `adb push`, all measured in this one
run on this machine, so the ratios are meaningful even on a noisy host. Each pushed file is checked
(size) and removed. Also prints the time of a warm deploy (nothing changed: one stat call).
"""

from __future__ import annotations

import argparse
import os
import posixpath
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from farm.bundle.manifest import Bundle, Mode, describe_file
from farm.device.adb_server import adb_binary
from farm.device.discovery import find_device
from farm.execute.deploy import deploy
from farm.virtual import VirtualDeviceSpec, VirtualFarm


def _make_file(path: Path, size: int) -> None:
    chunk = os.urandom(1 << 20)
    with open(path, "wb") as f:
        f.writelines(chunk for _ in range(size >> 20))


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    size = args.size_mb << 20
    with tempfile.TemporaryDirectory(prefix="bench-push-") as tmp:
        src = Path(tmp) / "payload.bin"
        _make_file(src, size)
        with VirtualFarm(home=Path(tmp) / "farm") as vf:
            (dev,) = vf.up([VirtualDeviceSpec(soc="SM8650")])
            device = vf.client().device(dev.serial)
            dst = posixpath.join(dev.workspace, "payload.bin")  # a device path (Android, if confined)
            env = vf.server.env()

            def adb_cli() -> None:
                subprocess.run([adb_binary(), "-P", str(vf.adb_server.port), "-s", dev.serial,
                                "push", str(src), str(dst)], check=True, env=env,
                               capture_output=True, timeout=600)

            def adbutils_sync() -> None:
                device.sync.push(src, str(dst))

            farm_device = find_device([vf.adb_server], dev.serial)

            def farm_push() -> None:
                with open(src, "rb") as f:
                    farm_device.push(f, str(dst))

            bundle = Bundle(name="bench", runner_dialect="host", tokenizer="payload.bin",
                            files=[describe_file(Path(tmp), src, role="pte")],
                            modes={"kv": Mode("payload.bin", 0, 1)})
            record = dev.host_path(posixpath.join(dev.workspace, "bench", ".ptefarm-deploy.json"))

            def farm_deploy() -> None:
                report = deploy(farm_device, bundle)
                if report.bytes_pushed != size:
                    raise SystemExit(f"farm deploy pushed {report.bytes_pushed} bytes, not {size}")

            # Where each method leaves the file (checked, then removed for the next cold run).
            methods = (("adb push", adb_cli, dst), ("adbutils sync.push", adbutils_sync, dst),
                       ("farm Device.push", farm_push, dst),
                       ("farm deploy (cold)", farm_deploy,
                        posixpath.join(dev.workspace, "bench", "payload.bin")))
            results: dict[str, list[float]] = {name: [] for name, _, _ in methods}
            for _ in range(args.repeat):  # interleaved, so drift on the host hits all alike
                for name, fn, device_path in methods:
                    written = dev.host_path(device_path)  # checked from the host
                    seconds = _timed(fn)
                    if written.stat().st_size != size:
                        raise SystemExit(f"{name}: pushed {written.stat().st_size} bytes, not {size}")
                    results[name].append(seconds)
                    if name == "farm deploy (cold)":
                        warm = _timed(lambda: deploy(farm_device, bundle))  # one stat call
                        results.setdefault("farm deploy (warm)", []).append(warm)
                        record.unlink()
                    written.unlink()
    warm = results.pop("farm deploy (warm)")
    mbps = {name: (size / 1e6) / min(times) for name, times in results.items()}
    print(f"push of {args.size_mb} MiB to one virtual device, best of {args.repeat}:")
    for name, rate in mbps.items():
        print(f"  {name:<22} {rate:8.1f} MB/s   (runs: "
              f"{', '.join(f'{t:.2f}s' for t in results[name])})")
    for name in list(mbps)[1:]:
        print(f"  ratio {name} / adb push: {mbps[name] / mbps['adb push']:.2f}")
    print(f"  farm deploy (warm, nothing to push): best {min(warm) * 1000:.0f} ms")
    print("summary: " + ", ".join(f"{name} {mbps[name] / mbps['adb push']:.2f}x adb push"
                                  for name in list(mbps)[1:])
          + f"; warm deploy {min(warm) * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
