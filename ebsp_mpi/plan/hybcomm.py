"""HybComm: the byte-cost model of Poseidon's hybrid communication, and the per-layer choice.

Poseidon (Zhang et al., USENIX ATC 2017, Sec. 3.2 "Hybrid Communication", Table 1) synchronizes each
dense layer either through the parameter servers (**PS**: the dense gradient goes up, the dense
weights come back) or by **sufficient-factor broadcasting** (**SFB**): a dense layer's weight gradient
over a batch of K samples is Σ_k u_k v_kᵀ (u: the error at the layer's output, v: its input), so the
factors U (K×M) and V (K×N) carry it in K·(M+N) floats instead of M·N. Whichever scheme moves fewer
bytes wins, layer by layer. This module is the arithmetic only: pure, no MPI, no arrays.

Units and notation
------------------
Every figure is **bytes per rank per iteration, sent + received**; a float is fp32 (``FLOAT_BYTES`` =
4). The weight of a dense layer is M×N, K is the per-worker batch. A figure for one role comes as a
:class:`Cost` ``(worker, server)``; :attr:`Cost.busiest` is what the busiest rank moves, the number
the choice compares (the busiest link sets the iteration's communication time).

Poseidon's Table 1, colocated servers (P nodes, each a worker and a server of 1/P of every tensor)
---------------------------------------------------------------------------------------------------
- **PS**: as a worker, a node pushes the (P−1)/P of the gradient that the other nodes' servers hold
  (its own 1/P stays local) and pulls the same share of the weights back: 2·MN·(P−1)/P floats. As a
  server, it receives the P−1 other workers' pushes of its 1/P and sends them its 1/P of the weights:
  2·MN·(P−1)/P floats. A node moves **4·MN·(P−1)/P floats** (Table 1's 2·MN·(P1+P2−2)/P2 at
  P1 = P2 = P).
- **SFB**: a node sends its K·(M+N) factors to each of the P−1 others and receives theirs:
  **2·K·(M+N)·(P−1) floats**; no server is involved.
- **Crossover**: the two are equal when 4·MN/P = 2·K·(M+N), at **P* = 2·MN / (K·(M+N))** nodes; SFB
  moves fewer bytes below P*, PS above. VGG19's fc6 (25088×4096) at K = 32: P* = 220.1.

This project's topology (P1 workers, P2 dedicated server ranks)
-------------------------------------------------------------------
The servers hold the parameters in P2 byte-balanced shards (docs/design.md, "Sharded servers"; P2 = 1
today). A server figure is one server's share of the layer's server traffic: the layer's total divided
by P2 (exact for P2 = 1; over a whole model, byte balancing gives each server about that share).

- **ps** (every bias and every conv layer, and the dense layers that PS wins): a worker pushes MN and
  pulls MN, **2·MN floats**; the servers take in P1 pushes and answer P1 pulls, **2·P1·MN/P2 floats**
  per server.
- **sfb, synchronous (BSP)**: each worker sends its factors K·(M+N) to the P1−1 other workers and to
  the layer's server (P1 copies) and receives the P1−1 others' sets: **(2·P1−1)·K·(M+N) floats**. The
  server receives the P1 sets, rebuilds the gradient to keep the true model, and sends nothing for that
  layer, since the workers rebuild it too and never pull it: **P1·K·(M+N)/P2 floats**. (Poseidon's SFB
  has no server; the extra copy to the server is what keeps the servers' model and snapshots exact.)
- **sfb, asynchronous (ASP, SSP, DSSP, ElasticBSP)**, Project Adam's variant ("factor push", Table 1's
  Adam row): a worker pushes its factors and pulls the dense weights, **K·(M+N) + MN floats**; the
  servers receive P1 factor sets and send P1 dense pulls, **P1·(K·(M+N) + MN)/P2 floats** per server.

**The crossover in the batch**, this topology: SFB wins a dense layer exactly when K < K*, with

- synchronous: **K* = 2·MN·max(1, P1/P2) / ((2·P1−1)·(M+N))** — PS's busiest rank moves
  2·MN·max(1, P1/P2) floats; SFB's busiest rank is always a worker, since 2·P1−1 ≥ P1 ≥ P1/P2;
- asynchronous: **K* = MN / (M+N)** — both schemes scale by the same max(1, P1/P2), so the comparison
  is K·(M+N) + MN against 2·MN, whatever P1 and P2.

SFB's fixed cost per layer (``comm.sfb_overhead_bytes``)
------------------------------------------------------
Bytes alone misjudge small layers. Across namespace nodes at 1 Gbit/s, K = 32, 2 – 4 workers, SFB took
1.11 – 1.76 × PS's time at 128 × 128 (3 runs) although its busiest rank moves 56 – 62 % fewer bytes,
and 0.11 – 0.81 × from 256 × 256 up (docs/cluster.md, "Poseidon on a network"). What SFB adds at
128 × 128, 0.3 – 1.9 ms an iteration, is neither bytes nor arithmetic: rebuilding the gradient from
the round's 64 – 128 factor rows takes 58 – 75 µs on one core (:func:`~ebsp_mpi.nn.factors.rebuild_gradient`).
What remains is the SFB path itself, each iteration and layer: two messages (V and U) to every other worker and
to the server, the receives of the others' factors, and the step each worker takes on its own, where
PS's layer rides in the push and the reply that carry the other tensors anyway.

The timed model prices it as a fixed cost **c bytes-equivalent per SFB layer per iteration** on each
rank that rebuilds the layer: the worker; under BSP the layer's server once a round (c / P2 as its
share), under the other models once per push (c·P1 / P2). ``auto`` then compares the busiest rank's
bytes + c against PS's bytes, which stay as they are. At large layers c vanishes against the
megabytes, and the choice is Poseidon's byte model again; ``c = 0`` is that model exactly. The
crossover in the batch becomes

- synchronous: **K*_c = K* − c / (4·(2·P1−1)·(M+N))**; asynchronous: **K*_c = K* − c / (4·(M+N))**

(:func:`crossover_batch_timed`). :data:`SFB_OVERHEAD_BYTES`, the default of ``comm.sfb_overhead_bytes``,
is the value that separates the measured winners: see its comment.

The choice
----------
:func:`choose` gives a :class:`HybCommPlan`: per weight tensor its scheme and its predicted
:class:`Cost` under both schemes. ``auto`` picks, per dense layer, the scheme whose busiest rank costs
less: bytes, plus ``sfb_overhead_bytes`` for SFB (a tie goes to ``ps``: the plainer path); ``sfb``
puts every dense layer on SFB; ``ps`` none. Biases and conv layers go through the servers whatever
the mode.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: bytes in one float on the wire (fp32)
FLOAT_BYTES = 4

#: the schemes a layer can take
SCHEMES = ("ps", "sfb")

#: the values of ``comm.hybrid``
MODES = ("ps", "sfb", "auto")

#: SFB's fixed cost per layer and iteration on a rank that rebuilds the layer, in bytes-equivalent
#: (bytes the busiest rank would move in the same time); the default of ``comm.sfb_overhead_bytes``.
#: Measured with ``bench hybcomm`` across 5 namespace nodes, every link at 1 Gbit/s (tc tbf), on 2 shared
#: cores, K = 32, 2 – 4 workers, one server: SFB was slower at 128 × 128 in 6 runs of 6, faster from
#: 256 × 256 to 2048 × 2048 in 3 of 3; at 192 × 192 it was faster in 5 of 6 runs with 4 workers and in
#: 2 of 6 with 2 and with 3 (SFB / PS time 0.78 – 1.23: a tie within the runs' noise). The gaps in
#: bytes (PS's busiest rank less SFB's) are 639 kB at 192 × 192 with 3 workers and 836 kB with 4;
#: 720 KiB lies between, keeping PS where SFB won less than half the runs. It is a bytes-equivalent of
#: time at that link rate and load: on one node, or at another rate, set the key (0: bytes alone).
SFB_OVERHEAD_BYTES = 720 * 1024


@dataclass(frozen=True)
class Cost:
    """Bytes one worker and one server move (sent + received) per iteration for one layer.

    Attributes
    ----------
    worker : float
        Bytes per iteration of one worker.
    server : float
        Bytes per iteration of one server (its share of the layer; 0 where no server takes part).
    colocated : bool
        True when each node is both a worker and a server (Poseidon's Table 1 setting): the node then
        moves ``worker + server`` bytes.
    """

    worker: float
    server: float
    colocated: bool = False

    @property
    def busiest(self) -> float:
        """Bytes per iteration of the rank that moves the most: max of the roles, or their sum when colocated."""
        return self.worker + self.server if self.colocated else max(self.worker, self.server)

    def __add__(self, other: Cost) -> Cost:
        # totals over layers: each role adds up on its own rank
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(self.worker + other.worker, self.server + other.server, self.colocated and other.colocated)

    def as_dict(self) -> dict[str, float]:
        """``{"worker", "server", "busiest"}`` in bytes per iteration, for JSON."""
        return {"worker": self.worker, "server": self.server, "busiest": self.busiest}


# --- argument checks -------------------------------------------------------------------------------

def _count(name: str, value, minimum: int = 1) -> int:
    """``value`` as an int, or a ValueError naming ``name`` (a bool is not a count)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} = {value!r}: must be an integer >= {minimum}")
    return int(value)


