"""Push throughput to one virtual device: `adb push` (subprocess), adbutils `sync.push`, the farm's
`Device.push`, and a cold `farm.execute.deploy` of a one-file bundle twice: the file pushed whole
(push to a temp name, mv, stat, record) and, for a file at or above the chunk threshold (16 MiB,
farm.execute.chunking), as content-defined chunks through an empty chunk store (cut and hash on the
host, push every chunk, assemble and sha256 on the device), side by side.

    python bench/bench_push.py [--size-mb 200] [--repeat 3]

Prints MB/s of each method (best of --repeat) and their ratios to `adb push`, all measured in this one
run on this machine, so the ratios are meaningful even on a noisy host. Each pushed file is checked
(size on the device; a deploy must also report pushing every byte of it, and the chunked one must have
gone as chunks with none found on the device) and removed, and every cold deploy starts without a
deploy record and with the device's chunk store emptied: the payload's bytes never repeat (a seeded
stream, no 1 MiB block twice), so a store left from the last repeat would make the "cold" deploy a
warm one. Also prints the time of a warm deploy (nothing changed: one probe call).
"""

from __future__ import annotations

import argparse
import posixpath
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from farm.bundle.manifest import Bundle, Mode, describe_file
from farm.device.adb_server import adb_binary
from farm.device.discovery import find_device
from farm.execute import chunkstore
from farm.execute.chunking import PLAIN, ChunkPolicy
from farm.execute.deploy import RECORD_NAME, DeployReport, bundle_workspace, deploy
from farm.virtual import VirtualDeviceSpec, VirtualFarm

CHUNKED = ChunkPolicy()  # the default policy, whatever PTEFARM_CHUNK_MIN_BYTES says in this shell
WHOLE, CHUNKED_ROW, WARM = ("farm deploy (whole file, cold)", "farm deploy (chunked, cold)",
                            "farm deploy (warm)")


def _make_file(path: Path, size: int, seed: int = 0) -> None:
    # Distinct bytes throughout: content-defined chunking would dedupe a repeated block (one 1 MiB
    # block 200 times made a 200 MiB file of ~2 MB of chunks).
    rng = random.Random(seed)
    with open(path, "wb") as f:
        for _ in range(size >> 20):
            f.write(rng.randbytes(1 << 20))


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def clear_chunk_store(device) -> None:
    """Empty the device's chunk store with the store's own listing and removal, and check it is."""
    store = chunkstore.store_dir(device)

    def listing() -> tuple[dict, list[str]]:
        return chunkstore.parse_listing(
            device.shell(chunkstore.listing_command(store), timeout=60, check=True).out)

    stored, strays = listing()
    paths = [s.path for s in stored.values()] + strays
    if paths:
        chunkstore.remove(device, store, paths, timeout=60)
    if any(listing()):
        raise SystemExit(f"device {device.serial}: chunk store {store} not empty after clearing")


def check_cold(name: str, report: DeployReport, size: int, *, chunked: bool) -> None:
    """A cold deploy sent every byte of the file, and by the path its row names."""
    if report.bytes_pushed != size:
        raise SystemExit(f"{name}: pushed {report.bytes_pushed} bytes, not {size}")
    chunks = report.chunks or {}
    if chunked and (chunks.get("files") != 1 or chunks.get("bytes_reused")
                    or chunks.get("chunks_pushed") != chunks.get("chunks")):
        raise SystemExit(f"{name}: not a cold chunked push: {report.summary()}")
    if not chunked and chunks.get("files"):
        raise SystemExit(f"{name}: went as chunks: {report.summary()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    size = args.size_mb << 20
    chunks = CHUNKED.chunks(size)
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
            ws = bundle_workspace(farm_device, bundle)
            record = dev.host_path(posixpath.join(ws, RECORD_NAME))

            def cold_deploy(name: str, policy: ChunkPolicy) -> Callable[[], None]:
                def run() -> None:
                    check_cold(name, deploy(farm_device, bundle, chunking=policy), size,
                               chunked=policy is CHUNKED)
                return run

            # (row, what it times, where it leaves the file, what makes the next run cold)
            methods = [("adb push", adb_cli, dst, None), ("adbutils sync.push", adbutils_sync, dst, None),
                       ("farm Device.push", farm_push, dst, None),
                       (WHOLE, cold_deploy(WHOLE, PLAIN), posixpath.join(ws, "payload.bin"), None)]
            if chunks:
                methods.append((CHUNKED_ROW, cold_deploy(CHUNKED_ROW, CHUNKED),
                                posixpath.join(ws, "payload.bin"),
                                lambda: clear_chunk_store(farm_device)))
            results: dict[str, list[float]] = {name: [] for name, *_ in methods}
            warm: list[float] = []
            for _ in range(args.repeat):  # interleaved, so drift on the host hits all alike
                for name, fn, device_path, make_cold in methods:
                    if make_cold:
                        make_cold()
                    written = dev.host_path(device_path)  # checked from the host
                    seconds = _timed(fn)
                    if written.stat().st_size != size:
                        raise SystemExit(f"{name}: pushed {written.stat().st_size} bytes, not {size}")
                    results[name].append(seconds)
                    if name.startswith("farm deploy"):
                        if name == methods[-1][0]:  # the default policy's deploy again: no change
                            warm.append(_timed(lambda: deploy(farm_device, bundle, chunking=CHUNKED)))
                        record.unlink()  # the next deploy finds no record, so pushes again
                    written.unlink()
            if chunks:
                clear_chunk_store(farm_device)
    mbps = {name: (size / 1e6) / min(times) for name, times in results.items()}
    print(f"push of {args.size_mb} MiB to one virtual device, best of {args.repeat}:")
    for name, rate in mbps.items():
        print(f"  {name:<30} {rate:8.1f} MB/s   (runs: "
              f"{', '.join(f'{t:.2f}s' for t in results[name])})")
    if not chunks:
        print(f"  ({CHUNKED_ROW} not run: {args.size_mb} MiB is below the chunk threshold of "
              f"{CHUNKED.min_file_bytes >> 20} MiB)")
    for name in list(mbps)[1:]:
        print(f"  ratio {name} / adb push: {mbps[name] / mbps['adb push']:.2f}")
    if chunks:
        print(f"  ratio {CHUNKED_ROW} / {WHOLE}: {mbps[CHUNKED_ROW] / mbps[WHOLE]:.2f}")
    print(f"  {WARM[:-1]}, nothing to push): best {min(warm) * 1000:.0f} ms")
    print("summary: " + ", ".join(f"{name} {mbps[name] / mbps['adb push']:.2f}x adb push"
                                  for name in list(mbps)[1:])
          + f"; warm deploy {min(warm) * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
