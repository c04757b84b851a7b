"""Upstream's ``llama.py`` (ExecuTorch 1.4.1, as the wheel ships it) run unmodified against virtual
devices: its evaluators (DefaultEval, SqnrEval, TaskEval in evaluator/device_evaluator.py) reach the
device through SimpleADB, i.e. the adb binary on PATH, as they reach a phone.

``python -m tests.support.llama_py ARGS...`` is llama.py's ``main()`` with ``ARGS`` for its command
line, after the stand-ins of tests/support/missing_modules.py (modules the wheel does not install).
``run_llama_py`` runs it in a child process of its own and returns what llama.py sends its CI over
``--ip``/``--port`` (llama.py:393-394: pte_size, inference_speed, result, sqnr, wiki_ppl, or Error).

The child is given, besides its arguments, only an environment: ``$QNN_SDK_ROOT`` (staged by
farm.selftest.upstream, or llama.py's package import would try to download an SDK), adb on PATH and
the virtual farm's server port (ANDROID_ADB_SERVER_PORT), and every cache inside the test's tmp_path
with the Hugging Face hub offline. lm_eval's HFLM, which TaskEval's wrapper derives from, loads
``gpt2`` before the wrapper replaces its model and tokenizer (eager_eval.py:35): ``stage_hub`` puts a
gpt2 of one layer in that offline hub, so nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from multiprocessing.connection import Listener
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HUB_REVISION = "0" * 40


def stage_hub(hf_home: Path) -> Path:
    """A Hugging Face cache holding a one-layer ``gpt2`` (a byte-level tokenizer, random weights):
    what HFLM reads from the hub in TaskEval's wrapper, whose model and tokenizer it never uses."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    repo = hf_home / "hub" / "models--gpt2"
    snapshot = repo / "snapshots" / HUB_REVISION
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(HUB_REVISION)
    vocab = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    eos = vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                            bos_token="<|endoftext|>").save_pretrained(snapshot)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=1, n_embd=8, n_positions=64, vocab_size=len(vocab),
                               bos_token_id=eos, eos_token_id=eos)).save_pretrained(snapshot)
    return hf_home


def perplexity_task(path: Path, text: Path) -> Path:
    """An lm_eval task over ``text`` (one document), rolling log-likelihood as upstream's wikitext
    task measures it (word_perplexity, byte_perplexity, bits_per_byte). It is named wikitext because
    llama.py reports a task to its CI under that name only (llama.py:373-382); its text is ours."""
    path.write_text(
        "task: wikitext\n"
        "dataset_path: text\n"
        "dataset_kwargs:\n"
        f"  data_files:\n    test: {json.dumps(str(text))}\n"
        "  sample_by: document\n"
        "test_split: test\n"
        "output_type: loglikelihood_rolling\n"
        'doc_to_text: ""\n'
        'doc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n")
    return path


def child_env(tmp: Path, *, qnn_sdk: Path, adb_port: int, adb_env: dict[str, str]) -> dict[str, str]:
    from farm.device.adb_server import adb_binary

    caches = tmp / "caches"
    return {**os.environ, **adb_env, "ANDROID_ADB_SERVER_PORT": str(adb_port), "QNN_SDK_ROOT": str(qnn_sdk),
            "PATH": f"{Path(adb_binary()).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(REPO), "HF_HOME": str(caches / "hf"), "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "XDG_CACHE_HOME": str(caches), "TORCH_HOME": str(caches / "torch"),
            "MPLCONFIGDIR": str(caches / "mpl")}


def run_llama_py(args: list[str], *, env: dict[str, str], cwd: Path, timeout: float = 900) -> dict:
    """llama.py ``args`` in a child; the results it sends over --ip/--port. An AssertionError with
    its output's tail when it fails or sends an error."""
    with Listener(("127.0.0.1", 0)) as listener:
        received: list[str] = []

        def accept() -> None:
            try:
                with listener.accept() as conn:
                    received.append(conn.recv())
            except OSError:  # closed: the child sent nothing
                pass

        waiter = threading.Thread(target=accept, daemon=True)
        waiter.start()
        argv = [sys.executable, "-m", "tests.support.llama_py", *args,
                "--ip", "127.0.0.1", "--port", str(listener.address[1])]
        done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        waiter.join(timeout=10)
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0 and received, f"llama.py exited {done.returncode}:\n{tail}"
    results = json.loads(received[0])
    assert "Error" not in results, f"llama.py: {results['Error']}\n{tail}"
    results["output"] = done.stdout + done.stderr
    return results


def main() -> None:
    sys.path.insert(0, str(REPO))
    from tests.support import missing_modules

    missing_modules.install()
    from executorch.examples.qualcomm.oss_scripts.llama import llama

    sys.argv = [llama.__file__, *sys.argv[1:]]
    llama.main()


if __name__ == "__main__":
    main()
