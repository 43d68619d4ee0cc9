"""How much of a service's time each asker used lately: a ledger paid back at a share of a core.

A service that answers every tenant's questions bounds how many run at once; this bounds the
work they take over time, so that one asker asking in a loop takes its share, not the whole
service (nor, in ``corral up``, the loop every service shares). Pure: the caller gives the time.
"""

from __future__ import annotations


class Spent:
    """Seconds of work questions used (a what-if's simulation, a read service's answer), per
    asker and in all, paid back at ``share`` of a core a second: a question is taken while what
    its asker, and everyone, owe is under ``most_s``, and charged what it used once answered
    (what a question costs is known only then: a few milliseconds, or its whole budget on a deep
    backlog). What everyone owes binds only askers who used half their own ``most_s`` lately: one
    asker using the whole of it had every other tenant's question answered busy. The number of
    questions running at once bounds the work in flight; this bounds the work over time, since
    each question holds the interpreter's lock that the service's loop (in ``corral up``, every
    service) shares. Pure: the caller gives the time."""

    def __init__(self, share: float, most_s: float, share_all: float, most_all_s: float) -> None:
        self.share, self.most_s, self.share_all, self.most_all_s = share, most_s, share_all, most_all_s
        self._owed: dict[str, tuple[float, float]] = {}  # asker ("": all): (seconds, as of)

    def _now_owed(self, key: str, now: float) -> float:
        owed, at = self._owed.get(key, (0.0, now))
        share = self.share_all if key == "" else self.share
        return max(0.0, owed - max(0.0, now - at) * share)

    def wait_s(self, asker: str, now: float) -> float:
        """0.0 when ``asker`` may ask now; else the seconds until it may."""
        own = self._now_owed(asker, now)
        wait = (own - self.most_s) / self.share
        if own >= self.most_s / 2:
            wait = max(wait, (self._now_owed("", now) - self.most_all_s) / self.share_all)
        return max(0.0, wait)

    def charge(self, asker: str, seconds: float, now: float) -> None:
        for key in (asker, ""):
            self._owed[key] = (self._now_owed(key, now) + seconds, now)
        if len(self._owed) > 1_024:  # askers who owe nothing now are as good as unknown
            self._owed = {
                k: (o, now) for k in list(self._owed) if (o := self._now_owed(k, now)) > 0 or k == ""
            }
