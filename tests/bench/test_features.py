"""``firstlight bench features``: each judge on canned answers that pass and fail, the
JSON-prefix checker against the standard library's parser, the records and the page
section, the command's options; and once for real, a raw vLLM server on the default
model. The checks against scripted servers are in ``test_features_checks.py``, which
builds its answers with this module's helpers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion

from firstlight_bench.reports.features_report import (
    FEATURE_TITLES,
    FeatureResult,
    FeaturesMeta,
    FeaturesReport,
    ServerFeatures,
    markers,
    render_markdown,
    render_stored,
)
from firstlight_bench.tools.features_checks import (
    CITY_SCHEMA,
    FEATURES,
    WEATHER_PARAMETERS,
)
from firstlight_bench.tools.features_judges import (
    is_json_prefix,
    judge_echo,
    judge_json_object,
    judge_json_schema,
    judge_logit_bias,
    judge_logprobs,
    judge_min_tokens,
    judge_model_object,
    judge_n,
    judge_named_tool,
    judge_sampling,
    judge_seed,
    judge_stop,
    pick_stop_word,
)
from tests.bench.bench_cli import run_bench
from tests.conftest import VENV_BIN, Prepared

REPO = Path(__file__).parents[2]


def choice(content: str | None, index: int = 0, finish: str = "stop", **extra: Any) -> Any:
    """One choice of a chat completion's JSON (``message=`` adds to the message)."""
    message = {"role": "assistant", "content": content, **extra.pop("message", {})}
    return {"index": index, "message": message, "finish_reason": finish, **extra}


def completion_body(*choices: Any, tokens: int = 5) -> dict[str, Any]:
    """A chat completion's JSON with ``choices`` and ``tokens`` completion tokens."""
    return {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": list(choices),
        "usage": {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens},
    }


def chat(
    content: str | None, finish: str = "stop", tokens: int = 5, **extra: Any
) -> ChatCompletion:
    """A parsed one-choice chat completion, as the official client returns it."""
    return ChatCompletion.model_validate(
        completion_body(choice(content, 0, finish, **extra), tokens=tokens)
    )


