"""Issue 24: every server callback, sent crafted requests through the real Dash endpoint
(``/_dash-update-component``, Flask's test client: no socket), answers — 200 or 204, never a
500 and never a traceback in the server's log. Values of every type go into every input and
state slot: junk, the right type out of range, a valid page state, a valid state with one part
damaged, a state of another session."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import state as ST

#: requests per callback (21 server callbacks: about 5,000 in all)
EXAMPLES = 250

_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40)
            | st.sampled_from(["", "0", "1", "8", "-1", "1e9", "0-3", "0-99999999", "megatron", "fsdp", "auto",
                               "stage 1", "node 2", "gpu", "on", "off", "fp8", "bf16", "1T", "utilization",
                               "memory", "../../etc/passwd", "dgx-a100-80gb:8", "gpt2", "llama2-7b", "nan"]))
_JUNK = st.recursive(_SCALARS, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c, max_size=4),
                     max_leaves=12)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from app import create_app

    app = create_app(data_dir=tmp_path_factory.mktemp("fuzz-data"), workers=1)
    client = app.server.test_client()
    deps = json.loads(client.get("/_dash-dependencies").data)
    good = ST.new_state("alexnet")
    return client, [d for d in deps if d.get("clientside_function") is None], good


def _damaged(good: dict):
    """A valid state with one part replaced by a value of any kind."""
    keys = st.sampled_from(sorted(good) + ["strategy.ops", "model.name", "compare", "selected", "undo"])

    def damage(key, value):
        s = json.loads(json.dumps(good))
        if "." in key:
            a, b = key.split(".")
            s[a][b] = value
        else:
            s[key] = value
        return s

    return st.builds(damage, keys, _JUNK)


def _value(good: dict):
    other = dict(good, sid=ST.new_sid())
    return st.one_of(_JUNK, st.just(good), st.just(other), _damaged(good))


def _entry(spec: dict, value):
    if spec["id"].startswith("{"):  # a pattern (ALL) slot: a list of components, or junk
        pattern = json.loads(spec["id"])
        if isinstance(value, list):
            return [{"id": {k: (v if v != ["ALL"] else f"x{i}") for k, v in pattern.items()},
                     "property": spec["property"], "value": x} for i, x in enumerate(value)]
        return value
    return {"id": spec["id"], "property": spec["property"], "value": value}


def _body(dep: dict, values: list, changed: int) -> dict:
    out = dep["output"]
    parts = [p.rsplit(".", 1) for p in out.strip(".").split("...")]
    outputs = [{"id": i, "property": p} for i, p in parts]
    slots = dep["inputs"] + dep.get("state", [])
    entries = [_entry(s, v) for s, v in zip(slots, values)]
    n_in = len(dep["inputs"])
    trig = dep["inputs"][changed % n_in]
    return {"output": out, "outputs": outputs if out.startswith("..") else outputs[0],
            "inputs": entries[:n_in], "state": entries[n_in:],
            "changedPropIds": [f"{trig['id']}.{trig['property']}"]}


def _callbacks():
    import tempfile

    from app import create_app

    app = create_app(data_dir=tempfile.mkdtemp(prefix="soapbox-fuzz-"), workers=1)
    deps = json.loads(app.server.test_client().get("/_dash-dependencies").data)
    return [d["output"] for d in deps if d.get("clientside_function") is None]


@pytest.mark.parametrize("output", _callbacks())
def test_every_callback_answers_crafted_requests(served, output, caplog):
    client, deps, good = served
    dep = next(d for d in deps if d["output"] == output)
    n = len(dep["inputs"]) + len(dep.get("state", []))

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(values=st.lists(_value(good), min_size=n, max_size=n), changed=st.integers(0, 50))
    def one(values, changed):
        body = _body(dep, values, changed)
        r = client.post("/_dash-update-component", data=json.dumps(body, allow_nan=True),
                        content_type="application/json")
        # 400 only for an envelope Dash could not read (a pattern slot that is not a list of
        # components), with what is wrong; a callback answers every value it is sent
        assert r.status_code in (200, 204) or (r.status_code == 400 and b"malformed callback request" in r.data), \
            (r.status_code, r.data[:500], json.dumps(body, allow_nan=True)[:2000])

    with caplog.at_level(logging.ERROR):
        one()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage()[:500] for r in caplog.records]
