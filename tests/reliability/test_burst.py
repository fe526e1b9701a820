"""A burst of 300 submissions from 8 concurrent clients against a live weaved (reconcile
loop running): every submission gets an id or a one-line reason, nothing is lost or
stored twice, status keeps answering during the burst, and every job is decided
(placed, refused, or pending with a reason). The full 2,000 run is bench/burst.py."""

from __future__ import annotations

from bench.burst import run_burst
from tests.daemon.conftest import Running


def test_burst_of_300_from_8_clients(weaved: Running) -> None:
    res = run_burst(weaved.socket, jobs=300, clients=8, timeout_s=120)
    print(res)
    assert res.lost == 0, res.reasons
    assert res.accepted + res.refused == 300
    assert set(res.reasons) <= {"InfeasibleRequest"}, res.reasons  # the 1 in 10 that never fit
    assert res.refused == 30
    assert res.stored == res.accepted and res.duplicates == 0
    assert res.status_calls > 0
