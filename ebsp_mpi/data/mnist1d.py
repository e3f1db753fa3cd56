"""MNIST-1D (Greydanus & Kobak), generated on this machine by the ``mnist1d`` package and cached.

The package's ``make_dataset`` draws each sample from ten 1-D digit templates (padding, scaling,
translation, correlated and i.i.d. noise, shear) under its own default arguments; only the sample
count is changed here. Its ``get_dataset`` is never called: that one downloads a pickle first.
The set comes with its published split (the first 80 % of the shuffled samples train, the rest
test) and is the same for every job seed (the generator's seed is part of its arguments, 42).

Generating takes about a millisecond a sample, so the arrays are cached in an HDF5 file named by
the sample count and a hash of every generator argument and the package version, in ``data.root`` or
else the user's cache directory (``$XDG_CACHE_HOME/ebsp-mpi``, default ``~/.cache/ebsp-mpi``). The
file is laid out as ``data.name = "hdf5"`` reads (``x``, ``y``, ``x_test``, ``y_test``, root attribute
``num_classes``): it is the set's HDF5 export, usable where the package is not installed. Ranks that
start together wait on a lock file while one of them generates, and the file appears whole or not
at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import tempfile

import numpy

from .errors import DatasetError
from .memory import exceeds_memory, format_bytes, memory_phrase

NUM_CLASSES = 10
SEQUENCE = 40  # final_seq_length of the generator's defaults; checked against them
INPUT_SHAPE = (1, 1, SEQUENCE)  # a single-channel image of height 1: Conv2D with (1, k) kernels runs 1-D
INSTALL = "pip install 'ebsp-mpi[mnist1d]' (or pip install mnist1d==0.0.2.post1)"
FORMAT = 1  # of the cache file; part of its key


def load_mnist1d(samples: int, root: str = ""):
    """The MNIST-1D train and test splits of ``samples`` generated samples.

    Parameters
    ----------
    samples : int
        Samples generated, a multiple of 10 (the generator makes ``samples // 10`` of each digit);
        5000 is the published set (4000 train, 1000 test).
    root : str
        Directory of the cache file; empty: the user's cache directory.

    Returns
    -------
    x_train, y_train, x_test, y_test : numpy.ndarray
        float32 ``(N, 1, 1, 40)`` and int64 ``(N,)``, as the generator standardised them (over the
        whole set, before its split).
    num_classes : int
    input_shape : tuple
    """
    _check_samples(samples)
    args = generator_arguments(samples)
    path = os.path.join(cache_directory(root), cache_name(args))
    if not os.path.isfile(path):
        with _exclusive(path):
            if not os.path.isfile(path):  # another process may have made it while this one waited
                _write(path, generate(args), args)
    return (*_read(path, samples), NUM_CLASSES, INPUT_SHAPE)


def _check_samples(samples) -> None:
    if isinstance(samples, bool) or not isinstance(samples, (int, numpy.integer)) or samples < 10 \
            or samples % NUM_CLASSES:
        raise DatasetError(f"data.samples = {samples!r}; expected a multiple of 10, at least 10 (MNIST-1D "
                           f"generates samples // 10 of each digit)")
    # the generator's float64 samples, their stacked copy, and the float32 arrays read back
    need = samples * SEQUENCE * (8 + 8 + 4) + samples * 8 * 3
    if exceeds_memory(need):
        raise DatasetError(f"data.samples = {samples} needs {format_bytes(need)} to generate MNIST-1D, more "
                           f"than {memory_phrase()}; make it smaller")


def _generator():
    """The package's ``(get_dataset_args, make_dataset, version)``, or one line saying how to install it."""
    try:
        from importlib.metadata import version

        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError:
        raise DatasetError(f"data.name = 'mnist1d' needs the package mnist1d, which is not installed: "
                           f"{INSTALL}") from None
    return get_dataset_args, make_dataset, version("mnist1d")


def generator_arguments(samples: int) -> dict:
    """The generator's default arguments with ``num_samples = samples`` (the download URL left out)."""
    get_dataset_args, _, package_version = _generator()
    args = dict(get_dataset_args(as_dict=True))
    args.pop("url", None)  # only get_dataset's download reads it
    if args.get("final_seq_length") != SEQUENCE:
        raise DatasetError(f"mnist1d {package_version} makes sequences of {args.get('final_seq_length')} points; "
                           f"expected {SEQUENCE}: {INSTALL}")
    args["num_samples"] = int(samples)
    args["package_version"] = package_version
    return args


def cache_directory(root: str = "") -> str:
    """``root``, or ``$XDG_CACHE_HOME/ebsp-mpi`` (default ``~/.cache/ebsp-mpi``), created if missing."""
    if root:
        directory = os.path.abspath(os.path.expanduser(root))
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        directory = os.path.join(base, "ebsp-mpi")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise DatasetError(f"data.root = {directory}: cannot make the MNIST-1D cache directory ({e.strerror}); "
                           f"set data.root to a writable directory") from None
    return directory


def cache_name(args: dict) -> str:
    """The cache file's name: the sample count, then a hash of every argument that shapes the data."""
    key = json.dumps({"format": FORMAT, **args}, sort_keys=True)
    return f"mnist1d-{args['num_samples']}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.h5"


def generate(args: dict) -> dict:
    """Run the package's ``make_dataset`` on `args`; the global random states it reseeds are restored."""
    get_dataset_args, make_dataset, _ = _generator()
    view = get_dataset_args()  # the package's own argument object, its defaults replaced by `args`
    for key, value in args.items():
        if key != "package_version":
            setattr(view, key, value)
    numpy_state, python_state = numpy.random.get_state(), random.getstate()
    try:
        made = make_dataset(view)
    finally:
        numpy.random.set_state(numpy_state)
        random.setstate(python_state)
    return {key: made[key] for key in ("x", "y", "x_test", "y_test")}


@contextlib.contextmanager
def _exclusive(path: str):
    """Hold an exclusive lock on ``path + '.lock'`` (where the system has ``fcntl``)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: the atomic rename alone keeps the file whole
        yield
        return
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write(path: str, arrays: dict, args: dict) -> None:
    """Write the set as the ``hdf5`` dataset's layout (so ``data.name = "hdf5"`` with ``data.path`` = this
    file reads the same arrays) to a temporary file beside ``path``, then rename it: readers see all or
    nothing."""
    import h5py

    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".mnist1d-", suffix=".h5")
    os.close(handle)
    try:
        with h5py.File(temporary, "w") as f:
            for key in ("x", "x_test"):
                f.create_dataset(key, data=arrays[key].astype(numpy.float32).reshape((-1,) + INPUT_SHAPE))
            for key in ("y", "y_test"):
                f.create_dataset(key, data=arrays[key].astype(numpy.int64))
            f.attrs["num_classes"] = NUM_CLASSES
            f.attrs["mnist1d_arguments"] = json.dumps(args, sort_keys=True)
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp's 0600 would keep a shared data.root's file private
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _read(path: str, samples: int):
    """The four arrays of a cache file, checked against the published split of ``samples`` samples."""
    import h5py

    fix = "delete it to generate it again"
    try:
        with h5py.File(path, "r") as f:
            x, y, x_test, y_test = (f[key][...] for key in ("x", "y", "x_test", "y_test"))
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise DatasetError(f"{path}: not a readable MNIST-1D cache file ({e}); {fix}") from None
    train = int(samples * 0.8)  # make_dataset's split_ix with train_split = 0.8
    expected = {"x": (train, *INPUT_SHAPE), "y": (train,), "x_test": (samples - train, *INPUT_SHAPE),
                "y_test": (samples - train,)}
    for key, array in zip(expected, (x, y, x_test, y_test), strict=True):
        if array.shape != expected[key]:
            raise DatasetError(f"{path}: {key} has shape {array.shape}; expected {expected[key]}; {fix}")
    for key, labels in (("y", y), ("y_test", y_test)):
        if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
            raise DatasetError(f"{path}: {key} holds labels outside 0..9; {fix}")
    return x.astype(numpy.float32), y.astype(numpy.int64), x_test.astype(numpy.float32), y_test.astype(numpy.int64)
