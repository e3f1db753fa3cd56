"""OSDP's files: the profile (``python -m ebsp_mpi profile``) and the plan (``python -m ebsp_mpi plan``).

**Profile** (JSON, :data:`PROFILE_FORMAT`): the model it was taken on (kind, input shape, classes,
parameters), the device, the batch sizes, per layer in forward order its static shape (for a layer with
parameters: ``rows``, ``row_elems``, ``bias_elems``, ``bias_per_row``, ``split_temp_elems``,
``input_grad_elems``, see :class:`~ebsp_mpi.plan.osdp.Block`) and its ``forward_s`` and ``backward_s``
per batch size (medians), for a layer with parameters ``slices_s``: per slice count of ``splits`` (up
to its rows) the ``forward_s`` and ``backward_s`` of the layer run in that many slices, the loss's
``loss_s``, the measured ``activation_bytes`` per batch size, the servers' ``update_s`` (their
optimizer step over the parameters), the network (``latency_s``, ``bandwidth_bytes_per_s``, where they
come from, and ``overlap``: whether a fetch overlaps compute) and ``overhead_s``. Its ``version`` is
:data:`PROFILE_VERSION`.

**Plan** (JSON, :data:`PLAN_FORMAT`), what a job names with ``osdp.plan``: the model and
``batch_size`` it was made for, and per layer with parameters, in forward order, ``name``,
``tensors``, ``params``, ``mode`` (``"resident"`` or ``"on-demand"``), ``slices`` (1 unless split),
``slice_rows`` and ``slice_bytes`` (the rows and bytes of each slice, forward order; empty when
resident); then ``buffer_bytes`` (the preallocated fetch buffer: the largest unit in use plus the one
prefetched) and ``predicted`` (peak bytes by part, iteration seconds, samples per second).
Pure: json, and nn's layer classes.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..errors import UsageError
from ..nn.layers import Conv2D, Dense
from ..safe_text import clean_tree
from .osdp import RESIDENT, Block, CostModel, Plan

PROFILE_FORMAT = "ebsp-mpi osdp profile"
PLAN_FORMAT = "ebsp-mpi osdp plan"
VERSION = 1  # of plans
PROFILE_VERSION = 4  # 2: layers have input_grad_elems; 3: splits, and slices_s per layer; 4: update_s
SHAPE_KEYS = ("rows", "row_elems", "bias_elems", "bias_per_row", "split_temp_elems", "input_grad_elems")


class OsdpFileError(UsageError, ValueError):
    """A profile or plan file that cannot be used (one line naming the file and what is wrong)."""


# -- the model as the cost model sees it ------------------------------------------------------------


def model_layers(model) -> list[dict]:
    """Per layer of `model` in forward order: its name, type and parameters, and for a layer with
    parameters how it splits (:data:`SHAPE_KEYS`)."""
    out, counts = [], {}
    for layer in model.layers:
        kind = type(layer).__name__
        if layer.tensor_names:
            name = layer.tensor_names[0].split(".")[0]
        else:
            base = kind.lower().replace("2d", "")
            counts[base] = counts.get(base, 0) + 1
            name = f"{base}{counts[base]}"
        entry = {"name": name, "type": kind, "tensors": list(layer.tensor_names),
                 "params": sum(model.space.view(t).size for t in layer.tensor_names)}
        if isinstance(layer, Dense):
            entry.update(rows=layer.in_shape[0], row_elems=layer.out, bias_elems=layer.out, bias_per_row=False,
                         split_temp_elems=layer.out, input_grad_elems=layer.in_shape[0])
        elif isinstance(layer, Conv2D):
            c = layer.in_shape[0]
            kh, kw = layer.kernel
            entry.update(rows=layer.out_channels, row_elems=c * kh * kw, bias_elems=layer.out_channels,
                         bias_per_row=True, split_temp_elems=0, input_grad_elems=0)
        elif layer.tensor_names:
            raise ValueError(f"OSDP: no slicing known for layer {kind}")
        out.append(entry)
    return out


def check_batches_fit(model, batch_sizes: Sequence[int], where: str = "--batch-sizes") -> None:
    """Refuse, in one line, a batch size whose profiled step cannot fit in this machine's memory: its
    random inputs (drawn in float64, kept in the model's dtype) and the input each layer keeps for its
    backward pass, a lower bound of what the step allocates.

    Raises
    ------
    OsdpFileError
        Naming the batch size, the bytes and the memory.
    """
    from ..data.memory import exceeds_memory, format_bytes, memory_phrase

    itemsize = int(model.space.dtype.itemsize)
    inputs = math.prod(model.in_shape) * (8 + itemsize)
    kept = sum(math.prod(layer.in_shape) for layer in model.layers) * itemsize
    for b in sorted(batch_sizes, reverse=True):
        need = b * (inputs + kept)
        if exceeds_memory(need):
            raise OsdpFileError(f"{where}: a step at batch {b} needs at least {format_bytes(need)} (its inputs and "
                                f"the activations the layers keep), more than {memory_phrase()}; give smaller "
                                f"batch sizes")


def model_identity(model) -> dict:
    return {"kind": model.kind, "in_shape": list(model.in_shape), "num_classes": model.num_classes,
            "params": int(model.space.size)}


# -- profile ----------------------------------------------------------------------------------------


def read_profile(path: str | Path) -> dict:
    """A profile file, its structure checked."""
    where = f"--profile {path}"
    doc = _read_json(path, where)
    if doc.get("format") != PROFILE_FORMAT:
        raise OsdpFileError(f"{where}: not an OSDP profile (format {doc.get('format')!r}, expected "
                            f"{PROFILE_FORMAT!r}); write one with python -m ebsp_mpi profile JOB")
    if doc.get("version") != PROFILE_VERSION:
        raise OsdpFileError(f"{where}: a profile of version {doc.get('version')!r}, expected {PROFILE_VERSION}; "
                            f"write it again with python -m ebsp_mpi profile JOB")
    sizes = doc.get("batch_sizes")
    if not (isinstance(sizes, list) and sizes and all(isinstance(b, int) and b >= 1 for b in sizes)):
        raise OsdpFileError(f"{where}: batch_sizes must be a non-empty list of integers >= 1")
    n = len(sizes)
    layers = doc.get("layers")
    if not (isinstance(layers, list) and any(layer.get("params") for layer in layers if isinstance(layer, dict))):
        raise OsdpFileError(f"{where}: layers must be a list with at least one layer with parameters")
    splits = doc.get("splits")
    if not (isinstance(splits, list) and all(isinstance(x, int) and x >= 2 for x in splits)):
        raise OsdpFileError(f"{where}: splits must be a list of slice counts >= 2")
    for i, layer in enumerate(layers):
        if not (isinstance(layer, dict) and _times(layer.get("forward_s"), n) and _times(layer.get("backward_s"), n)):
            raise OsdpFileError(f"{where}: layers[{i}] needs forward_s and backward_s, {n} seconds each")
        if layer.get("params") and not all(isinstance(layer.get(k), (int, bool)) for k in SHAPE_KEYS):
            raise OsdpFileError(f"{where}: layers[{i}] ({layer.get('name')}) needs {', '.join(SHAPE_KEYS)}")
        if layer.get("params") and not _slice_times(layer, splits, n):
            raise OsdpFileError(f"{where}: layers[{i}] ({layer.get('name')}) needs slices_s: per slice count of "
                                f"splits up to its rows, forward_s and backward_s, {n} seconds each")
    if not _times(doc.get("loss_s"), n) or not _times(doc.get("activation_bytes"), n):
        raise OsdpFileError(f"{where}: loss_s and activation_bytes need {n} values each")
    if not _positive(doc.get("update_s"), zero=True):
        raise OsdpFileError(f"{where}: update_s must be the seconds of the servers' update, >= 0")
    net = doc.get("network", {})
    if not (_positive(net.get("latency_s"), zero=True) and _positive(net.get("bandwidth_bytes_per_s"))):
        raise OsdpFileError(f"{where}: network needs latency_s >= 0 and bandwidth_bytes_per_s > 0")
    return doc


def cost_models(profile: dict, batch_sizes: Sequence[int] | None = None, overhead_s: float | None = None,
                ) -> list[CostModel]:
    """One :class:`CostModel` per batch size of the profile (or of `batch_sizes`, each profiled)."""
    sizes = profile["batch_sizes"]
    wanted = list(batch_sizes) if batch_sizes else sizes
    missing = [b for b in wanted if b not in sizes]
    if missing:
        raise OsdpFileError(f"--batch-sizes {','.join(map(str, wanted))}: the profile has batch sizes "
                            f"{','.join(map(str, sizes))} only; profile {','.join(map(str, missing))} too")
    net = profile["network"]
    overhead = profile.get("overhead_s", 0.0) if overhead_s is None else overhead_s
    return [_cost_model(profile, sizes.index(b), b, net, overhead) for b in wanted]


def _cost_model(profile: dict, k: int, batch: int, net: dict, overhead: float) -> CostModel:
    prefix, blocks = 0.0, []
    for layer in profile["layers"]:
        f, b = layer["forward_s"][k], layer["backward_s"][k]
        if layer.get("params"):
            split = tuple((int(x), t["forward_s"][k], t["backward_s"][k]) for x, t in layer["slices_s"].items())
            blocks.append(Block(layer["name"], *(layer[key] for key in SHAPE_KEYS), f, b, split_s=split))
        elif blocks:  # a parameter-free layer joins the block before it
            last = blocks[-1]
            blocks[-1] = replace(last, after_forward_s=last.after_forward_s + f,
                                 after_backward_s=last.after_backward_s + b)
        else:
            prefix += f
    return CostModel(batch, tuple(blocks), prefix, profile["loss_s"][k], int(profile["activation_bytes"][k]),
                     float(net["latency_s"]), float(net["bandwidth_bytes_per_s"]),
                     int(profile.get("itemsize", 4)), float(overhead), bool(net.get("overlap", True)),
                     float(profile["update_s"]))


def check_profile_splits(profile: dict, splits: Sequence[int], where: str) -> None:
    """Slice counts the profile has no times for are refused: a slice's time is measured, not guessed."""
    missing = sorted(set(splits) - set(profile["splits"]))
    if missing:
        have = ",".join(map(str, profile["splits"])) or "none"
        raise OsdpFileError(f"{where}: no times for layers in {','.join(map(str, missing))} slices (the profile has "
                            f"{have}); profile again with --splits {','.join(map(str, splits))}")


def check_profile_fits(profile: dict, layers: list[dict], where: str) -> None:
    """A profile taken on another model than `layers` (names, parameters) is refused."""
    mine = [(entry["name"], entry["params"]) for entry in layers]
    theirs = [(entry.get("name"), entry.get("params")) for entry in profile["layers"]]
    if mine != theirs:
        raise OsdpFileError(f"{where}: profiled on layers {_names(theirs)}, but the job's model has "
                            f"{_names(mine)}; profile this job")


def network_from_bench(path: str | Path) -> tuple[float, float]:
    """``(latency_s, bandwidth)`` from ``bench mpi --json FILE``: the one-way time of the smallest
    message, and the median bandwidth of the cold messages (each from memory no cache holds, as a
    fetched unit is; ``bench.mpi``), or of a file without them, the bandwidth of the largest message."""
    records = _read_json(path, f"--bench {path}", kind=list)
    mpi = [r for r in records if isinstance(r, dict) and r.get("kind") == "mpi"]
    lat = [r for r in mpi if str(r.get("case", "")).startswith("latency ")]
    bw = [r for r in mpi if str(r.get("case", "")).startswith("bandwidth ")]
    cold = [r["figure"] for r in mpi if str(r.get("case", "")).startswith("cold bandwidth ")]
    if not lat or not bw:
        raise OsdpFileError(f"--bench {path}: no latency and bandwidth records of bench mpi; write them with "
                            f"mpiexec -n 2 python -m ebsp_mpi bench mpi --json FILE")
    smallest = min(lat, key=lambda r: _case_bytes(r["case"]))["figure"]
    if cold:
        return float(smallest), float(statistics.median(cold))
    return float(smallest), float(max(bw, key=lambda r: _case_bytes(r["case"]))["figure"])


def _case_bytes(case: str) -> int:
    number, _, unit = case.split(" ", 1)[1].partition(" ")  # "latency 4 MiB"
    return int(number) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}.get(unit, 1)


