"""Fixtures: the exported reference bundle (cached by content, so only the first run exports)."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest


def weights_for(manifest: Path):
    """The reference model's weights, rebuilt from the config recorded in the manifest."""
    from farm.model.llama import LlamaConfig, LlamaWeights

    model = json.loads(Path(manifest).read_text())["model"]
    names = {f.name for f in fields(LlamaConfig)}
    return LlamaWeights(LlamaConfig(**{k: v for k, v in model.items() if k in names})).eval()


@pytest.fixture(scope="session")
def tiny_bundle() -> Path:
    """Manifest path of the `tiny` reference bundle."""
    from farm.bundle.export import export_bundle

    return export_bundle("tiny")


@pytest.fixture(scope="session")
def tiny_weights(tiny_bundle):
    return weights_for(tiny_bundle)


@pytest.fixture(scope="session")
def qwen_bundle() -> Path:
    """Manifest path of the `tiny-qwen2_5` reference bundle (qwen2_5, HF tokenizer.json): the second
    family the main job qualifies."""
    from farm.bundle.export import export_bundle

    return export_bundle("tiny-qwen2_5")


@pytest.fixture(scope="session")
def qwen_weights(qwen_bundle):
    return weights_for(qwen_bundle)


@pytest.fixture(scope="session")
def stories_bundle() -> Path:
    """Manifest path of the `tiny-stories` reference bundle (llama2, a llama2c tokenizer.bin exported
    from a SentencePiece model): the third family the main job qualifies."""
    from farm.bundle.export import export_bundle

    return export_bundle("tiny-stories")


@pytest.fixture(scope="session")
def stories_weights(stories_bundle):
    return weights_for(stories_bundle)


def rebuilt_copy(manifest: Path, dest: Path, name: str) -> Path:
    """The bundle as a rebuild of the same model would be: every program the same graph and weights,
    yet other bytes (a marker after the program's end, which the runtime never reads), so its
    files have other digests, as a pull request's fresh build has. Returns the copy's manifest."""
    import dataclasses
    import shutil

    from farm.bundle.manifest import describe_file, load

    bundle = load(manifest)
    src = Path(manifest).resolve().parent
    shutil.copytree(src, dest)
    files = []
    for f in bundle.files:
        path = dest / f.path.relative_to(src)
        if f.role == "pte":
            with open(path, "ab") as out:
                out.write(f"rebuilt as {name}".encode())
        files.append(describe_file(dest, path, role=f.role, name=f.name, htp_arch=f.htp_arch))
    copy = dataclasses.replace(bundle, name=name, files=files)
    copy.write(dest / "manifest.json")
    return dest / "manifest.json"
