"""A run as Chrome Trace Event JSON, to open in Perfetto (ui.perfetto.dev) or chrome://tracing.

One process track per rank (``pid`` = MPI rank), times in microseconds on rank 0's clock:

- a worker (rank k + runtime.servers): thread "iterations", one slice per iteration with its phases nested inside
  (compute, injected straggler delay, push, wait for the pull);
- the server (rank 0): thread "evaluation" (test evaluations, with a "test accuracy" counter), thread
  "barriers" (ElasticBSP: decision to release, with ZipLine's predicted and the observed spread),
  thread "ZipLine" (its calls), and per worker a thread of its pulls (a slice while the pull is held)
  and pushes (instants, with their staleness). Every barrier release (ElasticBSP's barriers, BSP's
  rounds) is also a global instant: a vertical line across all tracks.

Format: the JSON Object Format of the Trace Event Format (``{"traceEvents": [...]}``); complete events
(``ph = "X"``), instants (``"i"``), counters (``"C"``) and metadata (``"M"``). Every event carries ``ph``,
``ts``, ``pid`` and ``tid``. Standard library and numpy only.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import numpy as np

from ..safe_text import clean_tree
from ..trace.frames import servers_of
from ..trace.reader import read_run

US = 1e6  # microseconds per second

#: thread ids on the server's track
TID_EVAL, TID_BARRIERS, TID_ZIPLINE, TID_WORKER0 = 1, 2, 3, 10
#: thread id of a worker's iterations on its own track
TID_ITERATIONS = 0


def _meta(pid: int, tid: int, name: str, args: dict) -> dict:
    return {"ph": "M", "name": name, "ts": 0, "pid": pid, "tid": tid, "args": args}


def _slice(name: str, pid: int, tid: int, t0: float, t1: float, cat: str, args: dict | None = None) -> dict:
    event = {"ph": "X", "name": name, "cat": cat, "ts": t0 * US, "dur": max(t1 - t0, 0.0) * US,
             "pid": pid, "tid": tid}
    if args:
        event["args"] = args
    return event


def _instant(name: str, pid: int, tid: int, t: float, cat: str, scope: str = "t", args: dict | None = None) -> dict:
    event = {"ph": "i", "name": name, "cat": cat, "ts": t * US, "pid": pid, "tid": tid, "s": scope}
    if args:
        event["args"] = args
    return event


def _py(row) -> dict:
    """A structured-array row as plain Python values (JSON needs no numpy scalars)."""
    return {name: row[name].item() for name in row.dtype.names}


def _json_value(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _strict_json(events: list[dict]) -> list[dict]:
    """The events with NaN and infinity as null: JSON has neither, Python writes them bare, and Perfetto
    and chrome://tracing then reject the whole file (a diverged run's losses are NaN)."""
    for event in events:
        for key, value in event.items():
            if key == "args":
                event[key] = {k: _json_value(v) for k, v in value.items()}
            else:
                event[key] = _json_value(value)
    return events


def _worker_events(rank: int, worker: int, iterations: np.ndarray, staleness: dict) -> list[dict]:
    events = [_meta(rank, 0, "process_name", {"name": f"rank {rank}: worker {worker}"}),
              _meta(rank, 0, "process_sort_index", {"sort_index": rank}),
              _meta(rank, TID_ITERATIONS, "thread_name", {"name": "iterations"})]
    for row in iterations:
        r = _py(row)
        t0, t_ce, t_push, t_end = r["t_start"], r["t_compute_end"], r["t_push"], r["t_end"]
        delay_begin = min(max(t_ce - r["injected_delay_s"], t0), t_ce)
        args = {"version": r["version"], "loss": r["loss"], "injected_delay_s": r["injected_delay_s"],
                "epoch": r["epoch"], "wait_s": r["wait_s"]}
        if (worker, r["iteration"]) in staleness:
            args["staleness"] = staleness[(worker, r["iteration"])]
        events.append(_slice(f"iteration {r['iteration']}", rank, TID_ITERATIONS, t0, t_end, "iteration", args))
        events.append(_slice("compute", rank, TID_ITERATIONS, t0, delay_begin, "phase"))
        if t_ce > delay_begin:
            events.append(_slice("straggler delay", rank, TID_ITERATIONS, delay_begin, t_ce, "phase"))
        events.append(_slice("push", rank, TID_ITERATIONS, t_ce, t_push, "phase"))
        events.append(_slice("wait for pull", rank, TID_ITERATIONS, t_push, t_end, "phase"))
    return events


def _release_times(tables: dict, sync: str) -> list[tuple[str, float]]:
    """(name, time) of each moment all workers were released together (see metrics.barrier_times)."""
    barriers = tables.get("barriers")
    if barriers is not None and len(barriers):
        return [(f"barrier {int(b['barrier'])} released", float(b["t_released"])) for b in barriers]
    pulls = tables.get("pulls")
    if sync == "bsp" and pulls is not None and len(pulls):
        order = np.argsort(pulls["t_reply"], kind="stable")
        t_sorted, v_sorted = pulls["t_reply"][order], pulls["version"][order]
        _, first = np.unique(v_sorted, return_index=True)
        return [(f"BSP round {int(v)} released", float(t))
                for v, t in zip(v_sorted[first], t_sorted[first], strict=True)]
    return []