def _shape(m, n) -> tuple[int, int]:
    return _count("M (rows of the weight)", m), _count("N (columns of the weight)", n)


def _ranks(workers, servers) -> tuple[int, int]:
    return _count("workers (P1)", workers), _count("servers (P2)", servers)


def _batch(k) -> int:
    return _count("K (per-worker batch)", k)


# --- Poseidon's Table 1: colocated servers (Sec. 3.2) ----------------------------------------------

def poseidon_ps_bytes(m: int, n: int, p: int) -> Cost:
    """PS with colocated servers: bytes per node per iteration (Poseidon, Sec. 3.2, Table 1).

    Parameters
    ----------
    m, n : int
        The dense layer's weight is m×n.
    p : int
        Nodes, each a worker and a server of 1/p of every tensor.

    Returns
    -------
    Cost
        ``colocated=True``; worker and server roles each move 2·m·n·(p−1)/p floats, so ``busiest``
        is 4·m·n·(p−1)/p floats (× 4 bytes).
    """
    m, n = _shape(m, n)
    p = _count("P (nodes)", p)
    per_role = FLOAT_BYTES * 2 * m * n * (p - 1) / p
    return Cost(worker=per_role, server=per_role, colocated=True)


def poseidon_sfb_bytes(m: int, n: int, k: int, p: int) -> Cost:
    """SFB among p nodes: bytes per node per iteration (Poseidon, Sec. 3.2, Table 1).

    Parameters
    ----------
    m, n : int
        The dense layer's weight is m×n.
    k : int
        Per-worker batch (samples): the number of factor pairs (u, v).
    p : int
        Nodes.

    Returns
    -------
    Cost
        ``colocated=True``; the node sends its k·(m+n) factor floats to p−1 peers and receives
        theirs: worker 2·k·(m+n)·(p−1) floats (× 4 bytes), server 0.
    """
    m, n = _shape(m, n)
    k = _batch(k)
    p = _count("P (nodes)", p)
    return Cost(worker=float(FLOAT_BYTES * 2 * k * (m + n) * (p - 1)), server=0.0, colocated=True)