def tool_call(arguments: str, name: str = "get_weather") -> dict[str, Any]:
    """A message's ``tool_calls`` with one call to ``name``."""
    call = {"id": "t", "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"tool_calls": [call]}


def token_logprobs(tokens: int, top: int) -> dict[str, Any]:
    """A choice's ``logprobs``: ``tokens`` tokens with ``top`` alternatives each."""
    entry = {
        "token": "a",
        "logprob": -0.5,
        "top_logprobs": [{"token": "a", "logprob": -0.5}] * top,
    }
    return {"content": [entry] * tokens}


# --- the judges --------------------------------------------------------------------------


def test_json_schema_needs_json_that_matches_the_schema() -> None:
    assert judge_json_schema(chat('{"city": "Paris", "country": "France"}'), CITY_SCHEMA).honoured
    missing = judge_json_schema(chat('{"city": "Paris"}'), CITY_SCHEMA)
    assert not missing.honoured
    assert "country" in missing.evidence
    assert not judge_json_schema(chat("The capital is Paris."), CITY_SCHEMA).honoured


def test_json_mode_takes_json_or_a_json_prefix_cut_at_max_tokens() -> None:
    assert judge_json_object(chat('{"a": [1, 2]}')).honoured
    assert judge_json_object(chat('{"a": {"b": {"c": [', finish="length")).honoured
    # Cut off but ended by itself: a prefix is not enough.
    assert not judge_json_object(chat('{"a": {"b": ', finish="stop")).honoured
    assert not judge_json_object(chat("Sure! Here is the JSON:", finish="length")).honoured
    assert not judge_json_object(chat("  \n", finish="length")).honoured


def test_a_named_tool_call_needs_object_arguments_matching_the_parameters() -> None:
    def judge(content: str | None, **extra: Any) -> tuple[bool, str]:
        verdict = judge_named_tool(chat(content, **extra), "get_weather", WEATHER_PARAMETERS)
        return verdict.honoured, verdict.evidence

    assert judge("", message=tool_call('{"city": "Paris"}'))[0]
    # What a raw vLLM server with the hermes parser answered: a JSON string.
    honoured, evidence = judge("", message=tool_call('"Paris"'))
    assert not honoured
    assert "JSON string, not an object" in evidence
    assert not judge("", message=tool_call('{"town": "Paris"}'))[0]
    assert not judge("", message=tool_call("{city: Paris"))[0]
    assert "'lookup'" in judge("", message=tool_call('{"city": "Paris"}', name="lookup"))[1]
    assert judge("It is sunny.") == (False, 'no tool call; content "It is sunny."')


def test_logprobs_need_a_logprob_and_the_asked_alternatives_per_token() -> None:
    assert judge_logprobs(chat("a b", logprobs=token_logprobs(2, 3)), 3).honoured
    assert not judge_logprobs(chat("a b", logprobs=token_logprobs(2, 1)), 3).honoured
    assert not judge_logprobs(chat("a b"), 3).honoured


def test_n_needs_every_index_once() -> None:
    two = ChatCompletion.model_validate(completion_body(choice("a"), choice("b", 1)))
    assert judge_n(two, 2).honoured
    assert not judge_n(chat("a"), 2).honoured
    twice_zero = ChatCompletion.model_validate(completion_body(choice("a"), choice("b")))
    assert not judge_n(twice_zero, 2).honoured


def test_seed_needs_the_same_text_for_the_same_seed() -> None:
    verdict = judge_seed(chat("once upon"), chat("once upon"), chat("a cat"))
    assert verdict.honoured
    assert "another seed differs" in verdict.evidence
    assert not judge_seed(chat("once upon"), chat("a cat sat"), chat("x")).honoured
    assert not judge_seed(chat(""), chat(""), chat("")).honoured


def test_stop_needs_the_word_gone_and_finish_reason_stop() -> None:
    free = chat("The sea is vast and deep.", finish="length")
    word = pick_stop_word(free.choices[0].message.content or "")
    assert word == "vast"
    assert judge_stop(free, chat("The sea is "), "vast").honoured
    assert not judge_stop(free, chat("The sea is vast and deep."), "vast").honoured
    assert not judge_stop(free, chat("The sea is ", finish="length"), "vast").honoured
    assert not judge_stop(chat("Calm."), chat("Calm."), "vast").honoured  # inconclusive
    assert pick_stop_word("Yes, a cat.") is None


def test_min_tokens_needs_a_longer_answer_than_the_unconstrained_one() -> None:
    free = chat("Yes.", tokens=3)
    assert judge_min_tokens(free, chat("Yes, the sky is blue today.", tokens=12), 11).honoured
    assert not judge_min_tokens(free, chat("Yes.", tokens=3), 11).honoured
    # The unconstrained answer was cut, not ended: nothing to prove.
    assert not judge_min_tokens(chat("Yes...", "length", 64), chat("x", tokens=80), 72).honoured


def test_sampling_needs_top_k_one_greedy_and_a_penalty_that_changes_the_answer() -> None:
    greedy, repetitive = chat("The moon is bright"), chat("hello hello hello")
    assert judge_sampling(
        greedy, chat("The moon is bright"), repetitive, chat("hello world")
    ).honoured
    ignored_top_k = judge_sampling(greedy, chat("A moonlit night"), repetitive, chat("hi there"))
    assert not ignored_top_k.honoured
    assert "top_k=1 at T=1 differs" in ignored_top_k.evidence
    assert not judge_sampling(greedy, greedy, repetitive, chat("hello hello hello")).honoured


def test_model_object_echo_and_logit_bias() -> None:
    model = Model.model_validate({"id": "m", "object": "model", "created": 0, "owned_by": "x"})
    assert judge_model_object(model, "m").honoured
    assert not judge_model_object(model, "other").honoured
    echoed = Completion.model_validate(
        {
            "id": "c",
            "object": "text_completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "text": "The capital is Paris.", "finish_reason": "stop"}],
        }
    )
    assert judge_echo(echoed, "The capital is").honoured
    assert not judge_echo(echoed, "A capital").honoured
    assert judge_logit_bias(chat(" blue blue blue"), " blue").honoured
    assert not judge_logit_bias(chat(" blue sky"), " blue").honoured
    assert not judge_logit_bias(chat(""), " blue").honoured


# --- the JSON-prefix checker -------------------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=12,
)  # fmt: skip