def _server_events(tables: dict, workers: int, sync: str) -> list[dict]:
    events = [_meta(0, 0, "process_name", {"name": "rank 0: parameter server"}),
              _meta(0, 0, "process_sort_index", {"sort_index": 0}),
              _meta(0, TID_EVAL, "thread_name", {"name": "evaluation"}),
              _meta(0, TID_BARRIERS, "thread_name", {"name": "barriers"}),
              _meta(0, TID_ZIPLINE, "thread_name", {"name": "ZipLine"})]
    for w in range(workers):
        events.append(_meta(0, TID_WORKER0 + w, "thread_name", {"name": f"pulls and pushes of worker {w}"}))

    for r in map(_py, tables.get("evals", [])):
        events.append(_slice("evaluate", 0, TID_EVAL, r["t"], r["t"] + r["seconds"], "eval",
                             {"version": r["version"], "test_acc": r["test_acc"], "test_loss": r["test_loss"]}))
        if math.isfinite(r["test_acc"]):  # a counter sample needs a value
            events.append({"ph": "C", "name": "test accuracy", "ts": r["t"] * US, "pid": 0, "tid": TID_EVAL,
                           "args": {"test accuracy (%)": 100 * r["test_acc"]}})
    for r in map(_py, tables.get("zipline", [])):
        events.append(_slice("ZipLine", 0, TID_ZIPLINE, r["t"], r["t"] + r["seconds"], "zipline",
                             {"n": r["n"], "R": r["R"], "seconds": r["seconds"]}))
    for r in map(_py, tables.get("barriers", [])):
        events.append(_slice(f"barrier {r['barrier']}", 0, TID_BARRIERS, r["t_decided"], r["t_released"], "barrier",
                             {"predicted_time": r["predicted_time"], "predicted_spread_s": r["predicted_spread"],
                              "observed_spread_s": r["observed_spread"]}))
    for name, t in _release_times(tables, sync):
        events.append(_instant(name, 0, TID_BARRIERS, t, "barrier", scope="g"))
    for r in map(_py, tables.get("pulls", [])):
        tid = TID_WORKER0 + r["worker"]
        if r["t_reply"] > r["t_request"]:
            events.append(_slice("pull held", 0, tid, r["t_request"], r["t_reply"], "pull", {"version": r["version"]}))
        else:
            events.append(_instant("pull answered", 0, tid, r["t_reply"], "pull", args={"version": r["version"]}))
    for r in map(_py, tables.get("pushes", [])):
        events.append(_instant("push" + (" rejected" if r["rejected"] else ""), 0, TID_WORKER0 + r["worker"],
                               r["t"], "push", args={"iteration": r["iteration"], "staleness": r["staleness"],
                                                     "version_before": r["version_before"]}))
    return events


def trace_events(run_dir: str | os.PathLike) -> dict:
    """The Trace Event JSON object of a run (``{"traceEvents": [...], ...}``).

    Unreadable rank files are left out with a warning (from :func:`ebsp_mpi.trace.read_run`);
    ``otherData.missing_ranks`` lists them.
    """
    traces = read_run(run_dir)
    world = max(t.world_size for t in traces.values())
    server = traces.get(0)
    config = next((t.config for t in traces.values() if t.config), {})
    sync = (config.get("sync") or {}).get("model", "?")
    servers = servers_of(config)  # ranks 0..servers-1; workers after them
    staleness = {}
    if server is not None:
        pushes = server.table("pushes")
        staleness = {(int(w), int(i)): int(s) for w, i, s in zip(pushes["worker"], pushes["iteration"],
                                                                  pushes["staleness"], strict=True)}
    events: list[dict] = []
    if server is not None:
        events += _server_events(server.tables, max(world - servers, 0), sync)
    for rank, trace in sorted(traces.items()):
        if rank >= servers:
            events += _worker_events(rank, rank - servers, trace.table("iterations"), staleness)
        elif rank > 0:  # a shard server: a named track (rank 0 holds the schedule and its events)
            events += [_meta(rank, 0, "process_name", {"name": f"rank {rank}: server {rank} (a shard)"}),
                       _meta(rank, 0, "process_sort_index", {"sort_index": rank})]
    # parents before the slices nested in them: by start time, longer first
    events.sort(key=lambda e: (e["ts"], -e.get("dur", 0.0)))
    return {"traceEvents": _strict_json(events), "displayTimeUnit": "ms",
            "otherData": {"run": str(run_dir), "sync": sync, "world_size": world,
                          "missing_ranks": sorted(set(range(world)) - set(traces)),
                          "clock": "seconds since the run start on rank 0's clock, as microseconds"}}


def write(run_dir: str | os.PathLike, path: str | os.PathLike) -> dict:
    """Write the run's trace JSON to ``path``; returns the object written."""
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        doc = trace_events(run_dir)
    Path(path).write_text(json.dumps(clean_tree(doc), separators=(",", ":")))
    return doc