def crossover_workers(m: int, n: int, k: int) -> float:
    """Poseidon's crossover P* = 2·m·n / (k·(m+n)) nodes (colocated; Sec. 3.2, Table 1).

    Setting 4·mn·(P−1)/P = 2·k·(m+n)·(P−1) gives P*. SFB moves fewer bytes for P < P*, PS for P > P*.

    Returns
    -------
    float
        Nodes (not rounded).
    """
    m, n = _shape(m, n)
    k = _batch(k)
    return 2 * m * n / (k * (m + n))


# --- this project's topology: P1 workers, P2 dedicated servers ------------------------------------

def ps_bytes(m: int, n: int, workers: int, servers: int = 1) -> Cost:
    """A layer through the parameter servers: bytes per iteration of one worker and one server.

    A worker pushes the m×n gradient and pulls the m×n weights (2·m·n floats); the servers take in
    ``workers`` pushes and answer as many pulls, one server's share being 2·workers·m·n/servers
    floats (Poseidon, Sec. 3.2, Table 1, PS row, with P1 = ``workers``, P2 = ``servers``).

    Parameters
    ----------
    m, n : int
        The tensor's shape as m×n (a bias of length n: 1×n; a conv kernel: out × in·kh·kw).
    workers, servers : int
        P1 worker ranks and P2 server ranks.

    Returns
    -------
    Cost
        Bytes (fp32) per iteration.
    """
    m, n = _shape(m, n)
    workers, servers = _ranks(workers, servers)
    return Cost(worker=float(FLOAT_BYTES * 2 * m * n), server=FLOAT_BYTES * 2 * workers * m * n / servers)