# -- plan -------------------------------------------------------------------------------------------


def plan_document(plan: Plan, cm: CostModel, profile: dict, limit: int, splits: Sequence[int]) -> dict:
    """The plan file for `plan` (made from `cm`, one of `profile`'s cost models)."""
    layers = []
    params = [entry for entry in profile["layers"] if entry.get("params")]
    for entry, block, s in zip(params, cm.blocks, plan.choices, strict=True):
        on_demand = s != RESIDENT
        rows = list(block.slice_rows(s)) if on_demand else []
        layers.append({"name": block.name, "tensors": entry.get("tensors", []), "params": block.params,
                       "mode": "on-demand" if on_demand else "resident", "slices": max(s, 1),
                       "slice_rows": rows, "slice_bytes": list(cm.unit_bytes(block, s)) if on_demand else []})
    m = plan.memory
    return {"format": PLAN_FORMAT, "version": VERSION, "model": profile.get("model", {}),
            "batch_size": plan.batch, "memory_limit_bytes": limit, "splits": list(splits),
            "buffer_bytes": m.buffer, "layers": layers,
            "predicted": {"peak_bytes": m.total, "resident_bytes": m.resident, "buffer_bytes": m.buffer,
                          "split_temp_bytes": m.split_temp, "input_grad_bytes": m.input_grad,
                          "activation_bytes": m.activations,
                          "iteration_s": plan.iteration_s, "samples_per_s": plan.samples_per_s},
            "network": profile["network"], "device": profile.get("device", ""),
            "update_s": cm.update_s, "overhead_s": cm.overhead_s}


