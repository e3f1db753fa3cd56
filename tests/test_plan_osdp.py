"""OSDP's planner: the dynamic programme against brute force, the memory model by hand, the plans as the
limit shrinks, the authors' table, sizes, plan files and the plan command's one-line errors."""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest

from ebsp_mpi.cli import main
from ebsp_mpi.nn.model import build_model
from ebsp_mpi.plan import osdp, osdp_authors
from ebsp_mpi.plan.osdp import ON_DEMAND, RESIDENT, Block, CostModel, Infeasible
from ebsp_mpi.plan.osdp_files import OsdpFileError, check_plan, model_layers, plan_document, read_plan, write_json
from ebsp_mpi.plan.sizes import parse_size
from cliutil import one_line_error

AUTHORS = Path(__file__).resolve().parents[2] / "shared" / "data" / "osdp-authors" / "gpt_block_profile.json"


def random_block(rng: random.Random, i: int, batch: int) -> Block:
    forward, backward = rng.random() * 1e-4 * batch, rng.random() * 2e-4 * batch
    # some slice counts profiled, each slower than the whole layer by up to 3x (a Conv2D's col2im per slice)
    split = tuple((s, forward * (1 + rng.random()), backward * (1 + 2 * rng.random()))
                  for s in osdp.SPLITS if rng.random() < 0.7)
    return Block(f"l{i}", rng.choice([1, 2, 3, 5, 8, 13]), rng.randint(1, 40), rng.randint(1, 9),
                 rng.random() < 0.5, rng.randint(0, 16), rng.randint(1, 30), forward, backward,
                 rng.random() * 1e-5, rng.random() * 1e-5, split)


def random_models(seed: int) -> list[CostModel]:
    """The same random network at two batch sizes (one profile, two rows of it)."""
    rng = random.Random(seed)
    n, latency, bandwidth, overlap = rng.randint(1, 5), rng.choice([0.0, 1e-6, 1e-4]), rng.choice([1e5, 1e7]), \
        rng.random() < 0.5
    update = rng.choice([0.0, 1e-3, 3e-2])  # none; about the pull of a few layers; beyond every pull
    models = []
    for batch in (8, 32):
        r = random.Random(seed * 7 + batch)
        models.append(CostModel(batch, tuple(random_block(r, i, batch) for i in range(n)), r.random() * 1e-5,
                                r.random() * 1e-5, 40 * batch, latency, bandwidth, 4, r.random() * 1e-4, overlap,
                                update_s=update))
    return models


def outcome(fn, models, limit):
    try:
        p = fn(models, limit)
    except Infeasible as e:
        return "infeasible", e.smallest.peak_bytes
    return p


