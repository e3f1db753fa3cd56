"""The weights of the versions workers compute on, kept while some worker holds them.

The parameter server changes one weight buffer in place, step by step. A worker released with version
v computes its gradient on v's weights, which a later step may already have overwritten. A
:class:`VersionStore` keeps them: copy on write, a version is copied only when a step is about to
change the buffer while some worker still holds that version, and the copy is dropped when its last
holder lets go. It never holds more copies than there are distinct versions held, and with BSP, where
every worker holds the current version, none.

The emulated trainer (``sim.training``) computes every gradient on the weights it reads here; the
server's DC-ASGD rule (``nn.staleness``) reads here the weights each push was computed on.
"""

from __future__ import annotations


class VersionStore:
    """Copies of the held versions of `weights` (an array the caller changes in place).

    Call :meth:`hold` when a worker is given the current version, :meth:`changing` before every step
    that changes `weights`, and :meth:`release` when the worker no longer needs its version.
    """

    def __init__(self, weights, version: int = 0):
        self.weights, self.version = weights, version
        self.holders: dict[int, int] = {}
        self.copies: dict[int, object] = {}
        self.free: list = []  # dropped copies, reused for the next
        self.peak_copies = 0

    def hold(self, version: int) -> None:
        """A worker is given `version`, which must be the current one."""
        if version != self.version:
            raise ValueError(f"version {version} handed out, but the weights are at version {self.version}")
        self.holders[version] = self.holders.get(version, 0) + 1

    def changing(self, new_version: int) -> None:
        """A step is about to change the weights to `new_version`: copy the current version if held."""
        v = self.version
        if self.holders.get(v) and v not in self.copies:
            copy = self.free.pop() if self.free else self.weights.copy()
            copy[...] = self.weights
            self.copies[v] = copy
            self.peak_copies = max(self.peak_copies, len(self.copies))
        self.version = new_version

    def of(self, version: int):
        """The weights of a held `version` (the live buffer itself for the current one: read it before
        the next step)."""
        if version == self.version:
            return self.weights
        try:
            return self.copies[version]
        except KeyError:
            raise KeyError(f"version {version} is not held (current: {self.version})") from None

    def release(self, version: int) -> None:
        """A worker no longer needs `version`; its copy goes when no worker does."""
        count = self.holders.get(version, 0)
        if count < 1:
            raise ValueError(f"version {version} released more often than held")
        if count > 1:
            self.holders[version] = count - 1
            return
        del self.holders[version]
        copy = self.copies.pop(version, None)
        if copy is not None:
            self.free.append(copy)

    @property
    def held(self) -> int:
        """Distinct versions held now."""
        return len(self.holders)