def write_json(path: str | Path, doc) -> None:
    p = Path(path)
    try:
        p.write_text(json.dumps(clean_tree(doc), indent=1) + "\n")  # the device name, paths
    except OSError as e:
        raise OsdpFileError(f"--out {p}: cannot be written ({e.strerror or e})") from None


def read_plan(path: str | Path, where: str = "osdp.plan") -> dict:
    """A plan file, its structure checked (one line naming `where` and the file otherwise)."""
    at = f"{where} = {str(path)!r}"
    doc = _read_json(path, at)
    if doc.get("format") != PLAN_FORMAT or doc.get("version") != VERSION:
        raise OsdpFileError(f"{at}: not an OSDP plan of version {VERSION} (format {doc.get('format')!r}); write one "
                            f"with python -m ebsp_mpi plan JOB --memory-limit SIZE --out FILE")
    if not (isinstance(doc.get("batch_size"), int) and doc["batch_size"] >= 1):
        raise OsdpFileError(f"{at}: batch_size must be an integer >= 1")
    layers = doc.get("layers")
    if not (isinstance(layers, list) and layers):
        raise OsdpFileError(f"{at}: layers must be a non-empty list")
    for i, layer in enumerate(layers):
        ok = (isinstance(layer, dict) and isinstance(layer.get("name"), str)
              and layer.get("mode") in ("resident", "on-demand") and isinstance(layer.get("slices"), int)
              and layer["slices"] >= 1 and (layer["mode"] == "on-demand" or layer["slices"] == 1)
              and isinstance(layer.get("params"), int))
        if not ok:
            raise OsdpFileError(f"{at}: layers[{i}] needs name, params, mode (resident or on-demand) and slices "
                                f"(>= 1; 1 when resident)")
        if not (isinstance(layer.get("tensors"), list) and all(isinstance(t, str) for t in layer["tensors"])):
            raise OsdpFileError(f"{at}: layers[{i}] ({layer['name']}) needs tensors, a list of tensor names "
                                f"(found {_shown(layer.get('tensors'))})")
        rows = layer.get("slice_rows", [])
        if layer["mode"] == "on-demand" and not (isinstance(rows, list) and len(rows) == layer["slices"]
                                                 and all(_count(r) for r in rows)):
            raise OsdpFileError(f"{at}: layers[{i}] ({layer['name']}) needs slice_rows, one integer >= 1 per "
                                f"slice ({layer['slices']}; found {_shown(rows)})")
    if "buffer_bytes" in doc and not _count(doc["buffer_bytes"], least=0):
        raise OsdpFileError(f"{at}: buffer_bytes must be an integer >= 0 (found {_shown(doc['buffer_bytes'])})")
    predicted = doc.get("predicted", {})
    wrong = [key for key in ("peak_bytes", "iteration_s", "samples_per_s") if key in predicted
             and not _positive(predicted[key], zero=True)] if isinstance(predicted, dict) else ["predicted"]
    if wrong:
        raise OsdpFileError(f"{at}: predicted must hold numbers >= 0 (peak_bytes, iteration_s, samples_per_s); "
                            f"{wrong[0]} is not")
    return doc