def sfb_bytes(m: int, n: int, k: int, workers: int, servers: int = 1, synchronous: bool = True) -> Cost:
    """A dense layer by sufficient factors: bytes per iteration of one worker and one server.

    Synchronous (BSP): a worker sends its k·(m+n) factor floats to the other workers and to the
    layer's server (``workers`` copies) and receives the ``workers``−1 other sets:
    (2·workers−1)·k·(m+n) floats; the server receives ``workers`` sets and sends nothing (nobody pulls
    an SFB layer): workers·k·(m+n)/servers floats per server.

    Asynchronous (ASP, SSP, DSSP, ElasticBSP; Project Adam's factor push, Poseidon Sec. 3.2, Table 1,
    Adam row): a worker pushes k·(m+n) and pulls m·n floats; the servers receive ``workers`` factor
    sets and send ``workers`` dense pulls: workers·(k·(m+n) + m·n)/servers floats per server.

    Parameters
    ----------
    m, n : int
        The dense layer's weight is m×n.
    k : int
        Per-worker batch (samples).
    workers, servers : int
        P1 worker ranks and P2 server ranks.
    synchronous : bool
        True under BSP (workers broadcast to each other), False under the other models.

    Returns
    -------
    Cost
        Bytes (fp32) per iteration.
    """
    m, n = _shape(m, n)
    k = _batch(k)
    workers, servers = _ranks(workers, servers)
    factors = k * (m + n)
    if synchronous:
        return Cost(worker=float(FLOAT_BYTES * (2 * workers - 1) * factors),
                    server=FLOAT_BYTES * workers * factors / servers)
    return Cost(worker=float(FLOAT_BYTES * (factors + m * n)),
                server=FLOAT_BYTES * workers * (factors + m * n) / servers)


def crossover_batch(m: int, n: int, workers: int, servers: int = 1, synchronous: bool = True) -> float:
    """The per-worker batch K* below which SFB moves fewer bytes than PS on this topology.

    Synchronous: K* = 2·m·n·max(1, P1/P2) / ((2·P1−1)·(m+n)); asynchronous: K* = m·n / (m+n) (see the
    module docstring for the derivation). ``auto`` picks SFB exactly when K < K* (at K = K*, a tie,
    it keeps PS).

    Returns
    -------
    float
        Samples per worker (not rounded).
    """
    m, n = _shape(m, n)
    workers, servers = _ranks(workers, servers)
    if not synchronous:
        return m * n / (m + n)
    # max(1, P1/P2) as max(P2, P1)/P2, so that K* is one correctly rounded division of integers
    return 2 * m * n * max(workers, servers) / (servers * (2 * workers - 1) * (m + n))


