"""Correctness: SmartMask and ShiftPointer give identical tokens at temperature 0 (and, in kv mode,
identical logits), lookahead decoding writes hybrid mode's greedy tokens, and outputs start with their
golden prefixes where a bundle has them. Cases: suites/data/correctness.toml (or --farm-cases)."""

from __future__ import annotations

import pytest

from farm.errors import UsageError
from farm.model.template import format_prompt
from farm.bundle.tokens import check_prompt_fits, context_len
from farm.results.checks import golden_ids_mismatch, golden_text_mismatch, lookahead_mismatch
from farm.vocab import Dialect, EvalMode
from ptefarm_fixtures import ensure_run
from ptefarm_suites.cases import golden_for

from ._data import bundle_goldens, correctness_points

ASSISTANT_HEADER = "<|start_header_id|>assistant<|end_header_id|>\n\n"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "point" not in metafunc.fixturenames:
        return
    if ensure_run(metafunc.config).bundle.multimodal is not None:
        reason = ("a multimodal bundle: its text-only cases do not apply; suites/test_multimodal.py checks "
                  "it against its goldens in every mode")
        metafunc.parametrize("point", [pytest.param(None, id="multimodal", marks=pytest.mark.skip(reason=reason))])
        return
    points = correctness_points(metafunc.config)
    if metafunc.definition.originalname == "test_matches_golden":
        goldens = bundle_goldens(metafunc.config)
        points = [p for p in points if golden_for(goldens, p.case.name, p.mode)]
        if not points:
            reason = "no golden prefix for any case (goldens.toml beside the manifest, or --farm-goldens)"
            metafunc.parametrize("point", [pytest.param(None, id="no-goldens",
                                                        marks=pytest.mark.skip(reason=reason))])
            return
    if metafunc.definition.originalname == "test_lookahead_matches_hybrid":
        modes = ensure_run(metafunc.config).bundle.modes
        points = [p for p in points if modes[p.mode].eval_mode == EvalMode.LOOKAHEAD.number]
        if not points or not any(m.eval_mode == EvalMode.HYBRID.number for m in modes.values()):
            reason = "the bundle has no lookahead mode (eval_mode 2) and hybrid mode to compare"
            metafunc.parametrize("point", [pytest.param(None, id="no-lookahead",
                                                        marks=pytest.mark.skip(reason=reason))])
            return
    if metafunc.definition.originalname == "test_kv_matches_hybrid":
        modes = ensure_run(metafunc.config).bundle.modes
        points = [p for p in points if modes[p.mode].eval_mode == EvalMode.KV.number]
        if not points or not any(m.eval_mode == EvalMode.HYBRID.number for m in modes.values()):
            reason = "the bundle has no kv mode (eval_mode 0) and hybrid mode to compare"
            metafunc.parametrize("point", [pytest.param(None, id="no-kv-and-hybrid",
                                                        marks=pytest.mark.skip(reason=reason))])
            return
    bundle = ensure_run(metafunc.config).bundle
    metafunc.parametrize("point", [pytest.param(p, id=p.id, marks=_marks(p, bundle, metafunc))
                                   for p in points])


def _marks(point, bundle, metafunc: pytest.Metafunc) -> list:
    marks = [pytest.mark.gate] if point.case.gate else []
    if point.past_context:
        if bundle.modes[point.mode].attention_sink_rope is None:
            marks.append(pytest.mark.skip(reason=f"seq_len {point.seq_len} is past the context and mode "
                                          f"{point.mode!r} has no attention-sink evictor "
                                          f"('attention_sink_rope' in the manifest)"))
        elif metafunc.definition.originalname == "test_lookahead_matches_hybrid":
            # Lookahead steps are wider than hybrid's decode steps, so the runner evicts at other
            # positions and the two generations part after the first eviction, by design.
            marks.append(pytest.mark.skip(reason="past the context lookahead and hybrid mode evict at "
                                          "different positions (their decode steps differ in width)"))
    return marks


def skip_without_sink(llm, point) -> None:
    """A point past the context needs --attention_sink_rope_path, which v1.0.1's runner lacks."""
    if point.past_context and llm.dialect == Dialect.QNN_V1_0:
        pytest.skip(f"seq_len {point.seq_len} is past the context: runner dialect 'qnn-v1.0' has no "
                    "attention sink (--attention_sink_rope_path, added in v1.1)")


def generated_text(text: str | None, prompt: str | None = None, version: str | None = None,
                   upstream: str = "v1.0.1") -> str:
    """outputs.txt echoes the prompt as the bundle's family formats it (qnn_llama_runner.cpp
    get_formatted_prompt, of the ``upstream`` release the runner's dialect speaks); the generation
    follows it. Without the prompt: what follows the last llama3 assistant header."""
    text = text or ""
    if prompt is not None and version is not None:
        echo = format_prompt(prompt, "", version, upstream)
        if text.startswith(echo):
            return text[len(echo):]
    return text.rpartition(ASSISTANT_HEADER)[2] if ASSISTANT_HEADER in text else text


@pytest.mark.release
def test_updaters_agree(llm, point):
    skip_without_sink(llm, point)
    if len(llm.updaters) < 2:
        pytest.skip(f"runner dialect {llm.bundle.runner_dialect!r} has only {llm.updaters[0]}: "
                    "nothing to compare (test_matches_golden checks it against goldens)")
    prompt = point.prompt(llm.bundle)
    llm.record("case", point.case.name)
    llm.record("prompt", prompt[:500])
    comparison = llm.compare(prompt, mode=point.mode, seq_len=point.seq_len)
    divergence = comparison.first_divergence()
    unit = "token" if comparison.compared_by == "token ids" else "text byte"
    llm.record("first_divergence", "-" if comparison.agree else
               "empty output" if divergence is None else f"{unit} {divergence}")
    if not comparison.agree:
        version = llm.bundle.decoder_model_version
        tails = "\n".join(f"  {u}: {generated_text(r.text, prompt, version, llm.dialect.templates)[:200]!r}"
                          for u, r in comparison.results.items())
        pytest.fail(f"{comparison.explain()}\ncontinuations:\n{tails}", pytrace=False)