def check_plan(doc: dict, layers: list[dict], batch_size: int, where: str) -> None:
    """A plan made for another model or batch size than the job's is refused, in one line."""
    mine = [(e["name"], e["params"]) for e in layers if e["params"]]
    theirs = [(e["name"], e["params"]) for e in doc["layers"]]
    if mine != theirs:
        raise OsdpFileError(f"{where}: made for layers {_names(theirs)}, but the job's model has {_names(mine)}; "
                            f"plan this job: python -m ebsp_mpi plan JOB --memory-limit SIZE")
    if doc["batch_size"] != batch_size:
        raise OsdpFileError(f"{where}: made for batches of {doc['batch_size']}, the job has data.batch_size = "
                            f"{batch_size}; set --set data.batch_size={doc['batch_size']} or plan again")
    by_name = {e["name"]: e for e in layers}
    for e in doc["layers"]:
        if e["mode"] == "on-demand" and (sum(e["slice_rows"]) != by_name[e["name"]]["rows"]
                                        or min(e["slice_rows"]) < 1):
            raise OsdpFileError(f"{where}: layer {e['name']}: slice_rows {e['slice_rows']} do not cover its "
                                f"{by_name[e['name']]['rows']} rows")


# -- helpers ----------------------------------------------------------------------------------------


