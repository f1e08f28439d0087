"""Rows as decoded text with the trained spans marked (rowgrove.assemble.rowtext), with the real
tiny tokenizer, and `rowgrove show --model` through the CLI."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.assemble.rowtext import CLOSE, OPEN, row_html, row_runs, row_text, rows_text
from rowgrove.types import Row


@pytest.fixture(scope="module")
def tok():
    from rowgrove.model.load import load_tokenizer

    return load_tokenizer("tiny")


def test_row_runs_cut_at_every_change_of_mask():
    row = Row("r", "g", [5, 6, 7, 8, 9], [0, 0, 1, 1, 0])
    assert row_runs(row) == [(False, [5, 6]), (True, [7, 8]), (False, [9])]


def test_a_chat_row_shows_its_sampled_reply_marked(tok):
    prompt = tok.apply_chat_template([{"role": "user", "content": "count to 3"}], add_generation_prompt=True,
                                     tokenize=False)
    p_ids = tok.encode(prompt, add_special_tokens=False)
    reply = tok.encode("add(3)<|im_end|>", add_special_tokens=False)
    row = Row("r", "g", p_ids + reply, [0] * len(p_ids) + [1] * len(reply))
    text = row_text(row, tok)
    assert text == prompt + OPEN + "add(3)<|im_end|>" + CLOSE
    with_ids = row_text(row, tok, ids=True)
    assert with_ids.endswith(CLOSE + "{" + ",".join(map(str, reply)) + "}")
    assert "trained" in rows_text([row], tok).splitlines()[0]


class _Marks(HTMLParser):
    def __init__(self):
        super().__init__()
        self.marks, self.titles, self._in = [], [], False

    def handle_starttag(self, tag, attrs):
        if tag == "mark" and ("class", "trained") in attrs:
            self._in = True
            self.marks.append("")
            self.titles.append(dict(attrs)["title"])

    def handle_endtag(self, tag):
        self._in = self._in and tag != "mark"

    def handle_data(self, data):
        if self._in:
            self.marks[-1] += data


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.integers(3, 900), min_size=1, max_size=6)), min_size=1,
                max_size=6))
def test_marks_fall_exactly_on_the_trained_runs(tok, runs):
    ids = [t for _, run in runs for t in run]
    mask = [int(m) for m, run in runs for _ in run]
    row = Row("r", "g", ids, mask)
    expected = [(True, r) for m, r in row_runs(row) if m]
    text = row_text(row, tok)
    assert text.count(OPEN) == text.count(CLOSE) == len(expected)
    assert text.replace(OPEN, "").replace(CLOSE, "") == "".join(tok.decode(r, skip_special_tokens=False)
                                                                for _, r in row_runs(row))
    parser = _Marks()
    parser.feed(row_html(row, tok))
    assert parser.marks == [tok.decode(r, skip_special_tokens=False) for _, r in expected]
    assert parser.titles == [",".join(map(str, r)) for _, r in expected]
