"""PSP (probabilistic synchronous parallel): the sampled barrier, its staleness bound against the sample,
SSP when the sample is everyone, seeded samples, and a live run."""

import json

import numpy as np
import pytest

from ebsp_mpi.config import SyncConfig
from ebsp_mpi.sync.psp import PSP
from ebsp_mpi.sync.registry import make_policy
from ebsp_mpi.sim.events import simulate
from ebsp_mpi.sync.ssp import SSP
from mpirun import train


class CheckedPSP(PSP):
    """PSP that checks its staleness bound at every release: a released worker is at most s iterations
    ahead of every (still active) worker of the sample it drew at its last push."""

    def draw(self, worker, pushes):
        # the sample as drawn at the push (a later draw would see fewer active workers)
        self.drawn = getattr(self, "drawn", {})
        return self.drawn.setdefault((worker, pushes), super().draw(worker, pushes))

    def on_push(self, worker, t):
        decision = super().on_push(worker, t)
        self._check(decision.release)
        return decision

    def on_leave(self, worker, t):
        decision = super().on_leave(worker, t)
        self._check(decision.release)
        return decision

    def _check(self, released):
        for i in released:
            if self.done[i] == 0:  # the start: nobody has pushed
                continue
            for j in self.draw(i, int(self.done[i])):
                assert j not in self.active or self.done[i] - self.done[j] <= self.staleness, \
                    f"worker {i} released {self.done[i] - self.done[j]} iterations ahead of sampled worker {j}"


def random_intervals(n: int, seed: int):
    rng = np.random.default_rng(seed)
    speed = np.exp(rng.uniform(0.0, np.log(8.0), n))  # a log-uniform spread of speeds, up to 8x
    jitter = rng.lognormal(0.0, 0.3, size=(n, 400))
    return lambda w, k: float(speed[w] * jitter[w, k % 400])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("sample, staleness", [(1, 0), (2, 1), (3, 3)])
def test_a_released_worker_is_within_the_staleness_bound_of_its_sample(seed, sample, staleness):
    n = 8
    res = simulate(CheckedPSP(n, sample=sample, staleness=staleness, seed=seed), random_intervals(n, seed), 60)
    assert [len(its) for its in res.iterations] == [60] * n


@pytest.mark.parametrize("seed", range(4))
def test_with_every_other_worker_in_the_sample_psp_is_ssp(seed):
    n, s = 6, 2
    psp = simulate(PSP(n, sample=n - 1, staleness=s, seed=seed), random_intervals(n, seed), 50)
    ssp = simulate(SSP(n, staleness=s), random_intervals(n, seed), 50)
    assert [(r.t, r.workers) for r in psp.releases] == [(r.t, r.workers) for r in ssp.releases]


def test_a_sampled_barrier_waits_less_than_ssp_under_a_straggler():
    """One worker 4x slower than 31 others, s = 3: SSP holds everyone for it; PSP with a sample of 2
    holds a worker only when its sample lags. The gain is modest: a held worker's count does not
    advance either, so chains of samples pass the straggler's pace on (32 workers x 40 iterations:
    2763 s of waiting against SSP's 3255)."""
    intervals = [1.0] * 31 + [4.0]
    ssp = simulate(SSP(32, staleness=3), intervals, 40)
    psp = simulate(PSP(32, sample=2, staleness=3, seed=3), intervals, 40)
    assert psp.wait[:31].sum() < 0.9 * ssp.wait[:31].sum()


def test_samples_are_seeded_by_worker_and_push_only():
    a, b = PSP(10, sample=3, seed=7), PSP(10, sample=3, seed=7)
    assert [a.draw(2, c) for c in range(20)] == [b.draw(2, c) for c in range(20)]
    assert all(2 not in a.draw(2, c) and len(a.draw(2, c)) == 3 for c in range(20))
    assert [a.draw(2, c) for c in range(20)] != [PSP(10, sample=3, seed=8).draw(2, c) for c in range(20)]


def test_samples_do_not_depend_on_the_order_they_are_drawn_in():
    """Blocks of a worker's uniforms come from one generator that goes on, or jumps to the block asked for."""
    pushes = range(0, 700, 3)
    forward = [PSP(40, sample=3, seed=5).draw(7, c) for c in pushes]
    backward = PSP(40, sample=3, seed=5)
    assert [backward.draw(7, c) for c in reversed(pushes)][::-1] == forward
    shuffled = np.random.default_rng(0).permutation(list(pushes)).tolist()
    scattered = PSP(40, sample=3, seed=5)
    drawn = [scattered.draw(7, c) for c in shuffled]
    assert dict(zip(shuffled, drawn, strict=True)) == dict(zip(pushes, forward, strict=True))


class OneByOne(PSP):
    """PSP drawing every sample with Floyd's algorithm push by push, instead of a block at once."""

    def draw(self, worker, pushes):
        block, row = divmod(pushes, 64)
        return self._floyd(worker, self._uniforms(worker, block)[row].tolist())


@pytest.mark.parametrize("n, sample", [(3, 1), (5, 2), (9, 4), (40, 2), (40, 16), (40, 17), (300, 3)])
def test_a_block_of_samples_drawn_at_once_is_floyd_push_by_push(n, sample):
    """Also when workers leave in the middle of a block, and for a worker that left."""
    block, one = PSP(n, sample=sample, seed=2), OneByOne(n, sample=sample, seed=2)
    drawn = []
    for c in range(150):
        if c in (30, 100, 101) and len(block.active) > 1:  # a departure within a block and across one
            leaver = sorted(block.active)[c % len(block.active)]
            block.on_leave(leaver, 0.0)
            one.on_leave(leaver, 0.0)
        drawn += [(block.draw(w, c), one.draw(w, c)) for w in (0, n // 2, n - 1)]
    assert all(a == b for a, b in drawn)
    assert len({a for a, _ in drawn}) > 1 or n <= sample + 1


def test_samples_are_uniform_subsets_of_the_other_workers():
    """Worker 0 of 6 with β = 2: each of the 10 pairs of the 5 others about 1 draw in 10 (binomial
    standard deviation about 30 of the expected 1,000; 6 of them allowed)."""
    policy = PSP(6, sample=2, seed=1)
    counts = {}
    for c in range(10_000):
        pair = policy.draw(0, c)
        counts[pair] = counts.get(pair, 0) + 1
    assert sorted(counts) == [(i, j) for i in range(1, 6) for j in range(i + 1, 6)]
    assert all(abs(k - 1000) < 180 for k in counts.values()), counts


def test_the_registry_builds_psp_from_the_sync_section_and_the_job_seed():
    policy = make_policy(SyncConfig(model="psp", sample=3, staleness=1), 5, seed=11)
    assert isinstance(policy, PSP) and (policy.sample, policy.staleness, policy.seed) == (3, 1, 11)
    with pytest.raises(ValueError, match="sample must be at least 1"):
        PSP(3, sample=0)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_psp_trains_the_digits_mlp_over_mpi(tmp_path):
    p = train(5, tmp_path, "sync.model=psp", "sync.sample=2", "sync.staleness=1", "optim.momentum=0.5",
              "straggler.slowdown=[1, 1, 1, 3]", "straggler.base_s=0.002")
    assert p.returncode == 0, p.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["sync"] == "psp" and s["test_accuracy"] >= 0.95