def _read_json(path, where: str, kind=dict):
    """The JSON document in `path`; errors start with `where` (the option and the file)."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise OsdpFileError(f"{where}: not found") from None
    except IsADirectoryError:
        raise OsdpFileError(f"{where}: is a directory, not a JSON file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise OsdpFileError(f"{where}: not a readable JSON file ({e})") from None
    if not isinstance(doc, kind):
        raise OsdpFileError(f"{where}: expected a JSON {'object' if kind is dict else 'list'}")
    return doc


def _slice_times(layer: dict, splits: list[int], n: int) -> bool:
    """A layer's ``slices_s`` has times for each of `splits` up to its rows, and no others."""
    times = layer.get("slices_s")
    wanted = {str(x) for x in splits if x <= layer.get("rows", 0)}
    return (isinstance(times, dict) and set(times) == wanted
            and all(isinstance(t, dict) and _times(t.get("forward_s"), n) and _times(t.get("backward_s"), n)
                    for t in times.values()))


def _times(values, n: int) -> bool:
    return isinstance(values, list) and len(values) == n and all(_positive(v, zero=True) for v in values)


def _positive(v, zero: bool = False) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and (v >= 0 if zero else v > 0))


def _count(v, least: int = 1) -> bool:
    """An integer (not a bool, not a float) >= `least`."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def _shown(value) -> str:
    """A value from a file, shortened for a one-line message."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _names(pairs) -> str:
    return ", ".join(f"{name} ({params})" for name, params in pairs)
