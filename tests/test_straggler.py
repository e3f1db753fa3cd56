"""Seeded straggler model: slowdown, slow phases, keyed jitter, validation."""

import math
import subprocess
import sys

import numpy as np
import pytest

from ebsp_mpi.straggler import SlowPhase, StragglerModel


def test_disabled_injects_nothing():
    model = StragglerModel(
        3, enabled=False, slowdown=[5.0], jitter_sigma=1.0, phases=[SlowPhase(0, 0, 100, 4.0)], base_s=2.0
    )
    assert all(model.delay(w, i, 0.1, 1.0) == 0.0 for w in range(3) for i in range(10))


def test_no_stragglers_injects_nothing():
    model = StragglerModel(4)
    assert model.delay(2, 7, 0.3, 5.0) == 0.0


def test_slowdown_three_sleeps_twice_the_compute():
    model = StragglerModel(3, slowdown=[1.0, 3.0])
    assert model.delay(1, 0, 0.2, 0.0) == pytest.approx(0.4)
    assert model.delay(0, 0, 0.2, 0.0) == 0.0
    assert model.delay(2, 0, 0.2, 0.0) == 0.0  # missing entries are 1.0
    assert model.slowdown == (1.0, 3.0, 1.0)


def test_factor_below_one_never_gives_negative_delay():
    model = StragglerModel(1, slowdown=[0.5])
    assert model.delay(0, 0, 0.2, 0.0) == 0.0


def test_base_seconds_added_before_factors():
    model = StragglerModel(2, slowdown=[1.0, 2.0], base_s=0.5)
    assert model.delay(0, 0, 0.1, 0.0) == pytest.approx(0.5)
    assert model.delay(1, 0, 0.1, 0.0) == pytest.approx((0.1 + 0.5) * 2 - 0.1)


def test_phases_apply_only_inside_their_window_and_multiply():
    phases = [SlowPhase(1, 10.0, 20.0, 3.0), SlowPhase(1, 15.0, 30.0, 2.0)]
    model = StragglerModel(2, phases=phases)
    compute = 0.1
    assert model.delay(1, 0, compute, 9.999) == 0.0
    assert model.delay(1, 0, compute, 10.0) == pytest.approx(2 * compute)  # t1 inclusive
    assert model.delay(1, 0, compute, 15.0) == pytest.approx(5 * compute)  # overlap: 3 * 2
    assert model.delay(1, 0, compute, 20.0) == pytest.approx(compute)  # t2 exclusive, second phase on
    assert model.delay(1, 0, compute, 30.0) == 0.0
    assert model.delay(0, 0, compute, 15.0) == 0.0  # other workers unaffected
    assert model.phase_factor(1, 17.0) == 6.0


def test_open_ended_phase():
    model = StragglerModel(1, phases=[SlowPhase(0, 5.0, math.inf, 4.0)])
    assert model.delay(0, 0, 1.0, 1e9) == pytest.approx(3.0)


def test_jitter_depends_only_on_seed_worker_iteration():
    keys = [(w, i) for w in range(3) for i in (0, 1, 2, 1023, 1024, 5000)]
    forward = StragglerModel(3, jitter_sigma=0.3, seed=7)
    first = {k: forward.jitter(*k) for k in keys}
    backward = StragglerModel(3, jitter_sigma=0.3, seed=7)
    for k in reversed(keys):  # different order, different block cache history
        assert backward.jitter(*k) == first[k]
    assert forward.jitter(1, 2) == first[(1, 2)]  # asking again after other blocks
    assert len(set(first.values())) == len(keys)  # workers and iterations draw differently
    other_seed = StragglerModel(3, jitter_sigma=0.3, seed=8)
    assert all(other_seed.jitter(*k) != first[k] for k in keys)
    # the delay uses the same factor
    assert forward.delay(2, 1024, 0.5, 0.0) == pytest.approx(max(0.0, 0.5 * first[(2, 1024)] - 0.5))


