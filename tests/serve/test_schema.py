"""A client's response_format / text.format schema over real uvicorn (issue 47): checked
before the run (a 400 naming what is wrong), then evaluated off the event loop, in linear
time, within a bound.

A test that would stall the old server (a pattern that backtracks, a quadratic
``uniqueItems``, a schema whose checks never end) asserts what comes back, never how
long it took; on the old code it waits past its client's timeout instead.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pydantic
import pytest

from tests._harness.uvicorn_server import ServedAgent, started

pytestmark = pytest.mark.slow
MODEL = "word-agent"
#: Well past what the new server needs; well short of what the old one took.
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def server() -> Iterator[ServedAgent]:
    with started(ServedAgent()) as (running,):
        yield running


def chat(schema: Any, text: str = "hello") -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    }


def responses(schema: Any, text: str = "hello") -> dict[str, Any]:
    return {
        "model": MODEL,
        "input": text,
        "text": {"format": {"type": "json_schema", "name": "a", "schema": schema}},
    }


def post(server: ServedAgent, body: dict[str, Any]) -> httpx.Response:
    path = "/v1/responses" if "input" in body else "/v1/chat/completions"
    return httpx.post(f"{server.url}{path}", json=body, timeout=TIMEOUT)


def answer_of(reply: httpx.Response) -> Any:
    assert reply.status_code == 200, reply.text
    return json.loads(reply.json()["choices"][0]["message"]["content"])


def one_answer(schema: dict[str, Any], **answer: Any) -> dict[str, Any]:
    return chat(schema, "json:" + json.dumps(answer))


# -- linear time -----------------------------------------------------------------------


def test_a_pattern_that_backtracks_is_matched_in_linear_time(server: ServedAgent) -> None:
    # Python's re tries 2^50 ways to match the a's before the '!'; RE2 reads the text once.
    text = "a" * 50 + "!"
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "pattern": "^(a+)+$|!$"}},
        "required": ["answer"],
    }
    assert answer_of(post(server, one_answer(schema, answer=text))) == {"answer": text}


def test_unique_items_over_a_long_answer_is_one_pass(server: ServedAgent) -> None:
    # jsonschema compares each pair of objects: 21 s for 59 KB, minutes for this one.
    items = [{"k": i, "tags": [str(i), i % 7]} for i in range(8000)]
    schema = {
        "type": "object",
        "properties": {"items": {"type": "array", "uniqueItems": True}},
        "required": ["items"],
    }
    assert answer_of(post(server, one_answer(schema, items=items))) == {"items": items}
    repeated = post(server, one_answer(schema, items=[*items, {"tags": ["3", 3], "k": 3}]))
    assert repeated.status_code == 502
    assert repeated.json()["error"]["code"] == "output_invalid"


def test_unique_items_keeps_json_equality(server: ServedAgent) -> None:
    schema = {
        "type": "object",
        "properties": {"items": {"type": "array", "uniqueItems": True}},
        "required": ["items"],
    }
    assert answer_of(post(server, one_answer(schema, items=[1, True, "1", [1], {"1": 1}])))
    assert post(server, one_answer(schema, items=[1, 1.0])).status_code == 502
    assert (
        post(server, one_answer(schema, items=[{"a": 1, "b": 2}, {"b": 2, "a": 1}])).status_code
        == 502
    )


# -- off the event loop, within a bound ------------------------------------------------


def test_checks_that_never_end_stop_off_the_event_loop_while_others_are_answered(
    server: ServedAgent,
) -> None:
    # Each level of the answer is checked twice over (allOf): 2^40 checks of its last level.
    twice = {"properties": {"a": {"$ref": "#/$defs/node"}}}
    node = {"type": "object", "allOf": [twice, twice]}
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/node"}},
        "$defs": {"node": node},
    }
    deep: dict[str, Any] = {}
    for _ in range(40):
        deep = {"a": deep}
    finished: list[str] = []
    hostile: list[httpx.Response] = []

    # A long answer has a large budget of checks (20,000 and one per two characters): the
    # hostile checks go on for seconds, in a worker thread, while the plain request comes.
    answer = {**deep, "pad": "x" * 300_000}

    def send_hostile() -> None:
        hostile.append(post(server, chat(schema, "json:" + json.dumps(answer))))
        finished.append("hostile")

    thread = threading.Thread(target=send_hostile)
    thread.start()
    time.sleep(0.5)  # let its checks begin (the order below holds either way on this server)
    plain = post(server, chat({"type": "object"}, "json:{}"))
    finished.append("plain")
    thread.join()
    assert answer_of(plain) == {}
    assert finished == ["plain", "hostile"]
    assert hostile[0].status_code == 502
    assert hostile[0].json()["error"]["code"] == "output_invalid"


# -- checked before the run ------------------------------------------------------------


class Inner(pydantic.BaseModel):
    x: str


class Outer(pydantic.BaseModel):
    answer: str
    inner: Inner


def test_a_schema_with_refs_is_served(server: ServedAgent) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    answer = json.dumps({"answer": "hi", "inner": {"x": "y"}})
    messages: Any = [{"role": "user", "content": "json:" + answer}]
    reply = client.chat.completions.parse(model=MODEL, messages=messages, response_format=Outer)
    assert reply.choices[0].message.parsed == Outer(answer="hi", inner=Inner(x="y"))
    done = client.responses.parse(model=MODEL, input="json:" + answer, text_format=Outer)
    assert done.output_parsed == Outer(answer="hi", inner=Inner(x="y"))


def _nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _doubling(levels: int) -> dict[str, Any]:
    defs: dict[str, Any] = {"d0": {"type": "string"}}
    for i in range(1, levels):
        twice = {"$ref": f"#/$defs/d{i - 1}"}
        defs[f"d{i}"] = {"allOf": [twice, twice]}
    ref = {"$ref": f"#/$defs/d{levels - 1}"}
    return {"type": "object", "properties": {"a": ref}, "$defs": defs}


def _text(pattern: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"answer": {"type": "string", "pattern": pattern}}}


def _patterns(pattern: str, count: int) -> dict[str, Any]:
    # Each a distinct pattern: RE2 compiles each, holding the GIL (the event loop waits).
    properties = {f"p{i}": {"type": "string", "pattern": f"{pattern}{i}"} for i in range(count)}
    return {"type": "object", "properties": properties}


REFUSED = [
    # RE2 compiled this one 6 s, holding the GIL: the server froze for each such pattern.
    pytest.param(_text("(?:[^a]{0,1000})" * 40), "pattern too large", id="pattern-too-large"),
    pytest.param(_patterns("[^a]{1000}", 20), "too large to compile", id="patterns-too-large"),
    pytest.param(_text("(("), "properties.answer.pattern", id="invalid-regex"),
    pytest.param(_text(r"(a)\1"), r"'(a)\\1' cannot be checked safely", id="backreference"),
    pytest.param(_text("(?=a)a"), "'(?=a)a' cannot be checked safely", id="lookahead"),
    pytest.param(
        {"type": "object", "patternProperties": {"(?!x)": {}}},
        "'(?!x)' cannot be checked safely",
        id="pattern-properties",
    ),
    pytest.param({"type": "string"}, "{'type': 'object', ...} at its root", id="not-an-object"),
    pytest.param(
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
        "'#/$defs/missing' resolves to nothing",
        id="unresolved-ref",
    ),
    pytest.param(
        {"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}},
        "is not local",
        id="remote-ref",
    ),
    pytest.param(_nested(100), "nested too deeply", id="deep"),
    pytest.param(
        {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(12000)}},
        "too large",
        id="large",
    ),
    pytest.param(_doubling(30), "with its $refs written out", id="ref-bomb"),
    pytest.param({"type": "object", "properties": []}, "not a valid JSON Schema", id="invalid"),
]


@pytest.mark.parametrize("route", [chat, responses], ids=["chat", "responses"])
@pytest.mark.parametrize(("schema", "named"), REFUSED)
def test_a_schema_the_server_cannot_check_safely_is_a_400_naming_it(
    server: ServedAgent, route: Any, schema: dict[str, Any], named: str
) -> None:
    reply = post(server, route(schema))
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    where = "response_format" if route is chat else "text.format"
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(where)
    assert named in error["message"]


# -- found by the red team -------------------------------------------------------------


def test_a_ref_that_names_itself_is_not_followed_for_ever(server: ServedAgent) -> None:
    # The nulls of an answer were dropped by following its schema's $refs until one was
    # not a $ref: a worker thread spun for ever on {"A": {"$ref": "#/$defs/A"}}.
    schema = {
        "type": "object",
        "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}},
        "properties": {"x": {"$ref": "#/$defs/A"}},
    }
    assert answer_of(post(server, one_answer(schema, x=None))) == {"x": None}


def _list_of(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": {"type": "array", "items": items}}}


def test_an_enum_is_one_look_up_an_item(server: ServedAgent) -> None:
    # jsonschema compared each item with each of the enum's values: 9,000 a check.
    schema = _list_of({"enum": [[i] for i in range(9000)]})
    items = [[8999]] * 5000
    assert answer_of(post(server, one_answer(schema, a=items))) == {"a": items}
    corrected = answer_of(post(server, one_answer(schema, a=[[8999], [9000]])))
    assert "a.1: [9000] is not one of" in corrected["answer"]  # the model is told, and mends


def test_a_schema_of_many_properties_costs_what_the_answer_holds(server: ServedAgent) -> None:
    # jsonschema looked each of the schema's 9,000 properties up in each small object.
    schema = _list_of({"type": "object", "properties": {f"p{i}": {} for i in range(9000)}})
    items = [{"p1": 1}] * 80_000
    assert answer_of(post(server, one_answer(schema, a=items))) == {"a": items}


def test_the_errors_of_each_branch_count_against_the_budget(server: ServedAgent) -> None:
    # anyOf keeps every error of its branches: 9,000 missing names an object, which cost
    # the budget nothing, so a short answer was minutes of checks.
    names = [f"p{i}" for i in range(9000)]
    schema = _list_of({"anyOf": [{"required": names}, {"type": "object"}]})
    reply = post(server, one_answer(schema, a=[{}] * 2000))
    assert reply.status_code == 502, reply.text
    assert reply.json()["error"]["code"] == "output_invalid"
    assert "(1 attempts)" in reply.json()["error"]["message"]  # the budget ends the run


@pytest.mark.parametrize(
    ("factor", "number"),
    [(0.5, "1" + "0" * 4000), (3, "1e400"), (0.1, "NaN"), (0.1, "-Infinity")],
    ids=["huge-integer", "out-of-range", "nan", "infinity"],
)
def test_a_number_the_floats_cannot_hold_is_no_server_error(
    server: ServedAgent, factor: float, number: str
) -> None:
    # jsonschema's multipleOf raised OverflowError or ValueError on these: a 500.
    schema = {"type": "object", "properties": {"a": {"multipleOf": factor}}}
    answer = answer_of(post(server, chat(schema, 'json:{"a": ' + number + "}")))
    if number.isdigit():  # 10^4000 is a multiple of 0.5
        assert answer == {"a": int(number)}
    else:  # not JSON's numbers: the model is told, and mends
        assert "Invalid JSON" in answer["answer"]


@pytest.mark.parametrize("keyword", ["allOf", "oneOf"])
def test_each_subschema_counts_though_it_checks_nothing(server: ServedAgent, keyword: str) -> None:
    # {} counts no keyword: 3,000 of them were 3,000 evaluations an item for nothing, six
    # million for this answer, none counted (the schema's own check is what costs time
    # here, so it is kept small: the budget ends the run after a few items all the same).
    schema = _list_of({keyword: [{}] * 3_000})
    reply = post(server, one_answer(schema, a=[1] * 2000))
    assert reply.status_code == 502, reply.text
    assert "(1 attempts)" in reply.json()["error"]["message"]  # the budget ends the run