def _overhead_bytes(value) -> float:
    """``value`` as a float >= 0, or a ValueError naming ``comm.sfb_overhead_bytes``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0 or value == float("inf"):
        raise ValueError(f"comm.sfb_overhead_bytes = {value!r}: must be a finite number >= 0")
    return float(value)


def sfb_overhead(workers: int, servers: int = 1, synchronous: bool = True,
                 overhead_bytes: float = SFB_OVERHEAD_BYTES) -> Cost:
    """SFB's fixed cost of one dense layer per iteration, in bytes-equivalent, for a worker and a server.

    A worker pays ``overhead_bytes`` once an iteration (its messages of the layer, the receives, its
    own step). Under BSP the layer's server rebuilds once a round; under the other models once per
    push, ``workers`` times; one server's share is that divided by ``servers``, as in :func:`sfb_bytes`.

    Parameters
    ----------
    workers, servers : int
        P1 worker ranks and P2 server ranks.
    synchronous : bool
        True under BSP.
    overhead_bytes : float
        c, bytes-equivalent per SFB layer and rebuild (``comm.sfb_overhead_bytes``; 0: none).

    Returns
    -------
    Cost
        Bytes-equivalent per iteration, to add to :func:`sfb_bytes`'s.
    """
    workers, servers = _ranks(workers, servers)
    c = _overhead_bytes(overhead_bytes)
    rebuilds = 1 if synchronous else workers
    return Cost(worker=c, server=c * rebuilds / servers)


def crossover_batch_timed(m: int, n: int, workers: int, servers: int = 1, synchronous: bool = True,
                          overhead_bytes: float = SFB_OVERHEAD_BYTES) -> float:
    """The per-worker batch below which SFB's bytes plus its fixed cost c are less than PS's bytes.

    Synchronous: K*_c = K* − c / (4·(2·P1−1)·(m+n)); asynchronous: K*_c = K* − c / (4·(m+n)), with K*
    from :func:`crossover_batch` (SFB's fixed cost adds to the same rank and role that its bytes make
    the busiest, so the comparison stays linear in K). ``auto`` with ``sfb_overhead_bytes = c`` picks
    SFB exactly when K < K*_c. With c = 0 it is :func:`crossover_batch`.

    Returns
    -------
    float
        Samples per worker (not rounded); 0 where SFB never wins.
    """
    m, n = _shape(m, n)
    workers, servers = _ranks(workers, servers)
    c = _overhead_bytes(overhead_bytes)
    copies = (2 * workers - 1) if synchronous else 1  # factor sets the busiest worker moves
    return max(0.0, crossover_batch(m, n, workers, servers, synchronous) - c / (FLOAT_BYTES * copies * (m + n)))


# --- the per-layer choice ---------------------------------------------------------------------------

@dataclass(frozen=True)
class LayerChoice:
    """One weight tensor's scheme and its predicted cost under each scheme.

    Attributes
    ----------
    name : str
        The tensor's name (as in the ParamSpace).
    m, n : int
        Its shape as m×n.
    dense : bool
        True for a dense layer's weight, the only kind SFB can carry.
    scheme : str
        ``"ps"`` or ``"sfb"``.
    ps : Cost
        Bytes per iteration through the servers.
    sfb : Cost or None
        Bytes per iteration by sufficient factors; None where SFB does not apply (not dense).
    sfb_overhead : Cost or None
        SFB's fixed cost per iteration in bytes-equivalent (:func:`sfb_overhead`), which ``auto`` adds
        to ``sfb``; None where SFB does not apply.
    """

    name: str
    m: int
    n: int
    dense: bool
    scheme: str
    ps: Cost
    sfb: Cost | None
    sfb_overhead: Cost | None = None

    @property
    def cost(self) -> Cost:
        """The cost of the chosen scheme."""
        return self.sfb if self.scheme == "sfb" else self.ps

    def as_dict(self) -> dict:
        return {"scheme": self.scheme, "m": self.m, "n": self.n, "dense": self.dense,
                "ps": self.ps.as_dict(), "sfb": None if self.sfb is None else self.sfb.as_dict(),
                "sfb_overhead": None if self.sfb_overhead is None else self.sfb_overhead.as_dict()}


@dataclass(frozen=True)
class HybCommPlan:
    """Per weight tensor, the scheme it takes, with the inputs the costs were computed from.

    Attributes
    ----------
    mode : str
        The ``comm.hybrid`` it was made under.
    batch, workers, servers : int
        K, P1, P2.
    synchronous : bool
        True under BSP.
    layers : tuple of LayerChoice
        In the order given.
    sfb_overhead_bytes : float
        c, SFB's fixed cost per layer in bytes-equivalent that ``auto`` weighed (0: bytes alone).
    """

    mode: str
    batch: int
    workers: int
    servers: int
    synchronous: bool
    layers: tuple[LayerChoice, ...]
    sfb_overhead_bytes: float = 0.0

    @property
    def schemes(self) -> dict[str, str]:
        """``{tensor name: "ps" | "sfb"}``."""
        return {c.name: c.scheme for c in self.layers}

    @property
    def sfb_layers(self) -> tuple[str, ...]:
        """Names of the tensors that go by sufficient factors, in order."""
        return tuple(c.name for c in self.layers if c.scheme == "sfb")

    def scheme(self, name: str) -> str:
        """The scheme of tensor ``name``; KeyError names the tensors there are."""
        for c in self.layers:
            if c.name == name:
                return c.scheme
        raise KeyError(f"no tensor {name!r} in the plan; it has {[c.name for c in self.layers]}")

    def total(self) -> Cost:
        """Bytes per iteration of one worker and one server over all tensors, as chosen."""
        return sum((c.cost for c in self.layers), Cost(0.0, 0.0))

    def as_dict(self) -> dict:
        """Plain data for the log, the trace attributes and summary.json (bytes per iteration)."""
        return {"mode": self.mode, "batch": self.batch, "workers": self.workers, "servers": self.servers,
                "synchronous": self.synchronous, "float_bytes": FLOAT_BYTES,
                "sfb_overhead_bytes": self.sfb_overhead_bytes,
                "layers": {c.name: c.as_dict() for c in self.layers}, "total": self.total().as_dict()}


def _layer(spec: Sequence) -> tuple[str, int, int, bool]:
    if isinstance(spec, str | bytes) or len(spec) != 4:
        raise ValueError(f"a layer is (name, M, N, is_dense); got {spec!r}")
    name, m, n, dense = spec
    if not isinstance(name, str) or not name:
        raise ValueError(f"a layer's name must be a non-empty string; got {name!r} in {spec!r}")
    if not isinstance(dense, bool):
        raise ValueError(f"layer {name!r}: is_dense must be True or False; got {dense!r}")
    try:
        m, n = _shape(m, n)
    except ValueError as e:
        raise ValueError(f"layer {name!r}: {e}") from None
    return name, m, n, dense


def _pick(mode: str, ps: Cost, sfb: Cost | None, overhead: Cost | None) -> str:
    if sfb is None or mode == "ps":
        return "ps"
    if mode == "sfb":
        return "sfb"
    # auto: the busiest rank sets the layer's communication time, SFB's fixed cost included; a tie
    # keeps the plainer path
    return "sfb" if (sfb + overhead).busiest < ps.busiest else "ps"


def choose(layers: Iterable[Sequence], batch: int, workers: int, servers: int = 1,
           synchronous: bool = True, mode: str = "auto", sfb_overhead_bytes: float = 0.0) -> HybCommPlan:
    """Choose PS or SFB for each weight tensor (Poseidon's HybComm, Sec. 3.2).

    Parameters
    ----------
    layers : iterable of (name, M, N, is_dense)
        Every weight tensor: a dense layer's weight M×N with ``is_dense`` True; a bias (1×N) or a conv
        kernel (out × in·kh·kw) with ``is_dense`` False.
    batch : int
        K, the per-worker batch (samples).
    workers, servers : int
        P1 worker ranks and P2 server ranks.
    synchronous : bool
        True under BSP (SFB broadcasts among the workers), False under ASP, SSP, DSSP and ElasticBSP
        (factor push, dense pull).
    mode : {"ps", "sfb", "auto"}
        ``comm.hybrid``.
    sfb_overhead_bytes : float
        c, SFB's fixed cost per layer and iteration in bytes-equivalent (``comm.sfb_overhead_bytes``,
        whose default is :data:`SFB_OVERHEAD_BYTES`); 0, the default here: Poseidon's byte model.

    Returns
    -------
    HybCommPlan

    Raises
    ------
    ValueError
        A mode, count, overhead or layer that is not allowed (the message names it), two tensors of one
        name, or ``mode="sfb"`` on a model without a dense layer.
    """
    if mode not in MODES:
        raise ValueError(f"comm.hybrid = {mode!r} is not one of {', '.join(map(repr, MODES))}")
    batch = _count("batch (K, per worker)", batch)
    workers, servers = _ranks(workers, servers)
    overhead = sfb_overhead(workers, servers, synchronous, sfb_overhead_bytes)
    specs = [_layer(s) for s in layers]
    names = [s[0] for s in specs]
    twice = sorted({x for x in names if names.count(x) > 1})
    if twice:
        raise ValueError(f"tensor names must be unique; given more than once: {', '.join(twice)}")
    if mode == "sfb" and not any(s[3] for s in specs):
        raise ValueError("comm.hybrid = 'sfb' needs a dense layer; this model has none")
    choices = []
    for name, m, n, dense in specs:
        ps = ps_bytes(m, n, workers, servers)
        sfb = sfb_bytes(m, n, batch, workers, servers, synchronous) if dense else None
        extra = overhead if dense else None
        choices.append(LayerChoice(name, m, n, dense, _pick(mode, ps, sfb, extra), ps, sfb, extra))
    return HybCommPlan(mode, batch, workers, servers, bool(synchronous), tuple(choices), overhead.worker)