@pytest.mark.parametrize("seed", range(40))
def test_planner_equals_brute_force(seed):
    models = random_models(seed)
    peaks = sorted({osdp.evaluate(cm, c).peak_bytes for cm in models
                    for c in itertools.product(*(osdp.choices_of(b) for b in cm.blocks))})
    for limit in {peaks[0] - 1, peaks[0], peaks[len(peaks) // 3], peaks[len(peaks) // 2], peaks[-1]}:
        dp, brute = outcome(osdp.plan, models, limit), outcome(osdp.plan_brute, models, limit)
        if isinstance(brute, tuple):
            assert dp == brute
            continue
        assert not isinstance(dp, tuple), (limit, brute)
        assert math.isclose(dp.samples_per_s, brute.samples_per_s, rel_tol=1e-12)
        assert dp.peak_bytes <= limit
        # what the programme says of its plan is what running the plan item by item says
        again = osdp.evaluate(next(cm for cm in models if cm.batch == dp.batch), dp.choices)
        assert again.memory == dp.memory
        assert math.isclose(again.iteration_s, dp.iteration_s, rel_tol=1e-12)


def equal_mlp(width: int = 64, overlap: bool = False, latency: float = 1e-6, bandwidth: float = 1e9) -> CostModel:
    """Three dense layers of width x width (+ bias) from the real model, timed in proportion to their size."""
    model = build_model("mlp", (width,), width, hidden=(width, width))
    blocks = []
    for e in model_layers(model):
        if not e["params"]:
            continue
        t = e["params"] * 1e-9
        blocks.append(Block(e["name"], e["rows"], e["row_elems"], e["bias_elems"], e["bias_per_row"],
                            e["split_temp_elems"], e["input_grad_elems"], t, 2 * t, 1e-6, 1e-6))
    return CostModel(16, tuple(blocks), 0.0, 1e-6, 10_000, latency, bandwidth, 4, 0.0, overlap)


def test_memory_by_hand():
    cm = equal_mlp(64)
    w = 65 * 64 * 4  # one layer's weights and bias in bytes
    # resident: weights and gradient; on-demand: one buffer, two units present only when adjacent
    assert osdp.memory(cm, (RESIDENT,) * 3).total == 6 * w + 10_000
    # an on-demand layer but the first holds its input gradient beside its input: batch 16 x 64 inputs
    dx = 16 * 64 * 4
    assert osdp.memory(cm, (ON_DEMAND, RESIDENT, RESIDENT)) == osdp.Memory(4 * w, w, 0, 0, 10_000)
    assert osdp.memory(cm, (ON_DEMAND, RESIDENT, ON_DEMAND)) == osdp.Memory(2 * w, w, 0, dx, 10_000)
    assert osdp.memory(cm, (ON_DEMAND, ON_DEMAND, RESIDENT)) == osdp.Memory(2 * w, 2 * w, 0, dx, 10_000)
    # split in 2: 32 rows of 64 a slice, the bias with the last; two adjacent slices; the output temporary
    m = osdp.memory(cm, (2, 2, 2))
    assert m == osdp.Memory(0, (32 * 64 + 32 * 64 + 64) * 4, 16 * 64 * 4, dx, 10_000)
    assert cm.blocks[0].slice_elems(3) == (22 * 64, 21 * 64, 21 * 64 + 64)


def test_a_split_layer_takes_its_profiled_time_in_slices():
    cm = equal_mlp(64, overlap=False, latency=0.0, bandwidth=1e12)
    middle = cm.blocks[1]
    slower = replace(middle, split_s=((2, 3 * middle.forward_s, 5 * middle.backward_s),))
    cm2 = replace(cm, blocks=(cm.blocks[0], slower, cm.blocks[2]))
    assert slower.seconds(2) == (3 * middle.forward_s, 5 * middle.backward_s)
    assert slower.seconds(4) == slower.seconds(ON_DEMAND) == slower.seconds(RESIDENT) == (middle.forward_s,
                                                                                           middle.backward_s)
    for choices in ((0, 2, 0), (1, 2, 4)):
        extra = 2 * middle.forward_s + 4 * middle.backward_s
        assert math.isclose(osdp.simulate(cm2, choices), osdp.simulate(cm, choices) + extra, rel_tol=1e-12)
    for p in osdp.front(cm2):  # the search counts the slices' time as the chain does
        assert math.isclose(p.iteration_s, osdp.simulate(cm2, p.choices), rel_tol=1e-12), p.choices


def test_time_by_hand_without_overlap():
    cm = equal_mlp(64, overlap=False, latency=1e-3, bandwidth=1e6)
    w = 65 * 64 * 4
    compute = sum(b.forward_s + b.backward_s + b.after_forward_s + b.after_backward_s for b in cm.blocks) + cm.loss_s
    resident = osdp.simulate(cm, (RESIDENT,) * 3)
    # the pull of all weights, and the last push (the first layer's); the other pushes overlap the backward
    assert math.isclose(resident, compute + (1e-3 + 3 * w / 1e6) + (1e-3 + w / 1e6))
    one = osdp.simulate(cm, (RESIDENT, ON_DEMAND, RESIDENT))
    # two fetches (request + reply) and one push of the middle layer, waited for, instead of its pull
    assert math.isclose(one - resident, 2 * (2e-3 + w / 1e6) + (1e-3 + w / 1e6) - w / 1e6)
    # the servers' update, when longer than the pull, sets the round's end whatever the plan
    slow = replace(cm, update_s=1.0)
    assert math.isclose(osdp.simulate(slow, (RESIDENT,) * 3), resident - (1e-3 + 3 * w / 1e6) + 1.0)
    assert math.isclose(osdp.simulate(slow, (RESIDENT, ON_DEMAND, RESIDENT)), one - (1e-3 + 2 * w / 1e6) + 1.0)
    first = osdp.simulate(cm, (ON_DEMAND, RESIDENT, RESIDENT))  # block 0 on demand: its push waited for, none last
    assert math.isclose(first - resident, 2 * (2e-3 + w / 1e6) + (1e-3 + w / 1e6) - 2 * w / 1e6)


def categories_as_limit_shrinks(cm: CostModel) -> list[str]:
    start = osdp.all_resident(cm).peak_bytes
    smallest = osdp.front(cm)[0].peak_bytes
    found = []
    for limit in range(start + 1000, smallest - 2000, -97):
        try:
            found.append(osdp.category(osdp.plan([cm], limit).choices))
        except Infeasible as e:
            assert e.smallest.peak_bytes == smallest
            found.append("infeasible")
    return [c for c, _ in itertools.groupby(found)]


@pytest.mark.parametrize("overlap, latency", [(False, 2e-5), (False, 5e-5), (True, 2e-5), (True, 5e-5)])
def test_plans_as_the_limit_shrinks(overlap, latency):
    """Each step trades more transfers for less memory: on-demand layers first (each saves its gradient
    and, when not next to another, its weights' second copy), then all of them, then slices. (With a
    latency near zero, a layer's slices cost no more than the whole layer on demand, and splitting one
    layer comes before a second one on demand: a step of memory for less time.)"""
    order = ["all-resident", "mixed", "all-on-demand", "split", "infeasible"]
    assert categories_as_limit_shrinks(equal_mlp(64, overlap=overlap, latency=latency)) == order


def test_infeasible_names_the_smallest_plan():
    cm = equal_mlp(64)
    smallest = osdp.front(cm)[0]
    with pytest.raises(Infeasible) as e:
        osdp.plan([cm], smallest.peak_bytes - 1)
    assert e.value.smallest.peak_bytes == smallest.peak_bytes
    assert osdp.plan([cm], smallest.peak_bytes).peak_bytes == smallest.peak_bytes
    assert all(s == 8 for s in smallest.choices)  # the least memory splits every layer as far as allowed


def test_larger_batch_wins_when_it_fits():
    small = equal_mlp(64)
    large = CostModel(64, small.blocks, 0.0, 1e-6, 10**6, small.latency_s, small.bandwidth, 4, 0.0, False)
    roomy = osdp.plan([small, large], 10**9)
    assert roomy.batch == 64  # same compute per iteration, four times the samples
    assert osdp.front(large)[0].peak_bytes > osdp.all_resident(small).peak_bytes
    tight = osdp.plan([small, large], osdp.all_resident(small).peak_bytes)
    assert tight.batch == 16 and tight.choices == (RESIDENT,) * 3


@pytest.mark.parametrize("text, expected", [
    ("512MiB", 512 << 20), ("2GB", 2_000_000_000), ("100k bytes", 100_000), ("4096", 4096),
    ("1.5 GiB", 3 << 29), ("7 bytes", 7), ("3 kB", 3000),
])
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["12 parsecs", "0", "-3MB", "5iB", "MiB", "", "1e400GB"])
def test_bad_sizes(text):
    with pytest.raises(ValueError, match="--memory-limit"):
        parse_size(text, "--memory-limit")


def test_plan_file_round_trip_and_mismatch(tmp_path):
    model = build_model("mlp", (64,), 64, hidden=(64, 64))
    layers = model_layers(model)
    cm = equal_mlp(64)
    best = osdp.plan([cm], osdp.all_resident(cm).peak_bytes - 1)
    profile = {"model": {}, "layers": layers, "network": {"latency_s": 1e-6, "bandwidth_bytes_per_s": 1e9}}
    path = tmp_path / "plan.json"
    write_json(path, plan_document(best, cm, profile, 123456, osdp.SPLITS))
    doc = read_plan(path)
    check_plan(doc, layers, 16, "osdp.plan")
    assert [e["mode"] for e in doc["layers"]].count("on-demand") >= 1
    with pytest.raises(OsdpFileError, match=r"data\.batch_size"):
        check_plan(doc, layers, 32, "osdp.plan")
    other = model_layers(build_model("mlp", (64,), 64, hidden=(32, 64)))
    with pytest.raises(OsdpFileError, match="made for layers"):
        check_plan(doc, other, 16, "osdp.plan")
    doc["layers"][0].update(mode="resident", slices=3)
    path.write_text(json.dumps(doc))
    with pytest.raises(OsdpFileError, match="slices"):
        read_plan(path)


# -- the authors' problem -------------------------------------------------------------------------

TABLE = [  # blocks, hidden, device MB, row, time, memory, counts (the shared README's table)
    (48, 1536, 8192, 1, 2.901937, 7304, (0, 2, 46, 0)),
    (48, 1536, 8192, 2, None, None, None),
    (24, 1024, 8192, 1, 0.545831, 4056, (24, 0, 0, 0)),
    (24, 2048, 8192, 1, 2.627892, 7308, (0, 2, 22, 0)),
    (24, 2048, 8192, 2, 2.815118, 7346, (0, 0, 22, 2)),
    (48, 2048, 8192, 1, None, None, None),
]


def authors(capsys, *args) -> dict:
    code = main(["plan", "--osdp-profile", str(AUTHORS), *map(str, args), "--json"])
    assert code == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.skipif(not AUTHORS.is_file(), reason="../shared/data/osdp-authors is not here")
@pytest.mark.parametrize("blocks, hidden, mb, row, time_s, memory_mb, counts", TABLE)
def test_authors_table(capsys, blocks, hidden, mb, row, time_s, memory_mb, counts):
    out = authors(capsys, "--blocks", blocks, "--hidden", hidden, "--memory-mb", mb, "--row", row)
    assert out["row"] == row and out["budget_mb"] == mb - 800
    if time_s is None:
        assert out["feasible"] is False
        return
    assert out["feasible"] is True
    assert round(out["time_s"], 6) == time_s and out["memory_mb"] == memory_mb
    assert out["strategy_counts"] == {f"s{k}": n for k, n in enumerate(counts)}


@pytest.mark.skipif(not AUTHORS.is_file(), reason="../shared/data/osdp-authors is not here")
def test_authors_rule_is_not_the_best_throughput(capsys):
    out = authors(capsys, "--blocks", 24, "--hidden", 2048, "--memory-mb", 8192)
    # row 1 has the least summed time (2.63 s for batch 1), row 2 the most samples per second (2 / 2.82 s)
    assert out["authors_rule_row"] == 1 and out["row"] == 2
    assert math.isclose(out["samples_per_s"], 2 / out["time_s"])
    none = authors(capsys, "--blocks", 48, "--hidden", 2048, "--memory-mb", 8192)
    assert none["feasible"] is False and none["authors_rule_row"] is None  # only row 0 fits; it has no batch


def brute_force_authors(blocks: int, mem: list[int], time: list[float], budget: int):
    """Every split of `blocks` into four counts, in order: the first of least summed time that fits."""
    best = None
    for counts in itertools.product(range(blocks + 1), repeat=3):
        if sum(counts) > blocks:
            continue
        counts = (*counts, blocks - sum(counts))
        if sum(n * m for n, m in zip(counts, mem, strict=True)) > budget:
            continue
        total = math.fsum(n * t for n, t in zip(counts, time, strict=True))
        if best is None or total < best[0]:
            best = (total, counts)
    return best


def one_row_profile(mem: list[int], time: list[float], hidden: int = 512) -> dict:
    return {"hidden_sizes": [hidden], "mem_mb": [[mem]], "time_s": [[time]], "extra_overhead_mb": 0}


@pytest.mark.parametrize("seed", range(40))
def test_authors_solver_equals_brute_force(seed):
    """The O(B²) search against every split; times in eighths (exact in binary), so that ties are
    ties for both, and the brute force's first is the fewest blocks at strategy 0, then 1, then 2."""
    rng = random.Random(seed)
    blocks = rng.randint(1, 14)
    mem = [rng.randint(0, 12) for _ in range(4)]
    time = [rng.randint(0, 6) / 8 if seed % 2 else rng.uniform(0.01, 1.0) for _ in range(4)]
    budget = rng.randint(0, blocks * max(mem) + 2)
    got = osdp_authors.solve(one_row_profile(mem, time), blocks, 512, budget, 0)
    expected = brute_force_authors(blocks, mem, time, budget)
    if expected is None:
        assert not got.feasible
    else:
        assert got.feasible and got.counts == expected[1] and got.time_s == expected[0]


@pytest.mark.timeout(120)
def test_the_authors_problem_with_thousands_of_blocks_is_solved_and_more_refused(capsys, tmp_path):
    """The cubic search ran for minutes at 800 blocks and hung at 10**9; the O(B²) one plans up to
    MAX_BLOCKS and refuses more in one line. Time against memory is strictly convex here (10 MB more
    saves 2, 1.5, then 0.5 ms), so at 25 MB a block the one best split is half at 20 MB and half at 30 MB,
    as the brute force finds at 8 blocks."""
    mem, time = [40, 30, 20, 10], [0.01, 0.015, 0.03, 0.05]
    assert brute_force_authors(8, mem, time, 25 * 8)[1] == (0, 4, 4, 0)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(one_row_profile(mem, time)))
    blocks = osdp_authors.MAX_BLOCKS
    assert main(["plan", "--osdp-profile", str(profile), "--blocks", str(blocks), "--hidden", "512",
                 "--memory-mb", str(25 * blocks), "--row", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["strategy_counts"] == {"s0": 0, "s1": blocks // 2, "s2": blocks // 2, "s3": 0}
    line = one_line_error(capsys, ["plan", "--osdp-profile", str(profile), "--blocks", "1000000000", "--hidden",
                                   "512", "--memory-mb", "8192"])
    assert f"--blocks 1000000000: plans 1 to {blocks} blocks" in line


# -- one-line errors ------------------------------------------------------------------------------


SMALL = ["--set", "data.name=synthetic", "--set", "data.synthetic_samples=200", "--set", "model.hidden=[32]",
         "--reps", "1", "--warmup", "0", "-q"]


@pytest.mark.parametrize("args, words", [
    (["--memory-limit", "12 parsecs"], ["--memory-limit", "MiB"]),
    ([], ["--memory-limit SIZE"]),
    (["--memory-limit", "1k"], ["smallest limit that fits is", "bytes"]),
    (["--memory-limit", "1GB", "--splits", "1,2"], ["--splits"]),
    (["--memory-limit", "1GB", "--profile", "/no/such/profile.json"], ["/no/such/profile.json", "not found"]),
    (["--memory-limit", "1GB", "--blocks", "4"], ["--osdp-profile"]),
])
def test_plan_job_errors(capsys, tmp_path, args, words):
    line = one_line_error(capsys, ["plan", *SMALL, "--out", str(tmp_path / "plan.json"), *args])
    for word in words:
        assert word in line
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("args, words", [
    (["--blocks", "4", "--hidden", "1536"], ["--memory-mb"]),
    (["--blocks", "4", "--hidden", "1000", "--memory-mb", "8192"], ["--hidden 1000", "1536"]),
    (["--blocks", "4", "--hidden", "1536", "--memory-mb", "8192", "--row", "7"], ["--row 7"]),
    (["--blocks", "4", "--hidden", "1536", "--memory-mb", "8192", "--row-batches", "1,2"], ["--row-batches"]),
])
def test_authors_errors(capsys, args, words):
    if not AUTHORS.is_file():
        pytest.skip("../shared/data/osdp-authors is not here")
    line = one_line_error(capsys, ["plan", "--osdp-profile", str(AUTHORS), *args])
    for word in words:
        assert word in line


def test_authors_profile_not_json(capsys, tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text("{not json")
    assert "not a readable JSON file" in one_line_error(
        capsys, ["plan", "--osdp-profile", str(bad), "--blocks", "2", "--hidden", "512", "--memory-mb", "900"])