@pytest.mark.release
def test_lookahead_matches_hybrid(llm, point):
    """Lookahead decoding (eval_mode 2) is an exact speed-up: at temperature 0 it must write every
    token hybrid mode's greedy decoding writes, with the same updater."""
    hybrid = next(name for name, m in sorted(llm.bundle.modes.items())
                  if m.eval_mode == EvalMode.HYBRID.number)
    prompt = point.prompt(llm.bundle)
    # Both runs end at the same seq_len: the lookahead cache holds decode_ar_len fewer entries.
    seq_len = min(point.seq_len, context_len(llm.bundle) - llm.bundle.modes[point.mode].decode_ar_len)
    check_prompt_fits(llm.bundle, prompt, hybrid, seq_len, what=f"case {point.case.name!r}")
    llm.record("case", point.case.name)
    updater = llm.updaters[0]
    expected = llm.generate(prompt, updater=updater, mode=hybrid, seq_len=seq_len)
    got = llm.generate(prompt, updater=updater, mode=point.mode, seq_len=seq_len)
    if expected.generated_ids is not None and got.generated_ids is not None:
        problem = lookahead_mismatch(expected.generated_ids, got.generated_ids,
                                     llm.bundle.modes[point.mode].ngram or 1)
    else:  # a runner that writes no token ids: the text, which may run on by one step's tokens
        version = llm.bundle.decoder_model_version
        want = generated_text(expected.text, prompt, version, llm.dialect.templates)
        problem = golden_text_mismatch(generated_text(got.text, prompt, version, llm.dialect.templates),
                                       want) if want \
            else "hybrid mode generated no text: nothing to check lookahead decoding against"
        problem = problem and f"lookahead decoding against hybrid mode's text: {problem}"
    assert problem is None, f"{problem} ({updater}, on {llm.device.serial})"


@pytest.mark.release
def test_kv_matches_hybrid(llm, point):
    """Where the runner has one updater (qnn-v1.4: nothing to compare the updaters with), its two
    programs are compared instead: at temperature 0 the kv program (one token a step) and the hybrid
    program (the prompt in chunks, then the same decode) must write the same tokens for a case."""
    if len(llm.updaters) > 1:
        pytest.skip(f"runner dialect {llm.bundle.runner_dialect!r} has both updaters: test_updaters_agree "
                    "compares the two in every mode")
    skip_without_sink(llm, point)
    hybrid = next(name for name, m in sorted(llm.bundle.modes.items())
                  if m.eval_mode == EvalMode.HYBRID.number)
    prompt = point.prompt(llm.bundle)
    if point.past_context and llm.bundle.modes[hybrid].attention_sink_rope is None:
        pytest.skip(f"seq_len {point.seq_len} is past the context and mode {hybrid!r} has no "
                    "attention-sink evictor: nothing to compare kv mode with")
    try:  # a case sized for kv mode ('long': the longest prompt kv takes) may not fit hybrid's chunks
        check_prompt_fits(llm.bundle, prompt, hybrid, point.seq_len, what=f"case {point.case.name!r}")
    except UsageError as e:
        pytest.skip(f"{e}: nothing to compare kv mode with")
    llm.record("case", point.case.name)
    updater = llm.updaters[0]
    kv = llm.generate(prompt, updater=updater, mode=point.mode, seq_len=point.seq_len)
    other = llm.generate(prompt, updater=updater, mode=hybrid, seq_len=point.seq_len)
    if kv.generated_ids is not None and other.generated_ids is not None:
        same, what = kv.generated_ids == other.generated_ids, "token ids"
    else:  # a runner that writes no token ids: the text after the echo
        version, upstream = llm.bundle.decoder_model_version, llm.dialect.templates
        a, b = (generated_text(r.text, prompt, version, upstream) for r in (kv, other))
        same, what = a == b, "text"
        if not a:
            pytest.fail("kv mode generated no text: nothing to compare hybrid mode with", pytrace=False)
    if not same:
        pytest.fail(f"kv and hybrid mode write different {what} for case {point.case.name!r} "
                    f"(seq_len {point.seq_len}, {updater}, on {llm.device.serial}):\n"
                    f"  kv:     {generated_text(kv.text, prompt, llm.bundle.decoder_model_version, llm.dialect.templates)[:200]!r}\n"
                    f"  hybrid: {generated_text(other.text, prompt, llm.bundle.decoder_model_version, llm.dialect.templates)[:200]!r}",
                    pytrace=False)


@pytest.mark.release
def test_matches_golden(llm, point, goldens):
    skip_without_sink(llm, point)
    golden = golden_for(goldens, point.case.name, point.mode)
    prompt = point.prompt(llm.bundle)
    result = llm.generate(prompt, updater=llm.updaters[0], mode=point.mode, seq_len=point.seq_len)
    if golden.token_ids is not None:
        if result.generated_ids is None:
            raise UsageError(f"golden for {point.case.name!r} gives token ids, but runner dialect "
                             f"{llm.bundle.runner_dialect!r} writes none: give a text_prefix")
        problem = golden_ids_mismatch(result.generated_ids, golden.token_ids)
    else:
        text = generated_text(result.text, prompt, llm.bundle.decoder_model_version, llm.dialect.templates)
        problem = golden_text_mismatch(text, golden.text_prefix or "")
    assert problem is None, problem
