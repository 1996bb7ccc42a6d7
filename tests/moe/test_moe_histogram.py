"""One reader of routing histograms (:func:`engine.moe.parse_histogram`) behind both the CLI's
``--routing-histogram FILE`` and the explorer's histogram upload
(:func:`app.tabs.experts.read_histogram`): each file below is taken by both with the same
counts, or refused by both with the same reason (the text after the file's name).

The model is a two-layer MoE decoder of 8 experts (the CLI's ``soapbox experts`` reads it in a
fraction of a second; the app's reader is called as a plain function).
"""

from __future__ import annotations

import base64
import json
import math

import pytest

from app.tabs.experts import read_histogram
from engine.cli import main
from engine.formats import save_json
from engine.models.moe import MoEConfig, moe_gpt
from engine.moe import MAX_HISTOGRAM_BYTES, MAX_HISTOGRAM_EXPERTS, parse_histogram

GRAPH = moe_gpt(MoEConfig(2, 64, 4, 64, 100, 8, 8, 2, 64, name="tiny-moe"))
#: the app's refusal around the reason
APP_REFUSED, APP_UNCHANGED = "Histogram refused: ", ". The what-if is unchanged."
PI = [3, 1, 4, 1, 5, 9, 2, 6]

#: (test id, file content, the counts both read)
TAKEN = [
    ("json-list", "[8, 4, 2, 2, 1, 1, 1, 1]", [8, 4, 2, 2, 1, 1, 1, 1]),
    ("json-object-counts", '{"layer": 7, "counts": [1, 1, 1, 1, 1, 1, 1, 9]}', [1] * 7 + [9]),
    ("json-object-tokens", '{\n  "tokens_per_expert": [\n    5, 5, 5, 5,\n    5, 5, 5, 25.5e0\n  ]\n}\n',
     [5] * 7 + [25.5]),
    ("json-object-histogram", '{"histogram": [0, 0, 0, 0, 0, 0, 0, 3]}', [0] * 7 + [3]),
    ("csv-header", "expert,tokens\n" + "".join(f"{i},{i + 1}\n" for i in range(8)), list(range(1, 9))),
    ("csv-header-bom-semicolons-comments", "\ufeff# layer 7, step 1200\nExpert ID;Token count\n"
     + "".join(f"{i}; {10 * (i + 1)}  # rank {i}\n" for i in range(8)), [10 * (i + 1) for i in range(8)]),
    ("whitespace", "5 5 5\t5\n5   5 5 25\n", [5] * 7 + [25]),
    ("one-a-line-comments", "# tokens per expert\n\n" + "".join(f"{c}  # expert {i}\n" for i, c in enumerate(PI)),
     PI),
    ("commas-over-lines", "1,2,3,4,\n5,6,7,8e3\n", [1, 2, 3, 4, 5, 6, 7, 8000]),
    ("semicolons", "1;2;3;4;5;6;7;8", list(range(1, 9))),
]