@given(value=_JSON, indent=st.sampled_from([None, 0, 2]), ascii_only=st.booleans())
def test_every_prefix_of_a_json_text_is_a_json_prefix(
    value: object, indent: int | None, ascii_only: bool
) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    assert all(is_json_prefix(text[:end]) for end in range(len(text) + 1))
    # Nothing may follow a whole top-level value but whitespace.
    assert not is_json_prefix(text + ",")
    assert not is_json_prefix(text + " }")


@given(st.text(alphabet='{}[]":,0123456789-+.eE truefalsn\\u', max_size=14))
def test_the_prefix_checker_agrees_with_the_standard_parser(text: str) -> None:
    try:
        json.loads(text)
    except ValueError:
        pass
    else:
        assert is_json_prefix(text), text
    if not is_json_prefix(text):  # then no continuation parses either
        for tail in ("", "0", '"', "]", "}", "]}", "0]}", '"]}', "e]}", 'u"}'):
            with pytest.raises(json.JSONDecodeError):
                json.loads(text + tail)


@pytest.mark.parametrize(
    "text", ["}", "{]", '{"a" 1', "01", "[1,]", "tx", "1 2", '"\\x"', "-a", "{,", '"\\u12g', "[-]"]
)
def test_what_no_json_text_starts_with(text: str) -> None:
    assert not is_json_prefix(text)


# --- records and rendering ---------------------------------------------------------------


def _report() -> FeaturesReport:
    meta = FeaturesMeta(
        command="firstlight bench features --arms vllm_server,firstlight",
        git_commit="0123456789abcdef0123",
        created_at="2026-12-03T12:00:00+00:00",
        model="SmolLM2-135M-Instruct",
        openai_client="3.60.0",
        vllm="0.32.0",
        python="3.11.9",
        cpu_count=2,
        cpu="a CPU",
        platform="Linux",
        started=("vllm_server", "firstlight"),
    )
    vllm = (
        FeatureResult("json_schema", True, True, 'matches the schema: "{|}"'),
        FeatureResult("models_retrieve", False, False, "", "HTTP 404: Not Found", 404),
    )
    ours = (
        FeatureResult("json_schema", True, False, 'not JSON: "Paris"'),
        FeatureResult("models_retrieve", True, True, "id 'm'"),
        FeatureResult("n", False, False, "", "APIConnectionError: Connection error."),
    )
    return FeaturesReport(
        meta,
        (
            ServerFeatures("vllm_server", "http://a/v1", vllm),
            ServerFeatures("firstlight", "http://b/v1", ours),
        ),
    )


def test_outcomes_follow_acceptance_and_the_status() -> None:
    assert FeatureResult("n", True, True, "").outcome == "honoured"
    assert FeatureResult("n", True, False, "").outcome == "accepted"
    assert FeatureResult("n", False, False, "", "bad", 422).outcome == "refused"
    assert FeatureResult("n", False, False, "", "down", 503).outcome == "error"
    assert FeatureResult("n", False, False, "", "no answer").outcome == "error"


def test_the_report_round_trips_through_json() -> None:
    report = _report()
    assert FeaturesReport.from_json(json.loads(json.dumps(report.to_json()))) == report


def test_the_table_has_a_row_per_feature_and_a_column_per_server() -> None:
    text = render_markdown(_report(), "features-x")
    begin, end = markers("features-x")
    assert text.startswith(begin + "\n")
    assert text.endswith("\n" + end)
    assert "`0123456789ab`" in text
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert rows[0] == "| feature | raw vLLM server | Firstlight |"
    assert rows[2] == (
        f"| {FEATURE_TITLES['json_schema']} | **honoured**: matches the schema: "
        '"{\\|}" | accepted: not JSON: "Paris" |'
    )
    assert rows[3].startswith(f"| {FEATURE_TITLES['n']} | not checked | error: APIConnectionError")
    assert rows[4] == (
        f"| {FEATURE_TITLES['models_retrieve']} | refused: HTTP 404: Not Found "
        "| **honoured**: id 'm' |"
    )
    assert rows[-1] == "| **honoured** | 1 of 2 | 1 of 3 |"
    assert all(row.count(" | ") == 2 for row in rows if not row.startswith("|---"))


