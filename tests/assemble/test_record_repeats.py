"""A record that repeats itself (context windows, sub-agents or branches holding the same turns)
claims one call per assistant message: made from the ledger's own conversations, with windows
duplicated, it selects each call exactly once (docs/rows.md, section 1)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from assemble_standin import assistant, write_rollout
from rowgrove.assemble import build_rows, read_calls
from rowgrove.assemble.select import select_calls
from rowgrove.ledger import Ledger

TEXTS = st.sampled_from(["ok", "step one", "step two", "done"])


@settings(max_examples=150, deadline=None)
@given(windows=st.lists(st.lists(TEXTS, min_size=1, max_size=4), min_size=1, max_size=3),
       copies=st.integers(min_value=1, max_value=3))
def test_a_record_of_the_ledger_own_windows_selects_each_call_once(tmp_path_factory, windows, copies):
    # each window a root and its chain; the same window's turns `copies` times over (an agent
    # that redoes its steps after a compaction), each copy a window of its own in the ledger
    steps, convs, tok = [], [], 1
    for w, texts in enumerate(windows * copies):
        parent = None
        for t, text in enumerate(texts):
            cid = f"w{w}t{t}"
            steps.append((cid, parent, [tok], [1000 + tok], text))
            tok += 1
            parent = cid
        convs.append([assistant(x) for x in texts])
    with Ledger(tmp_path_factory.mktemp("p") / "l.db") as ledger:
        rid = write_rollout(ledger, "g", steps, {"conversations": convs}, 1.0)
        calls = read_calls(ledger, rid)
        sel = select_calls(ledger.get_rollout(rid).record, calls)
        claimed = [m.call_id for m in sel.matches]
        assert None not in claimed and sorted(claimed) == sorted(c.id for c in calls)   # each once
        rr = build_rows(ledger.get_rollout(rid), calls)
        assert rr.invalid_reason is None and len(rr.rows) == len(convs)