#: (test id, file content, the reason both give after the file's name)
REFUSED = [
    ("negative", "[1, 2, 3, 4, 5, 6, 7, -8]", ", line 1: '-8': a token count cannot be negative"),
    ("negative-in-object", '{"counts": [1, 2, 3, 4, 5, 6, 7, -8]}',
     ", item 8 of 'counts': '-8': a token count cannot be negative"),
    ("text", "1\n2\nabc\n4\n5\n6\n7\n8\n", ", line 3: 'abc' is not a token count"),
    ("text-in-csv", "expert,tokens\n0,1\n1,x2\n", ", line 3: 'x2' is not a token count"),
    ("string-in-object", '{"counts": [1, 2, 3, 4, 5, 6, 7, "8"]}',
     ", item 8 of 'counts': '\"8\"' is not a token count"),
    ("nan-in-object", '{"counts": [1, NaN]}', ", item 2 of 'counts': 'NaN' is not a token count"),
    ("code", "__import__('os')\n", ", line 1: \"__import__('os')\" is not a token count"),
    ("overflow", "1\n1e999\n", ", line 2: '1e999' is too large a token count"),
    ("object-without-counts", '{"tokens": [1, 2]}', ": a JSON object needs a 'counts' list"),
    ("object-counts-not-a-list", '{"counts": 8}', ": 'counts' must be a list of token counts"),
    ("bad-json-object", '{"counts": [1, 2,]}', ": not valid JSON (Expecting value at line 1, column 18)"),
    ("unterminated-list", "[1, 2", ": not valid JSON (a JSON list must end with ']')"),
    ("too-many", "1\n" * (MAX_HISTOGRAM_EXPERTS + 10), f", line {MAX_HISTOGRAM_EXPERTS + 1}: more than 4,096 token "
     "counts (one per expert)"),
    ("too-large", "1\n" * (MAX_HISTOGRAM_BYTES // 2 + 1), ": the file is larger than the limit of 1 MiB"),
    ("far-too-large", " " * (2 * MAX_HISTOGRAM_BYTES), ": the file is larger than the limit of 1 MiB"),
    ("empty", "", ": no token counts"),
    ("comments-only", "# nothing measured\n\n", ": no token counts"),
    ("empty-list", "[]", ": no token counts"),
    ("all-zero", "0,0,0,0,0,0,0,0", ": the token counts are all zero"),
    ("all-zero-object", '{"counts": [0, 0, 0, 0, 0, 0, 0, 0.0]}', ": the token counts are all zero"),
    ("not-utf8", b"1\n\xff\xfe\n", ": not UTF-8 text (byte 2)"),
]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("moe") / "tiny-moe.json"
    save_json(GRAPH.to_dict(), path)
    return str(path)


def cli(capsys, model: str, path) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``soapbox experts --routing-histogram PATH --json``."""
    try:
        rc = main(["experts", "--model", model, "--cluster", "dgx-h100:1", "--ep", "8", "--routing-histogram",
                   str(path), "--json"])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def upload(content: str | bytes, name: str) -> tuple[dict | None, str]:
    raw = content.encode() if isinstance(content, str) else content
    return read_histogram("data:text/plain;base64," + base64.b64encode(raw).decode(), name, GRAPH)


def write(tmp_path, content: str | bytes):
    path = tmp_path / "h.txt"
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return path


@pytest.mark.parametrize("content, counts", [c[1:] for c in TAKEN], ids=[c[0] for c in TAKEN])
def test_taken_alike(capsys, model, tmp_path, content, counts):
    rc, out, err = cli(capsys, model, write(tmp_path, content))
    assert rc == 0, err
    kept, note = upload(content, "h.txt")
    assert kept == {"counts": [float(c) for c in counts], "filename": "h.txt"}, note
    assert parse_histogram(content) == kept["counts"]
    total = sum(counts)
    assert json.loads(out)["rank_shares"] == pytest.approx([c / total for c in counts], rel=1e-12)


@pytest.mark.parametrize("content, reason", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused_alike(capsys, model, tmp_path, content, reason):
    path = write(tmp_path, content)
    rc, out, err = cli(capsys, model, path)
    assert (rc, out) == (2, ""), err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    prefix = f"soapbox: error: --routing-histogram {path}"
    assert lines[0].startswith(prefix), lines[0]
    by_cli = lines[0][len(prefix):]
    kept, note = upload(content, "h.txt")
    assert kept is None and note.startswith(APP_REFUSED + "h.txt") and note.endswith(APP_UNCHANGED), note
    by_app = note[len(APP_REFUSED + "h.txt"):-len(APP_UNCHANGED)]
    assert by_cli == by_app
    assert by_cli.startswith(reason), by_cli


class TestParseHistogram:
    """The reader itself: what counts as a header, the JSON forms, never evaluated."""

    def test_a_header_is_text_that_is_no_number(self):
        assert parse_histogram("tokens\n3\n4") == [3.0, 4.0]
        assert parse_histogram("expert tokens share\n0 30 0.3\n1 70 0.7") == [0.3, 0.7]  # (the last column)
        with pytest.raises(ValueError, match=r"^h, line 1: 'nan' is not a token count"):
            parse_histogram("nan\n3\n4", "h")  # (float() reads nan: not a header)
        with pytest.raises(ValueError, match=r"^h, line 1: 'tokens' is not a token count"):
            parse_histogram("tokens\n", "h")  # (a lone line of text is no header)

    def test_without_a_header_every_number_counts(self):
        assert parse_histogram("0,10\n1,30") == [0.0, 10.0, 1.0, 30.0]

    def test_json_forms(self):
        assert parse_histogram('{"counts": [1, 2.5, 3e2]}') == [1.0, 2.5, 300.0]
        assert parse_histogram("[1 2 3]") == [1.0, 2.0, 3.0]
        assert parse_histogram(' \n[1e2]\n') == [100.0]
        for bad in ('{"counts": [1, true]}', '{"counts": [1, null]}', '{"counts": [1, [2]]}'):
            with pytest.raises(ValueError, match=r"^h, item 2 of 'counts': '(true|null|\[\.\.\.\])' is not"):
                parse_histogram(bad, "h")

    def test_deep_nesting_is_refused(self):
        deep = '{"counts": ' + "[" * 100_000 + "]" * 100_000 + "}"
        with pytest.raises(ValueError, match=r"^h: not valid JSON"):
            parse_histogram(deep, "h")

    def test_text_over_the_cap_is_refused_before_it_is_read(self):
        with pytest.raises(ValueError, match=r"^h: the text is larger than the limit of 1 MiB"):
            parse_histogram("1" + " " * MAX_HISTOGRAM_BYTES, "h")

    def test_counts_are_finite_floats(self):
        counts = parse_histogram("1\n.5\n+2\n3.\n4E1\n")
        assert counts == [1.0, 0.5, 2.0, 3.0, 40.0] and all(math.isfinite(c) for c in counts)
