"""`rowgrove rows --ledger A --ledger B`: the ledgers of several gateways merge into one set of
rows whose group baselines span the gateways; a rollout id found in two ledgers is refused."""

from __future__ import annotations

import pytest
from assemble_standin import write_rollout
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rowgrove.assemble import read_rows
from rowgrove.assemble.ledgers import check_unique_rollouts, rows_from_ledgers
from rowgrove.cli import main
from rowgrove.errors import InputError
from rowgrove.ledger import Ledger


def one_call(lg: Ledger, group: str, rid: str, reward: float, n_sampled: int = 1) -> None:
    sampled = list(range(500, 500 + n_sampled))
    write_rollout(lg, group, [("c1", None, [1, 2], sampled, "hi")],
                  {"messages": [{"role": "assistant", "content": "hi"}]}, reward, rollout_id=rid,
                  call_prefix=f"{rid}:")


ROLLOUTS = [("g0", "r0", 1.0), ("g0", "r1", 0.0), ("g0", "r2", 0.5), ("g1", "r3", 1.0), ("g1", "r4", 3.0),
            ("g2", "r5", 2.0)]


def test_two_ledgers_give_the_rows_of_one(tmp_path, capsys):
    one, a, b = tmp_path / "one.db", tmp_path / "a.db", tmp_path / "b.db"
    with Ledger(one) as lg:
        for g, rid, r in ROLLOUTS:
            one_call(lg, g, rid, r)
    # group g0 spans both gateways, g1 sits on b only, g2 on a only
    with Ledger(a) as la, Ledger(b) as lb:
        for k, (g, rid, r) in enumerate(ROLLOUTS):
            one_call(la if k in (0, 2, 5) else lb, g, rid, r)
        lb.create_rollout("g3", rollout_id="open-on-b")
    assert main(["rows", "--ledger", str(one), "--out", str(tmp_path / "one.parquet"), "--quiet"]) == 0
    assert main(["rows", "--ledger", str(a), "--ledger", str(b), "--out", str(tmp_path / "ab.parquet")]) == 0
    out = capsys.readouterr()
    assert "6 rollouts → 6 rows" in out.out
    assert "skipped 1 open rollout (open-on-b)" in out.err
    single = {r.rollout_id: r.advantage for r in read_rows(tmp_path / "one.parquet")}
    merged = {r.rollout_id: r.advantage for r in read_rows(tmp_path / "ab.parquet")}
    assert merged == pytest.approx(single)
    # g0 = [1, 0, 0.5] (r0 on a, r1 on b): mean 0.5, sample std 0.5, so r0 gets 0.5 / 0.5
    assert merged["r0"] == pytest.approx(1.0, rel=1e-5)
    assert merged["r5"] == 0.0  # size-1 group


def test_a_rollout_id_in_two_ledgers_is_an_error_naming_it(tmp_path, capsys):
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    with Ledger(a) as la, Ledger(b) as lb:
        one_call(la, "g0", "r0", 1.0)
        one_call(lb, "g0", "r1", 0.0)
        one_call(lb, "g0", "r0", 0.0)
    out = tmp_path / "rows.parquet"
    assert main(["rows", "--ledger", str(a), "--ledger", str(b), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rollout r0 is in both" in err and str(a) in err and str(b) in err
    assert not out.exists()
    assert main(["rows", "--ledger", str(a), "--ledger", str(a), "--out", str(out)]) == 2
    assert "is given twice" in capsys.readouterr().err


def test_check_unique_rollouts_accepts_disjoint_sources():
    check_unique_rollouts([("a", ["x", "y"]), ("b", ["z"]), ("c", [])])
    with pytest.raises(InputError, match="rollout y is in both a and c"):
        check_unique_rollouts([("a", ["x", "y"]), ("b", ["z"]), ("c", ["y"])])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rewards=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=1, max_size=8),
       groups=st.lists(st.integers(0, 2), min_size=8, max_size=8),
       gateway=st.lists(st.integers(0, 2), min_size=8, max_size=8))
def test_any_spread_over_gateways_gives_the_same_advantages(tmp_path_factory, rewards, groups, gateway):
    """However rollouts are spread over three ledgers, the merged rows (and so the baselines)
    equal the rows of one ledger holding them all."""
    from rowgrove.algo import assign_advantages

    d = tmp_path_factory.mktemp("spread")
    paths = [d / f"g{k}.db" for k in range(3)]
    lgs = [Ledger(p) for p in paths]
    single = Ledger(d / "one.db")
    try:
        for k, r in enumerate(rewards):
            one_call(lgs[gateway[k]], f"p{groups[k]}", f"r{k}", r, n_sampled=1 + k % 3)
            one_call(single, f"p{groups[k]}", f"r{k}", r, n_sampled=1 + k % 3)
    finally:
        for lg in [*lgs, single]:
            lg.close()
    merged = assign_advantages(rows_from_ledgers(paths).rows)
    alone = assign_advantages(rows_from_ledgers([d / "one.db"]).rows)
    assert {r.rollout_id: r.advantage for r in merged} == pytest.approx({r.rollout_id: r.advantage for r in alone})
    assert sorted(r.rollout_id for r in merged) == sorted(f"r{k}" for k in range(len(rewards)))