def test_jitter_is_lognormal_with_median_one():
    sigma = 0.4
    model = StragglerModel(2, jitter_sigma=sigma, seed=3)
    j = np.array([model.jitter(1, i) for i in range(20000)])
    assert np.median(j) == pytest.approx(1.0, abs=0.02)
    logs = np.log(j)
    assert logs.std() == pytest.approx(sigma, rel=0.03)
    assert logs.mean() == pytest.approx(0.0, abs=0.02)
    # Half the iterations run faster than compute_s (delay 0), half slower.
    delays = np.array([model.delay(1, i, 1.0, 0.0) for i in range(2000)])
    assert 0.4 < (delays == 0).mean() < 0.6


def test_zero_sigma_means_no_jitter():
    model = StragglerModel(2, jitter_sigma=0.0, seed=3)
    assert all(model.jitter(0, i) == 1.0 for i in range(100))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(slowdown=[1.0, 2.0, 3.0]), "3 entries"),
        (dict(slowdown=[1.0, 0.0]), r"slowdown\[1\]"),
        (dict(slowdown=[-2.0]), r"slowdown\[0\]"),
        (dict(slowdown=[float("nan")]), r"slowdown\[0\]"),
        (dict(jitter_sigma=-0.1), "jitter_sigma"),
        (dict(base_s=-1.0), "base_s"),
        (dict(seed=-1), "seed"),
        (dict(phases=[SlowPhase(2, 0.0, 1.0, 2.0)]), "worker 2 out of range"),
    ],
)
def test_invalid_parameters_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StragglerModel(2, **kwargs)


def test_invalid_phase_and_workers():
    with pytest.raises(ValueError, match="t1 < t2"):
        SlowPhase(0, 5.0, 5.0, 2.0)
    with pytest.raises(ValueError, match="factor"):
        SlowPhase(0, 0.0, 5.0, 0.0)
    with pytest.raises(ValueError, match="worker must be an integer >= 0, got -1"):
        SlowPhase(-1, 0.0, 1.0, 2.0)
    with pytest.raises(ValueError, match="worker must be an integer"):
        SlowPhase(True, 0.0, 1.0, 2.0)
    with pytest.raises(ValueError, match="workers"):
        StragglerModel(0)
    with pytest.raises(TypeError, match="SlowPhase"):
        StragglerModel(1, phases=[(0, 0.0, 1.0, 2.0)])
    model = StragglerModel(2, jitter_sigma=0.1)
    for worker in (-1, 2):
        with pytest.raises(ValueError, match="out of range"):
            model.delay(worker, 0, 0.1, 0.0)
    with pytest.raises(ValueError, match="iteration"):
        model.delay(0, -1, 0.1, 0.0)


def test_as_dict_round_trips_parameters():
    phases = (SlowPhase(0, 1.0, 2.0, 3.0),)
    model = StragglerModel(2, slowdown=[2.0], jitter_sigma=0.2, phases=phases, base_s=0.1, seed=5)
    params = model.as_dict()
    params.pop("workers")
    params["phases"] = tuple(SlowPhase(**p) for p in params["phases"])
    again = StragglerModel(2, **params)
    assert [again.delay(w, i, 0.1, 1.5) for w in (0, 1) for i in range(5)] == [
        model.delay(w, i, 0.1, 1.5) for w in (0, 1) for i in range(5)
    ]


def test_the_job_schema_checks_phases_without_loading_numpy():
    """config.py validates slow phases and factors with this module; neither may load NumPy, so the
    CLI checks a job before NumPy, h5py or MPI are imported."""
    code = ("import sys; from ebsp_mpi.config import load_job, check_workers; "
            "job = load_job(None, ['straggler.phases=[{worker = 1, t1 = 0, t2 = 1, factor = 2}]']); "
            "check_workers(job, 3); print('numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