def test_every_feature_has_a_check_and_a_title_in_one_order() -> None:
    assert list(FEATURES) == list(FEATURE_TITLES)


def test_tables_only_rewrites_the_section_from_the_stored_report(tmp_path: Path) -> None:
    stored = tmp_path / "benchmarks" / "features-x" / "results.json"
    stored.parent.mkdir(parents=True)
    stored.write_text(json.dumps(_report().to_json()))
    begin, end = markers("features-x")
    page = tmp_path / "api.md"
    page.write_text(f"# The OpenAI API\n\n{begin}\nold\n{end}\n\nafter\n")
    result = run_bench("features", "--tables-only", "--page", str(page))
    assert (result.exit_code, result.stdout) == (0, ""), result.output  # checks, prints nothing
    assert page.read_text() == (
        "# The OpenAI API\n\n" + render_markdown(_report(), "features-x") + "\n\nafter\n"
    )


def test_the_api_page_shows_the_stored_run() -> None:
    text = (REPO / "docs" / "api.md").read_text()
    assert text.startswith("# The OpenAI API\n")
    assert "\n## Features side by side\n" in text
    stored = json.loads((REPO / "docs/benchmarks/features-vllm-cpu/results.json").read_text())
    assert render_stored(stored, "features-vllm-cpu") in text, (
        "docs/api.md is stale: firstlight bench features --tables-only --page docs/api.md"
    )


def test_firstlight_honours_every_feature_the_raw_vllm_server_honours() -> None:
    # The goal, held to the stored run (simulated nothing: the real model).
    stored = FeaturesReport.from_json(
        json.loads((REPO / "docs/benchmarks/features-vllm-cpu/results.json").read_text())
    )
    servers = {s.server: {r.feature: r for r in s.results} for s in stored.servers}
    raw, ours = servers["vllm_server"], servers["firstlight"]
    assert {f for f, r in raw.items() if r.honoured} <= {f for f, r in ours.items() if r.honoured}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "'--url' / '--arms': nothing to check"),
        (["--url", "raw"], "--url: 'raw': expected NAME=http(s)"),
        (["--url", "a=ftp://x"], "--url: 'a=ftp://x': expected NAME=http(s)"),
        (["--url", "a=http://x/v1", "--url", "a=http://y/v1"], "the server name 'a' is taken"),
        (["--url", "firstlight=http://x/v1"], "the server name 'firstlight' is taken"),
        (["--arms", "ray"], "--arms: 'ray': unknown"),
        (["--url", "a=http://x/v1", "--features", "json_schema,nope"], "--features: 'json_"),
        (["--url", "a=http://x/v1", "--features", ","], "--features: at least one"),
        (["--url", "a=http://x/v1", "--timeout", "0"], "--timeout: must be positive, got 0"),
        (["--url", "a=http://x/v1", "--page", "p.md"], "--page needs --out"),
        (["--tables-only"], "--tables-only needs --page"),
    ],
)
def test_bad_options_are_refused_by_name(argv: list[str], message: str) -> None:
    result = run_bench("features", *argv)
    assert result.exit_code == 2
    assert message in result.stderr


# --- for real ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_raw_vllm_server_honours_the_core_features(prepared: Prepared, tmp_path: Path) -> None:
    folder, _ = prepared
    out = tmp_path / "features-vllm"
    command = [str(VENV_BIN / "firstlight"), "bench", "features", "--arms", "vllm_server"]
    command += ["--cache-dir", str(folder.parent.parent), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]

    report = FeaturesReport.from_json(json.loads((out / "results.json").read_text()))
    assert report.meta.started == ("vllm_server",)
    (server,) = report.servers
    outcomes = {r.feature: r.outcome for r in server.results}
    assert list(outcomes) == list(FEATURES)
    core = ("json_schema", "logprobs", "n", "seed")
    assert {f: outcomes[f] for f in core} == dict.fromkeys(core, "honoured"), server.results
    assert f"| {FEATURE_TITLES['n']} | **honoured**" in done.stdout
