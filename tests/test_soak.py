"""The soak's short version (tests/soak.py; `make soak` runs the long one): 150
requests of every kind from 8 clients, a SIGKILL + restart and a SIGTERM + restart
in the middle; 0 wrong, 0 lost outside the faults, sessions and files intact, and
nothing of the instance left on the host after the stop."""

from soak import soak


def test_soak_short():
    s, text = soak(runs=150, duration=600)
    # The faults really happened while clients were busy, and work succeeded after each.
    assert [f[0] for f in s.faults] == ["SIGKILL", "SIGTERM"], text
    assert s.checks["files"] > 0 and s.checks["sandbox reads"] >= 3 * 8, text
    assert s.total("ok") >= 100, text
    assert s.failures() == [], text
